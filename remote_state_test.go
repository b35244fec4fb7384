package dsync_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
)

// Remote state (DESIGN, Semantics): whatever foreign or corrupted data sits
// in a primitive's keys — a key of another type, a hold without an expiry, a
// fencing counter out of range, garbage in queue data or in a holders zset,
// a field deleted behind a holder — a call returns within its ctx with an
// error matching ErrCorrupt or with a clean outcome (a hold nobody else has,
// with a fencing token above every earlier one and below 2^53, or its ctx's
// end), never with a raw Redis error; it does not busy-loop; it leaves no
// key without an expiry; and once the bad key is gone the name works again.
//
// Every case runs for Mutex, RWMutex (read and write), Semaphore and Once
// where it applies, on every backend, and is judged by Redis-side truth.

const (
	// rsCall is the ctx of each call under test, and of the recovery.
	rsCall = 2 * time.Second
	// rsLate is how much later than its ctx a call may return (a loaded
	// machine running -race).
	rsLate = 500 * time.Millisecond
	// rsForeignTTL is the lease of a live foreign hold, which its holder
	// releases rsRelease after the call under test begins (and which runs
	// out rsForeignTTL after that if the release fails).
	rsForeignTTL = 600 * time.Millisecond
	rsRelease    = 200 * time.Millisecond
	// rsShort is how long a foreign hold written into Redis lasts when it
	// is to end by itself.
	rsShort = 300 * time.Millisecond
	// rsPerTry: a waiter attempts at most once per rsPerTry (engine.go's
	// floor, whatever Redis holds), plus rsFixedTrips round trips for the
	// first attempt, the one after subscribing, the first one a
	// notification asks for, script loads, the abandon and the release.
	rsPerTry     = 20 * time.Millisecond
	rsFixedTrips = 8
	// rsMaxToken bounds fencing tokens: past 2^53 Lua numbers stop
	// counting by one.
	rsMaxToken = 1 << 53
	// rsSemSize is the size of the semaphores; the primitive's holds take
	// every permit, so that a semaphore excludes like a mutex.
	rsSemSize = 2
)

// rsWant is a set of outcomes a case allows.
type rsWant uint8

const (
	rsNil     rsWant = 1 << iota // the call took a hold (or found the Once done)
	rsCorrupt                    // an error matching ErrCorrupt
	rsCtx                        // the call's ctx ended while it waited
)

func (w rsWant) String() string {
	var s []string
	for _, o := range []struct {
		w rsWant
		s string
	}{{rsNil, "nil"}, {rsCorrupt, "ErrCorrupt"}, {rsCtx, "ctx done"}} {
		if w&o.w != 0 {
			s = append(s, o.s)
		}
	}
	return strings.Join(s, " or ")
}

// An rsHold is a hold taken through the API.
type rsHold struct {
	token   uint64       // fencing token, 0 when the primitive has none
	release func() error // ends the hold, on a ctx of its own
	lease   *dsync.Lease // nil when the primitive has none
}

// lost reports whether the hold's lease reported its loss: a renewal that
// came too late on a loaded machine ends a hold legitimately.
func (h rsHold) lost() bool {
	if h.lease == nil {
		return false
	}
	select {
	case <-h.lease.Done():
		return true
	default:
		return false
	}
}

// An rsPrim is a primitive as the remote-state tests drive it.
type rsPrim struct {
	name   string
	fenced bool
	keys   func(name string) []string
	fence  func(name string) string // the fence hash, "" when none
	// live, if set, takes the foreign hold that live() uses in place of
	// acquire: one that excludes this primitive's caller.
	live func(ctx context.Context, c *dsync.Client, name, tok string, fail bool) (rsHold, error)
	// acquire takes a hold for owner tok (a Once ignores it: there the hold
	// is a run of Do, whose f waits for release; with fail f then fails, so
	// the Once stays not done).
	acquire func(ctx context.Context, c *dsync.Client, name, tok string, fail bool) (rsHold, error)
	// foreign writes a hold of tok straight into Redis, as dsync lays it
	// out: its lease (a member's deadline where there is one) ends in d,
	// and so do its keys unless persist, which leaves them without an
	// expiry. It returns the keys it wrote.
	foreign func(t testing.TB, rdb redis.UniversalClient, name, tok string, d time.Duration, persist bool) []string
	// holders returns the live holders of name that exclude this
	// primitive's caller, by Redis-side truth.
	holders func(ctx context.Context, rdb redis.UniversalClient, name string) []string
}

// An rsEnv is one case being run.
type rsEnv struct {
	t      *testing.T
	b      redistest.Backend
	p      *rsPrim
	rdb    redis.UniversalClient // raw, to corrupt and to inspect
	c      *dsync.Client         // the caller's, counted by cnt
	cnt    *redistest.Counter
	name   string
	caller string // owner token of the caller

	// Set up by the case.
	call    func(ctx context.Context) (rsHold, error) // the call under test
	foreign string                                    // token of a foreign hold, if any
	// foreignLive reports whether the foreign hold, if any, must still be
	// live by what the test did (not released, its lease not run out).
	foreignLive func() bool
	bad         []string // what recovery deletes
	prev        uint64   // largest fencing token issued before the call
	outer       *rsHold  // the caller's hold that the call re-enters
	again       bool     // make a second call after the first
	onCall      func()   // run as the call begins
	settle      func()   // waits for the foreign holder, if any
}

// An rsCase is one corruption of one primitive's keys.
type rsCase struct {
	name  string
	want  rsWant
	setup func(e *rsEnv)
}

func rsRandom(t testing.TB) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// rsNow returns the server's time.
func rsNow(t testing.TB, rdb redis.UniversalClient) time.Time {
	tm, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return tm
}

func rsMs(tm time.Time) string  { return strconv.FormatInt(tm.UnixMilli(), 10) }
func rsUs(tm time.Time) float64 { return float64(tm.UnixMicro()) }

// rsExpire gives ks an expiry of d, or removes theirs when persist.
func rsExpire(t testing.TB, rdb redis.UniversalClient, d time.Duration, persist bool, ks ...string) {
	ctx := context.Background()
	for _, k := range ks {
		var err error
		if persist {
			err = rdb.Persist(ctx, k).Err()
		} else {
			err = rdb.PExpire(ctx, k, d).Err()
		}
		if err != nil {
			t.Fatalf("expiry of %s: %v", k, err)
		}
	}
}

// rsFields returns the fields of hash k that name holders (not ':…').
func rsFields(ctx context.Context, rdb redis.UniversalClient, k string) []string {
	fs, _ := rdb.HKeys(ctx, k).Result() // a key of another type holds no one
	return slices.DeleteFunc(fs, func(f string) bool { return strings.HasPrefix(f, ":") })
}

// rsLiveReaders returns the readers of an RWMutex whose lease lives: a
// deadline in the future in the readers zset and an entry in the readers
// hash, both of which dsync writes together.
func rsLiveReaders(ctx context.Context, rdb redis.UniversalClient, name string) []string {
	k := rwk(name)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return nil
	}
	rs, _ := rdb.ZRangeByScore(ctx, k.Readers, &redis.ZRangeBy{Min: "(" + rsMs(now), Max: "+inf"}).Result()
	return slices.DeleteFunc(rs, func(r string) bool {
		n, _ := rdb.HExists(ctx, k.ReaderData, r).Result()
		return !n
	})
}

// rsMutexLike writes a hold of tok into hash k as a Mutex or an RWMutex
// writer lays it out.
func rsMutexLike(t testing.TB, rdb redis.UniversalClient, k, tok string, d time.Duration, persist bool) {
	must(t, rdb.HSet(context.Background(), k, tok, 1, ":f", strconv.FormatInt(rsNow(t, rdb).UnixMicro(), 10), ":c", "foreign-call").Err())
	rsExpire(t, rdb, d, persist, k)
}

// rsForeignReader writes a reader tok of the RWMutex name whose lease ends
// in d.
func rsForeignReader(t testing.TB, rdb redis.UniversalClient, name, tok string, d time.Duration, persist bool) []string {
	ctx := context.Background()
	k := rwk(name)
	dl := rsNow(t, rdb).Add(d)
	must(t, rdb.ZAdd(ctx, k.Readers, redis.Z{Score: float64(dl.UnixMilli()), Member: tok}).Err())
	must(t, rdb.HSet(ctx, k.ReaderData, tok, "1 foreign-call").Err())
	rsExpire(t, rdb, d, persist, k.Readers, k.ReaderData)
	return []string{k.Readers, k.ReaderData}
}

func onceKeys(name string) keys.Once { return keys.ForOnce(dsync.DefaultPrefix, name) }

// rsTake acquires through lock for owner tok and returns the hold, which
// unlock releases; with a lease func, the hold carries the Lease and its
// token.
func rsTake(ctx context.Context, tok string, lock, unlock func(context.Context) error, lease func(context.Context) (*dsync.Lease, error)) (rsHold, error) {
	ctx = dsync.WithOwnerToken(ctx, tok)
	if err := lock(ctx); err != nil {
		return rsHold{}, err
	}
	h := rsHold{release: func() error { return unlock(dsync.WithOwnerToken(context.Background(), tok)) }}
	if lease != nil {
		l, err := lease(ctx)
		if err != nil {
			return rsHold{}, err
		}
		h.token, h.lease = l.Token(), l
	}
	return h, nil
}

// semAcquireN acquires n permits of the semaphore name for owner tok.
func semAcquireN(ctx context.Context, c *dsync.Client, name, tok string, n int64) (rsHold, error) {
	s := c.Semaphore(name, rsSemSize)
	return rsTake(ctx, tok,
		func(ctx context.Context) error { return s.Acquire(ctx, n) },
		func(ctx context.Context) error { return s.Release(ctx, n) }, s.Lease)
}

// rwWriteLock write-locks the RWMutex name for owner tok.
func rwWriteLock(ctx context.Context, c *dsync.Client, name, tok string, _ bool) (rsHold, error) {
	rw := c.RWMutex(name)
	return rsTake(ctx, tok, rw.Lock, rw.Unlock, rw.Lease)
}

// rsForeignLock returns the foreign of a mutex-like lock hash: key(name)
// held by tok.
func rsForeignLock(key func(name string) string) func(testing.TB, redis.UniversalClient, string, string, time.Duration, bool) []string {
	return func(t testing.TB, rdb redis.UniversalClient, name, tok string, d time.Duration, persist bool) []string {
		rsMutexLike(t, rdb, key(name), tok, d, persist)
		return []string{key(name)}
	}
}

// rsLockHolders returns the holders of a mutex-like lock hash: the fields
// of key(name).
func rsLockHolders(key func(name string) string) func(context.Context, redis.UniversalClient, string) []string {
	return func(ctx context.Context, rdb redis.UniversalClient, name string) []string {
		return rsFields(ctx, rdb, key(name))
	}
}

// mutexLockKey and rwWriterKey are the lock hashes of a Mutex and of an
// RWMutex's writer.
func mutexLockKey(n string) string { return mutexKeys(n).Lock }
func rwWriterKey(n string) string  { return rwk(n).Writer }

var errForeignRun = errors.New("the foreign run fails")

var rsPrims = []*rsPrim{
	{
		name:   "Mutex",
		fenced: true,
		keys:   func(n string) []string { return mutexKeys(n).Keys() },
		fence:  func(n string) string { return mutexKeys(n).Fence },
		acquire: func(ctx context.Context, c *dsync.Client, name, tok string, _ bool) (rsHold, error) {
			m := c.Mutex(name)
			return rsTake(ctx, tok, m.Lock, m.Unlock, m.Lease)
		},
		foreign: rsForeignLock(mutexLockKey),
		holders: rsLockHolders(mutexLockKey),
	},
	{
		name: "RWMutex.RLock",
		keys: func(n string) []string { return rwk(n).Keys() },
		acquire: func(ctx context.Context, c *dsync.Client, name, tok string, _ bool) (rsHold, error) {
			rw := c.RWMutex(name)
			return rsTake(ctx, tok, rw.RLock, rw.RUnlock, nil)
		},
		// A reader is excluded by a writer.
		live:    rwWriteLock,
		foreign: rsForeignLock(rwWriterKey),
		holders: rsLockHolders(rwWriterKey),
	},
	{
		name:    "RWMutex.Lock",
		fenced:  true,
		keys:    func(n string) []string { return rwk(n).Keys() },
		fence:   func(n string) string { return rwk(n).Fence },
		acquire: rwWriteLock,
		foreign: rsForeignLock(rwWriterKey),
		holders: func(ctx context.Context, rdb redis.UniversalClient, name string) []string {
			return append(rsFields(ctx, rdb, rwWriterKey(name)), rsLiveReaders(ctx, rdb, name)...)
		},
	},
	{
		name:   "Semaphore",
		fenced: true,
		keys:   func(n string) []string { return semKeys(n).Keys() },
		fence:  func(n string) string { return semKeys(n).Fence },
		acquire: func(ctx context.Context, c *dsync.Client, name, tok string, _ bool) (rsHold, error) {
			return semAcquireN(ctx, c, name, tok, rsSemSize)
		},
		foreign: func(t testing.TB, rdb redis.UniversalClient, name, tok string, d time.Duration, persist bool) []string {
			ctx := context.Background()
			k := semKeys(name)
			now := rsNow(t, rdb)
			must(t, rdb.HSet(ctx, k.State, ":size", rsSemSize, ":used", rsSemSize, tok, rsSemSize,
				":f:"+tok, strconv.FormatInt(now.UnixMicro(), 10), ":c:"+tok, "foreign-call").Err())
			must(t, rdb.ZAdd(ctx, k.Holders, redis.Z{Score: float64(now.Add(d).UnixMilli()), Member: tok}).Err())
			rsExpire(t, rdb, d, persist, k.State, k.Holders)
			return []string{k.State, k.Holders}
		},
		// A holder holds permits in the state hash and has a lease
		// deadline in the future in the holders zset.
		holders: func(ctx context.Context, rdb redis.UniversalClient, name string) []string {
			k := semKeys(name)
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				return nil
			}
			var out []string
			for _, f := range rsFields(ctx, rdb, k.State) {
				n, _ := rdb.HGet(ctx, k.State, f).Int64()
				dl, err := rdb.ZScore(ctx, k.Holders, f).Result()
				if n > 0 && err == nil && dl > float64(now.UnixMilli()) {
					out = append(out, f)
				}
			}
			return out
		},
	},
	{
		name: "Once",
		keys: func(n string) []string { return onceKeys(n).Keys() },
		acquire: func(ctx context.Context, c *dsync.Client, name, _ string, fail bool) (rsHold, error) {
			// A Period, so that the done mark expires too.
			o := c.Once(name, dsync.Period(time.Minute))
			started, stop := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				done <- o.Do(ctx, func(fctx context.Context) error {
					close(started)
					select {
					case <-stop:
					case <-fctx.Done():
					}
					if fail {
						return errForeignRun
					}
					return nil
				})
			}()
			select {
			case <-started:
				return rsHold{release: func() error {
					close(stop)
					if err := <-done; err != nil && !(fail && errors.Is(err, errForeignRun)) {
						return err
					}
					return nil
				}}, nil
			case err := <-done:
				// nil: the Once is done already.
				return rsHold{release: func() error { return nil }}, err
			}
		},
		foreign: func(t testing.TB, rdb redis.UniversalClient, name, tok string, d time.Duration, persist bool) []string {
			ctx := context.Background()
			k := onceKeys(name)
			must(t, rdb.HSet(ctx, k.Run, "t", tok).Err())
			rsExpire(t, rdb, d, persist, k.Run)
			return []string{k.Run}
		},
		holders: func(ctx context.Context, rdb redis.UniversalClient, name string) []string {
			tok, err := rdb.HGet(ctx, onceKeys(name).Run, "t").Result()
			if err != nil {
				return nil
			}
			return []string{tok}
		},
	},
}

func rsPrimNamed(name string) *rsPrim {
	for _, p := range rsPrims {
		if p.name == name {
			return p
		}
	}
	panic("no primitive " + name)
}

// live gives the name a live foreign hold, taken through the API by another
// Client with lease rsForeignTTL and owner e.foreign; rsRelease after the
// call begins, its holder releases it (the release must be clean) and
// closes its Client, so that the hold runs out at its TTL at the latest.
func (e *rsEnv) live() {
	e.t.Helper()
	fc := dsync.New(e.b.NewClient(e.t), dsync.TTL(rsForeignTTL))
	e.foreign = "foreign-" + rsRandom(e.t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	acquire := e.p.acquire
	if e.p.live != nil {
		acquire = e.p.live
	}
	// If the case ends early: no renewal, no run left waiting.
	e.t.Cleanup(func() {
		cancel()
		fc.Close()
	})
	h, err := acquire(ctx, fc, e.name, e.foreign, true)
	if err != nil {
		e.t.Fatalf("foreign hold: %v", err)
	}
	if e.p.name == "Once" {
		// A run is held by its call's token.
		hs := e.p.holders(ctx, e.rdb, e.name)
		if len(hs) != 1 {
			e.t.Fatalf("foreign run: holders %v, want one", hs)
		}
		e.foreign = hs[0]
	}
	e.prev = max(e.prev, h.token)
	done := make(chan error, 1)
	var releasing atomic.Bool
	e.foreignLive = func() bool { return !releasing.Load() && !h.lost() }
	e.onCall = func() {
		go func() {
			time.Sleep(rsRelease)
			releasing.Store(true)
			err := h.release()
			fc.Close()
			cancel()
			done <- err
		}()
	}
	e.settle = func() {
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, dsync.ErrCorrupt) && !errors.Is(err, dsync.ErrLeaseLost) && !errors.Is(err, dsync.ErrNotHeld) {
				e.t.Errorf("release of the foreign hold = %v, want nil, ErrCorrupt, ErrLeaseLost or ErrNotHeld", err)
			}
		case <-time.After(10 * time.Second):
			e.t.Errorf("the foreign holder's release did not return in 10s")
		}
	}
}

// liveUntil says that a foreign hold written into Redis now lives for d
// (by server time: the scripts decide by it).
func (e *rsEnv) liveUntil(d time.Duration) {
	// Less a margin: the hold was written a little earlier.
	until := rsNow(e.t, e.rdb).Add(d - 100*time.Millisecond)
	e.foreignLive = func() bool { return rsNow(e.t, e.rdb).Before(until) }
}

// earlier takes and releases a hold, so that a fencing token was issued
// before the call.
func (e *rsEnv) earlier() {
	e.t.Helper()
	c := dsync.New(e.b.NewClient(e.t))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rsCall)
	defer cancel()
	h, err := e.p.acquire(ctx, c, e.name, "earlier-"+rsRandom(e.t), false)
	if err != nil {
		e.t.Fatalf("earlier hold: %v", err)
	}
	e.prev = max(e.prev, h.token)
	if err := h.release(); err != nil {
		e.t.Fatalf("release of the earlier hold: %v", err)
	}
}

// retype replaces key k by one of type kind ("string" or "list"), without
// an expiry.
func (e *rsEnv) retype(k, kind string) {
	e.t.Helper()
	ctx := context.Background()
	e.rdb.Del(ctx, k)
	var err error
	if kind == "string" {
		err = e.rdb.Set(ctx, k, "foreign", 0).Err()
	} else {
		err = e.rdb.RPush(ctx, k, "foreign").Err()
	}
	if err != nil {
		e.t.Fatal(err)
	}
	e.bad = append(e.bad, k)
}

// dump describes the primitive's keys, for failure messages.
func (e *rsEnv) dump() string {
	ctx := context.Background()
	var b strings.Builder
	for _, k := range e.p.keys(e.name) {
		typ, _ := e.rdb.Type(ctx, k).Result()
		if typ == "none" {
			continue
		}
		ttl, _ := e.rdb.PTTL(ctx, k).Result()
		var v any
		switch typ {
		case "hash":
			v, _ = e.rdb.HGetAll(ctx, k).Result()
		case "zset":
			v, _ = e.rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
		}
		fmt.Fprintf(&b, "\t%s %s PTTL %v %v\n", k, typ, ttl, v)
	}
	return b.String()
}

// noExpiry returns the keys of the primitive that exist without an expiry.
func (e *rsEnv) noExpiry() []string {
	e.t.Helper()
	var out []string
	for _, k := range e.p.keys(e.name) {
		d, err := e.rdb.PTTL(context.Background(), k).Result()
		if err != nil {
			e.t.Fatalf("PTTL %s: %v", k, err)
		}
		if d == -1 {
			out = append(out, k)
		}
	}
	return out
}

// outcome classifies the result of a call whose ctx is ctx.
func (e *rsEnv) outcome(ctx context.Context, what string, err error) rsWant {
	e.t.Helper()
	if errors.Is(err, redis.Nil) {
		e.t.Errorf("%s = %v: redis.Nil handed to the caller", what, err)
	}
	switch {
	case err == nil:
		return rsNil
	case errors.Is(err, dsync.ErrCorrupt):
		return rsCorrupt
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return rsCtx
	}
	e.t.Errorf("%s = %v (%T), want nil, ErrCorrupt or the ctx's error", what, err, err)
	return 0
}

// checkHold checks a hold the call took: nobody else holds the name, and
// its fencing token is in range and above every earlier one.
func (e *rsEnv) checkHold(what string, h rsHold) {
	e.t.Helper()
	for _, o := range e.p.holders(context.Background(), e.rdb, e.name) {
		if o == e.foreign || (e.p.name != "Once" && o != e.caller) {
			e.t.Errorf("%s took the hold while %q holds the name", what, o)
		}
	}
	// Also when the foreign hold is gone from Redis: its holder was not
	// told, and its lease still reports live.
	if e.foreignLive != nil && e.foreignLive() {
		e.t.Errorf("%s took the hold while the foreign hold %q was live (not released, its lease not run out)", what, e.foreign)
	}
	if !e.p.fenced {
		return
	}
	switch {
	case h.token == 0 || h.token >= rsMaxToken:
		e.t.Errorf("%s: fencing token %d, want in (0, 2^53)", what, h.token)
	case e.outer != nil && h.token != e.outer.token:
		e.t.Errorf("%s: re-entry with fencing token %d, want the hold's %d", what, h.token, e.outer.token)
	case e.outer == nil && h.token <= e.prev:
		e.t.Errorf("%s: fencing token %d, want above the earlier %d", what, h.token, e.prev)
	}
	e.prev = max(e.prev, h.token)
}

// release releases a hold taken by the call: cleanly, or with ErrCorrupt
// (the bad key is in the way) or ErrLeaseLost (it took the hold away).
func (e *rsEnv) release(what string, h rsHold) {
	e.t.Helper()
	if err := h.release(); err != nil && !errors.Is(err, dsync.ErrCorrupt) && !errors.Is(err, dsync.ErrLeaseLost) {
		e.t.Errorf("release after %s = %v, want nil, ErrCorrupt or ErrLeaseLost", what, err)
	}
}

// timed makes one call with ctx rsCall and checks its outcome against want,
// its duration and its round trips.
func (e *rsEnv) timed(what string, want rsWant, call func(ctx context.Context) (rsHold, error)) (rsHold, rsWant) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rsCall)
	defer cancel()
	e.cnt.Reset()
	start := time.Now()
	h, err := call(ctx)
	took := time.Since(start)
	trips := e.cnt.RoundTrips()
	got := e.outcome(ctx, what, err)
	e.t.Logf("%s: %v after %v, %d round trips", what, err, took.Round(time.Millisecond), trips)
	if got != 0 && got&want == 0 {
		e.t.Errorf("%s = %v, want %v", what, err, want)
	}
	if took > rsCall+rsLate {
		e.t.Errorf("%s returned after %v, want within its ctx (%v) + %v", what, took, rsCall, rsLate)
	}
	if max := int64(took/rsPerTry) + rsFixedTrips; trips > max {
		e.t.Errorf("%s made %d round trips in %v, want at most %d (one per %v + %d): a busy loop",
			what, trips, took, max, rsPerTry, rsFixedTrips)
	}
	if got == rsNil {
		e.checkHold(what, h)
	}
	return h, got
}

// rsRun runs case c for primitive p on backend b.
func rsRun(t *testing.T, b redistest.Backend, p *rsPrim, c rsCase) {
	rdb := b.NewClient(t)
	cnt := &redistest.Counter{}
	crdb := b.NewClient(t)
	crdb.AddHook(cnt)
	e := &rsEnv{t: t, b: b, p: p, rdb: rdb, c: dsync.New(crdb), cnt: cnt, name: redistest.Key(t), caller: "caller-" + rsRandom(t)}
	defer e.c.Close()
	e.call = func(ctx context.Context) (rsHold, error) { return p.acquire(ctx, e.c, e.name, e.caller, false) }
	c.setup(e)
	before := e.noExpiry()

	if e.onCall != nil {
		e.onCall()
	}
	h, got := e.timed("the call", c.want, e.call)
	if got == rsNil {
		e.release("the call", h)
		if e.again {
			// Tokens keep rising.
			if h, got := e.timed("a second call", c.want, e.call); got == rsNil {
				e.release("a second call", h)
			}
		}
	}
	if e.settle != nil {
		e.settle()
	}
	if e.outer != nil {
		e.release("the re-entry", *e.outer)
	}
	// Let the clean-ups of failed calls finish (Close would cancel them,
	// as if the process died).
	dsync.WaitCleanups(e.c)

	// Nothing the call wrote lasts for good, and a call that failed left
	// no hold.
	for _, k := range e.noExpiry() {
		if !slices.Contains(before, k) {
			t.Errorf("%s left without an expiry", k)
		}
	}
	if got != rsNil && e.outer == nil {
		hs := p.holders(context.Background(), rdb, e.name)
		if slices.ContainsFunc(hs, func(h string) bool { return h == e.caller || (p.name == "Once" && h != e.foreign) }) {
			t.Errorf("the failed call left a hold behind: holders %v", hs)
		}
	}

	// Recovery: once the bad keys are gone, the name works again.
	ctx := context.Background()
	for _, k := range e.bad {
		if err := rdb.Del(ctx, k).Err(); err != nil {
			t.Fatalf("DEL %s: %v", k, err)
		}
	}
	rc := dsync.New(b.NewClient(t))
	defer rc.Close()
	rctx, cancel := context.WithTimeout(ctx, rsCall)
	defer cancel()
	e.foreign, e.foreignLive, e.outer = "", nil, nil
	e.caller = "recovery-" + rsRandom(t)
	rh, err := p.acquire(rctx, rc, e.name, e.caller, false)
	if err != nil {
		t.Fatalf("after the bad keys %v were deleted: %v, want the name to work again; keys:\n%s", e.bad, err, e.dump())
	}
	e.checkHold("the recovery", rh)
	if err := rh.release(); err != nil {
		t.Errorf("release after recovery: %v", err)
	}
}

// rsSuffix names key k of name by what follows the base key.
func rsSuffix(name, k string) string {
	if s := strings.TrimPrefix(k, keys.Base(dsync.DefaultPrefix, name)); s != "" {
		return s
	}
	return "base"
}

// rsAtOnce bounds how many cases of a table run at once. They spend most
// of their time waiting (for a foreign holder, a ctx), so more run at
// once than t.Parallel would allow on a small machine.
const rsAtOnce = 8

// rsTable runs cases(p) for every primitive p for which it returns some, on
// every backend, rsAtOnce cases at a time.
// rsFreeAndHeld appends to cs the case of setup on a free name
// (name+"/free") and the case with a live foreign hold released during the
// call (name+"/"+heldWord, after e.live()); setup is told which it is.
func rsFreeAndHeld(cs []rsCase, name, heldWord string, want rsWant, setup func(e *rsEnv, held bool)) []rsCase {
	for _, held := range []bool{false, true} {
		n := name + "/free"
		if held {
			n = name + "/" + heldWord
		}
		cs = append(cs, rsCase{name: n, want: want, setup: func(e *rsEnv) {
			if held {
				e.live()
			}
			setup(e, held)
		}})
	}
	return cs
}

func rsTable(t *testing.T, cases func(p *rsPrim) []rsCase) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		if b.Mini != nil {
			// Let TTLs run down with the wall clock, as on a server.
			b.Mini.ClockTTL(true)
		}
		for _, p := range rsPrims {
			cs := cases(p)
			if len(cs) == 0 {
				continue
			}
			slices.SortFunc(cs, func(a, b rsCase) int { return strings.Compare(a.name, b.name) })
			t.Run(p.name, func(t *testing.T) {
				var wg sync.WaitGroup
				slots := make(chan struct{}, rsAtOnce)
				for _, c := range cs {
					slots <- struct{}{}
					wg.Add(1)
					go func() {
						defer wg.Done()
						defer func() { <-slots }()
						t.Run(c.name, func(t *testing.T) { rsRun(t, b, p, c) })
					}()
				}
				wg.Wait()
			})
		}
	})
}

// Each key of each primitive replaced by a string or a list: on a free name,
// and while a live foreign hold is released during the call.
func TestRemoteStateWrongType(t *testing.T) {
	rsTable(t, func(p *rsPrim) []rsCase {
		var cs []rsCase
		for i, k := range p.keys("n") {
			for _, kind := range []string{"string", "list"} {
				cs = rsFreeAndHeld(cs, rsSuffix("n", k)+"/"+kind, "held", rsNil|rsCorrupt, func(e *rsEnv, _ bool) {
					e.retype(e.p.keys(e.name)[i], kind)
				})
			}
		}
		return cs
	})
}

// The hold's keys without an expiry: a hash that records one holder is
// foreign data (dsync writes none such) and the caller is told so; a zset of
// leases, each with its deadline, is obeyed until the deadline.
func TestRemoteStateNoExpiry(t *testing.T) {
	rsTable(t, func(p *rsPrim) []rsCase {
		var cs []rsCase
		switch p.name {
		case "Mutex", "RWMutex.RLock", "RWMutex.Lock", "Once":
			cs = append(cs, rsCase{name: "holder", want: rsCorrupt, setup: func(e *rsEnv) {
				e.foreign = "foreign-" + rsRandom(e.t)
				e.bad = e.p.foreign(e.t, e.rdb, e.name, e.foreign, 0, true)
				e.foreignLive = func() bool { return true }
			}})
		case "Semaphore":
			cs = append(cs, rsCase{name: "holder", want: rsNil, setup: func(e *rsEnv) {
				e.foreign = "foreign-" + rsRandom(e.t)
				e.bad = e.p.foreign(e.t, e.rdb, e.name, e.foreign, rsShort, true)
				e.liveUntil(rsShort)
			}})
		}
		if strings.HasPrefix(p.name, "RWMutex") {
			cs = append(cs, rsCase{name: "reader", want: rsNil, setup: func(e *rsEnv) {
				// A reader holds until its deadline; readers share.
				tok := "foreign-" + rsRandom(e.t)
				e.bad = rsForeignReader(e.t, e.rdb, e.name, tok, rsShort, true)
				if e.p.name == "RWMutex.Lock" {
					e.foreign = tok
					e.liveUntil(rsShort)
				}
			}})
		}
		return cs
	})
}

// The fencing counter set to values out of range or not numbers, on a free
// name and for a hand-over; tokens stay in (0, 2^53) and keep rising. A
// counter that would reach 2^53 is reported; one that is no number counts
// as none (miniredis's Lua reads "1e999" and "nan" so, Redis's as numbers
// out of range).
func TestRemoteStateFenceCounter(t *testing.T) {
	values := map[string]rsWant{
		"1e999":            rsCorrupt | rsNil,
		"nan":              rsCorrupt | rsNil,
		"9007199254740993": rsCorrupt, // 2^53 + 1
		"9007199254740991": rsCorrupt, // 2^53 - 1: the next would be 2^53
		"abc":              rsNil,
		"-5":               rsNil,
	}
	rsTable(t, func(p *rsPrim) []rsCase {
		if !p.fenced {
			return nil
		}
		var cs []rsCase
		for v, want := range values {
			cs = rsFreeAndHeld(cs, v, "handover", want, func(e *rsEnv, held bool) {
				if !held {
					e.earlier()
				}
				f := e.p.fence(e.name)
				if err := e.rdb.HSet(context.Background(), f, "n", v).Err(); err != nil {
					e.t.Fatal(err)
				}
				e.bad = []string{f}
				e.again = true
			})
		}
		return cs
	})
}

// rsGarbage is what the queue data tests write: not what dsync writes.
var rsGarbage = map[string]string{
	"x":     "x",
	"empty": "",
	"1_2":   "1 2",
	"long":  strings.Repeat("9", 400) + " " + strings.Repeat("x ", 2000),
}

// A foreign waiter whose queue data is garbage, on a free name and while a
// live foreign hold is released (its release reads the queue): the entry is
// dropped, and the call takes the name.
func TestRemoteStateQueueGarbage(t *testing.T) {
	type queue struct {
		name  string
		prims []string
		write func(e *rsEnv, tok, data string) []string
	}
	// fifo writes a waiter into the queue zset and queue data hash that
	// keys returns for a name.
	fifo := func(keys func(name string) (queue, data string)) func(e *rsEnv, tok, data string) []string {
		return func(e *rsEnv, tok, data string) []string {
			q, d := keys(e.name)
			ctx := context.Background()
			e.rdb.ZAdd(ctx, q, redis.Z{Score: rsUs(rsNow(e.t, e.rdb)), Member: tok})
			e.rdb.HSet(ctx, d, tok, data)
			return []string{q, d}
		}
	}
	queues := []queue{
		{"mutex", []string{"Mutex"}, fifo(func(n string) (string, string) { k := mutexKeys(n); return k.Queue, k.QueueData })},
		{"readers", []string{"RWMutex.RLock", "RWMutex.Lock"}, func(e *rsEnv, tok, data string) []string {
			k := rwk(e.name)
			e.rdb.HSet(context.Background(), k.WaitingReaders, tok, data)
			return []string{k.WaitingReaders}
		}},
		{"writers", []string{"RWMutex.Lock"}, func(e *rsEnv, tok, data string) []string {
			k := rwk(e.name)
			ctx := context.Background()
			now := rsNow(e.t, e.rdb)
			e.rdb.ZAdd(ctx, k.WaitingWriters, redis.Z{Score: float64(now.Add(dsync.DefaultTTL).UnixMilli()), Member: tok})
			e.rdb.ZAdd(ctx, k.WriterQueue, redis.Z{Score: rsUs(now), Member: tok})
			e.rdb.HSet(ctx, k.WriterQueueData, tok, data)
			return []string{k.WaitingWriters, k.WriterQueue, k.WriterQueueData}
		}},
		{"semaphore", []string{"Semaphore"}, fifo(func(n string) (string, string) { k := semKeys(n); return k.Queue, k.QueueData })},
	}
	rsTable(t, func(p *rsPrim) []rsCase {
		var cs []rsCase
		for _, q := range queues {
			if !slices.Contains(q.prims, p.name) {
				continue
			}
			for gname, g := range rsGarbage {
				cs = rsFreeAndHeld(cs, q.name+"/"+gname, "held", rsNil, func(e *rsEnv, _ bool) {
					ks := q.write(e, "waiter-"+rsRandom(e.t), g)
					rsExpire(e.t, e.rdb, dsync.DefaultTTL, false, ks...)
					e.bad = append(e.bad, ks...)
				})
			}
		}
		return cs
	})
}

// Garbage members and scores in a zset of holders (a Semaphore's holders, an
// RWMutex's readers): on a free name, and while a live foreign hold is
// released. The garbage is dropped or ignored and the call takes the name;
// only a reader whose deadline no expiry can reach (+inf, 1e300) is
// reported to readers, who cannot give the readers zset its expiry, until
// a writer drops it or the zset expires (miniredis's Lua also fails to
// read back the 1e15 it stores, as "1e+15").
func TestRemoteStateHoldersGarbage(t *testing.T) {
	type entry struct{ member, score string }
	entries := map[string]entry{
		"used-member":  {":used", "0"},
		"size-member":  {":size", "0"},
		"past":         {"x", "0"},
		"minus-inf":    {"x", "-inf"},
		"plus-inf":     {"x", "+inf"},
		"far":          {"x", "1e300"},
		"future-colon": {":x", "1e15"},
	}
	rsTable(t, func(p *rsPrim) []rsCase {
		var zset func(name string) string
		switch p.name {
		case "Semaphore":
			zset = func(n string) string { return semKeys(n).Holders }
		case "RWMutex.Lock", "RWMutex.RLock":
			zset = func(n string) string { return rwk(n).Readers }
		default:
			return nil
		}
		var cs []rsCase
		for ename, en := range entries {
			want := rsNil
			if p.name == "RWMutex.RLock" && (ename == "plus-inf" || ename == "far" || ename == "future-colon") {
				want |= rsCorrupt
			}
			cs = rsFreeAndHeld(cs, ename, "held", want, func(e *rsEnv, _ bool) {
				k := zset(e.name)
				ctx := context.Background()
				if err := e.rdb.Do(ctx, "zadd", k, en.score, en.member).Err(); err != nil {
					e.t.Fatal(err)
				}
				if err := e.rdb.PExpire(ctx, k, dsync.DefaultTTL).Err(); err != nil {
					e.t.Fatal(err)
				}
				e.bad = append(e.bad, k)
			})
		}
		return cs
	})
}

// The caller holds the name, and its hold's fencing token (the field), or
// the whole fence hash, is deleted before it re-enters: a hold without its
// token is reported; the fence hash is not needed to re-enter.
func TestRemoteStateReentryFenceDeleted(t *testing.T) {
	rsTable(t, func(p *rsPrim) []rsCase {
		if !p.fenced {
			return nil
		}
		// first takes the outer hold; again re-enters it.
		first := func(e *rsEnv) func(ctx context.Context) (rsHold, error) {
			return func(ctx context.Context) (rsHold, error) { return e.p.acquire(ctx, e.c, e.name, e.caller, false) }
		}
		if p.name == "Semaphore" {
			first = func(e *rsEnv) func(ctx context.Context) (rsHold, error) {
				return func(ctx context.Context) (rsHold, error) { return semAcquireN(ctx, e.c, e.name, e.caller, 1) }
			}
		}
		// field names the hold's fencing token: its key and field.
		field := func(e *rsEnv) (string, string) {
			switch e.p.name {
			case "Mutex":
				return mutexKeys(e.name).Lock, ":f"
			case "RWMutex.Lock":
				return rwk(e.name).Writer, ":f"
			}
			return semKeys(e.name).State, ":f:" + e.caller
		}
		reenter := func(e *rsEnv) {
			ctx, cancel := context.WithTimeout(context.Background(), rsCall)
			defer cancel()
			e.call = first(e)
			h, err := e.call(ctx)
			if err != nil {
				e.t.Fatalf("outer hold: %v", err)
			}
			e.outer = &h
			e.prev = h.token
		}
		return []rsCase{
			{name: "field", want: rsCorrupt, setup: func(e *rsEnv) {
				reenter(e)
				k, f := field(e)
				if err := e.rdb.HDel(context.Background(), k, f).Err(); err != nil {
					e.t.Fatal(err)
				}
				// The hold's key without its token is the bad key.
				e.bad = []string{k}
			}},
			{name: "fence-hash", want: rsNil, setup: func(e *rsEnv) {
				reenter(e)
				if err := e.rdb.Del(context.Background(), e.p.fence(e.name)).Err(); err != nil {
					e.t.Fatal(err)
				}
			}},
		}
	})
}

// A hold's list of applied call ids full of foreign data (100,000 words,
// 200 KB) costs a re-entry time in proportion to its length: the script
// that re-enters (and keeps the last few ids) returns well within 2 s,
// where one that cut the list down an id at a time ran for tens of seconds
// and held every other client of the server up meanwhile (DESIGN, Remote
// state: no busy loop).
func TestRemoteStateHugeCallList(t *testing.T) {
	const words = 100000
	huge := strings.Repeat("x ", words) + "y"
	type prim struct {
		name string
		// lock takes (or re-enters) the owner's hold through c.
		lock func(ctx context.Context, c *dsync.Client, name string) error
		// field is the hash field of the list: key, field and the text
		// before the ids in it.
		field func(ctx context.Context, rdb redis.UniversalClient, name string) (k, f, head string)
	}
	prims := []prim{
		{"Mutex", func(ctx context.Context, c *dsync.Client, name string) error { return c.Mutex(name).Lock(ctx) },
			func(context.Context, redis.UniversalClient, string) (string, string, string) { return "", ":c", "" }},
		{"RWMutex.Lock", func(ctx context.Context, c *dsync.Client, name string) error { return c.RWMutex(name).Lock(ctx) },
			func(context.Context, redis.UniversalClient, string) (string, string, string) { return "", ":c", "" }},
		{"RWMutex.RLock", func(ctx context.Context, c *dsync.Client, name string) error { return c.RWMutex(name).RLock(ctx) },
			func(ctx context.Context, rdb redis.UniversalClient, name string) (string, string, string) {
				rec, err := rdb.HGet(ctx, rwKeys(name).ReaderData, dsync.OwnerToken(ctx)).Result()
				if err != nil {
					t.Fatal(err)
				}
				f := strings.Fields(rec)
				return rwKeys(name).ReaderData, dsync.OwnerToken(ctx), f[0] + " " + f[1] + " "
			}},
		{"Semaphore", func(ctx context.Context, c *dsync.Client, name string) error {
			return c.Semaphore(name, 5).Acquire(ctx, 1)
		}, func(ctx context.Context, _ redis.UniversalClient, name string) (string, string, string) {
			return semKeys(name).State, ":c:" + dsync.OwnerToken(ctx), ""
		}},
	}
	for _, p := range prims {
		t.Run(p.name, func(t *testing.T) {
			for _, b := range redistest.AllBackends(t) {
				if b.Mini != nil {
					continue // gopher-lua's timings say nothing about the server's
				}
				t.Run(b.Name, func(t *testing.T) {
					ctx, name := dsync.WithOwner(ctxT(t)), redistest.Key(t)
					rdb := b.NewClient(t)
					c := newClient(t, b)
					must(t, p.lock(ctx, c, name))
					k, f, head := p.field(ctx, rdb, name)
					if k == "" {
						k = mutexKeys(name).Lock
						if strings.HasPrefix(p.name, "RWMutex") {
							k = rwKeys(name).Writer
						}
					}
					must(t, rdb.HSet(ctx, k, f, head+huge).Err())
					rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					defer cancel()
					start := time.Now()
					if err := p.lock(rctx, c, name); err != nil {
						t.Fatalf("re-entry with %d ids in the hold's list: %v after %v", words, err, time.Since(start).Round(time.Millisecond))
					}
					v, err := rdb.HGet(ctx, k, f).Result()
					must(t, err)
					if n := len(strings.Fields(strings.TrimPrefix(v, head))); n > 32 {
						t.Errorf("the list keeps %d ids after the re-entry, want the last few", n)
					}
				})
			}
		})
	}
}
