package dsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A waiting entry dsync did not write, whose own lease TTL field is ten
// years (or past what PEXPIRE accepts), in keys that expire in 1 s.
// A release that hands the lock (or permits) to it must not copy that TTL
// into the expiry of a key dsync writes: the name must not stay blocked
// for ten years, nor keep a key without an expiry.

const (
	fsTenYearsMs = "315360000000"
	fsOverflowMs = "9223372036854775807"
)

// foreignTTLs runs f for each foreign TTL field.
func foreignTTLs(t *testing.T, f func(t *testing.T, b redistest.Backend, fttl string)) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, c := range []struct{ n, v string }{{"tenyears", fsTenYearsMs}, {"overflow", fsOverflowMs}} {
			t.Run(c.n, func(t *testing.T) { f(t, b, c.v) })
		}
	})
}

// checkNoForeignExpiry fails when key lives past limit or has no expiry.
func checkNoForeignExpiry(t *testing.T, rdb redis.UniversalClient, key string, limit time.Duration) {
	t.Helper()
	p := rdb.PTTL(context.Background(), key).Val()
	if p == -1 || p > limit {
		t.Errorf("%s: PTTL %v (limit %v): expiry copied from a foreign TTL field", key, p, limit)
	}
}

func TestRemoteStateForeignTTLMutexHandOver(t *testing.T) {
	foreignTTLs(t, func(t *testing.T, b redistest.Backend, fttl string) {
		name, ctx := redistest.Key(t), context.Background()
		rdb := b.NewClient(t)
		k := mutexKeys(name)
		c := newClient(t, b)
		m := c.Mutex(name, dsync.TTL(time.Second))
		a := dsync.WithOwner(ctxT(t))
		must(t, m.Lock(a))
		// A waiter that gives up: the hold gets its ':w' (someone waits).
		wctx, cancel := context.WithTimeout(dsync.WithOwner(ctxT(t)), 200*time.Millisecond)
		if err := m.Lock(wctx); err == nil {
			t.Fatal("second owner got a held lock")
		}
		cancel()
		now := rsNow(t, rdb)
		must(t, rdb.ZAdd(ctx, k.Queue, redis.Z{Score: rsUs(now.Add(-time.Second)), Member: "foreign"}).Err())
		must(t, rdb.HSet(ctx, k.QueueData, "foreign", rsMs(now.Add(time.Second))+" "+fttl+" farcall secret").Err())
		expireIn(t, rdb, time.Second, k.Queue, k.QueueData)
		err := m.Unlock(a)
		t.Logf("Unlock: %v", err)
		checkNoForeignExpiry(t, rdb, k.Lock, 2*time.Second)
		if b.Mini != nil {
			return
		}
		takesWithin(t, 4*time.Second, dsync.WithOwner(ctxT(t)), "Lock after the foreign place's keys expired", func(ctx context.Context) error { return m.Lock(ctx) })
	})
}

func TestRemoteStateForeignTTLRWMutexHandOver(t *testing.T) {
	foreignTTLs(t, func(t *testing.T, b redistest.Backend, fttl string) {
		name, ctx := redistest.Key(t), context.Background()
		rdb := b.NewClient(t)
		k := rwk(name)
		c := newClient(t, b)
		rw := c.RWMutex(name, dsync.TTL(time.Second))
		a := dsync.WithOwner(ctxT(t))
		must(t, rw.Lock(a))
		now := rsNow(t, rdb)
		must(t, rdb.Do(ctx, "zadd", k.WaitingWriters, rsMs(now.Add(time.Second)), "foreign").Err())
		must(t, rdb.ZAdd(ctx, k.WriterQueue, redis.Z{Score: rsUs(now), Member: "foreign"}).Err())
		must(t, rdb.HSet(ctx, k.WriterQueueData, "foreign", fttl+" farcall secret").Err())
		expireIn(t, rdb, time.Second, k.WaitingWriters, k.WriterQueue, k.WriterQueueData)
		err := rw.Unlock(a)
		t.Logf("Unlock: %v", err)
		checkNoForeignExpiry(t, rdb, k.Writer, 2*time.Second)
		if b.Mini != nil {
			return
		}
		takesWithin(t, 4*time.Second, dsync.WithOwner(ctxT(t)), "Lock after the foreign place's keys expired", func(ctx context.Context) error { return rw.Lock(ctx) })
	})
}

func TestRemoteStateForeignTTLRWMutexWaitingReader(t *testing.T) {
	foreignTTLs(t, func(t *testing.T, b redistest.Backend, fttl string) {
		name, ctx := redistest.Key(t), context.Background()
		rdb := b.NewClient(t)
		k := rwk(name)
		c := newClient(t, b)
		rw := c.RWMutex(name, dsync.TTL(time.Second))
		a := dsync.WithOwner(ctxT(t))
		must(t, rw.Lock(a))
		now := rsNow(t, rdb)
		must(t, rdb.HSet(ctx, k.WaitingReaders, "foreign-reader", rsMs(now.Add(time.Second))+" "+fttl+" farcall").Err())
		expireIn(t, rdb, time.Second, k.WaitingReaders)
		err := rw.Unlock(a)
		t.Logf("Unlock: %v", err)
		checkNoForeignExpiry(t, rdb, k.Readers, 2*time.Second)
		checkNoForeignExpiry(t, rdb, k.ReaderData, 2*time.Second)
		if b.Mini != nil {
			return
		}
		takesWithin(t, 4*time.Second, dsync.WithOwner(ctxT(t)), "Lock after the foreign waiting reader's key expired", func(ctx context.Context) error { return rw.Lock(ctx) })
	})
}

func TestRemoteStateForeignTTLSemaphoreGrant(t *testing.T) {
	foreignTTLs(t, func(t *testing.T, b redistest.Backend, fttl string) {
		name, ctx := redistest.Key(t), context.Background()
		rdb := b.NewClient(t)
		k := semKeys(name)
		c := newClient(t, b)
		s := c.Semaphore(name, 2, dsync.TTL(time.Second))
		a := ctxT(t)
		must(t, s.Acquire(a, 2))
		now := rsNow(t, rdb)
		must(t, rdb.ZAdd(ctx, k.Queue, redis.Z{Score: rsUs(now.Add(-time.Second)), Member: "farcall"}).Err())
		must(t, rdb.HSet(ctx, k.QueueData, "farcall", rsMs(now.Add(time.Second))+" "+fttl+" 1 secret foreign-tok").Err())
		expireIn(t, rdb, time.Second, k.Queue, k.QueueData)
		err := s.Release(a, 2)
		t.Logf("Release: %v", err)
		checkNoForeignExpiry(t, rdb, k.Holders, 2*time.Second)
		checkNoForeignExpiry(t, rdb, k.State, 2*time.Second)
		if b.Mini != nil {
			return
		}
		takesWithin(t, 4*time.Second, ctxT(t), "Acquire(2) after the foreign place's keys expired", func(ctx context.Context) error { return s.Acquire(ctx, 2) })
	})
}

// A foreign queue head whose place deadline and TTL field are both ten
// years off is dropped (its TTL is none a Client sends): a free Mutex is
// taken. Before, it passed too_far (which trusted the entry's own TTL),
// stayed first in line, and each waiter's attempt extended the queue keys
// that were to expire in 1 s.
func TestRemoteStateForeignFarHeadWithFarTTLMutex(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		if b.Mini != nil {
			t.Skip("needs TTLs that run down by themselves (real server)")
		}
		name, ctx := redistest.Key(t), context.Background()
		rdb := b.NewClient(t)
		k := mutexKeys(name)
		now := rsNow(t, rdb)
		far := rsMs(now.Add(10 * 365 * 24 * time.Hour))
		must(t, rdb.ZAdd(ctx, k.Queue, redis.Z{Score: rsUs(now), Member: "foreign"}).Err())
		must(t, rdb.HSet(ctx, k.QueueData, "foreign", far+" "+fsTenYearsMs+" farcall secret").Err())
		expireIn(t, rdb, time.Second, k.Queue, k.QueueData)
		c := newClient(t, b)
		m := c.Mutex(name, dsync.TTL(time.Second))
		lctx, cancel := context.WithTimeout(dsync.WithOwner(ctxT(t)), 4*time.Second)
		defer cancel()
		if err := m.Lock(lctx); err != nil {
			t.Errorf("Lock of a free Mutex behind a foreign queue place whose keys were to expire in 1 s: %v (queue PTTL now %v)", err, rdb.PTTL(ctx, k.Queue).Val())
		}
	})
}

// A foreign Semaphore queue entry whose holder token begins with ':' is
// dropped, not granted permits. Before, it was granted them, and prune
// later dropped its holders-zset member alone (holder tokens never begin
// with ':') without giving the permit back: while another holding kept the
// state hash alive, the permit was gone.
func TestRemoteStateForeignColonTokenSemaphoreGrant(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		if b.Mini != nil {
			t.Skip("needs TTLs that run down by themselves (real server)")
		}
		name, ctx := redistest.Key(t), context.Background()
		rdb := b.NewClient(t)
		k := semKeys(name)
		c := newClient(t, b)
		s := c.Semaphore(name, 2, dsync.TTL(time.Second))
		a, holder := dsync.WithOwner(ctxT(t)), dsync.WithOwner(ctxT(t))
		must(t, s.Acquire(a, 1))
		must(t, s.Acquire(holder, 1)) // held (and renewed) throughout
		now := rsNow(t, rdb)
		must(t, rdb.ZAdd(ctx, k.Queue, redis.Z{Score: rsUs(now.Add(-time.Second)), Member: "farcall"}).Err())
		must(t, rdb.HSet(ctx, k.QueueData, "farcall", rsMs(now.Add(time.Second))+" 300 1 secret :x").Err())
		expireIn(t, rdb, time.Second, k.Queue, k.QueueData)
		must(t, s.Release(a, 1)) // grants 1 permit to ":x" for 300 ms
		time.Sleep(1500 * time.Millisecond)
		t.Logf("state after the foreign lease ran out: %v; holders %v", rdb.HGetAll(ctx, k.State).Val(), rdb.ZRangeWithScores(ctx, k.Holders, 0, -1).Val())
		bctx, cancel := context.WithTimeout(dsync.WithOwner(ctxT(t)), 3*time.Second)
		defer cancel()
		if err := s.Acquire(bctx, 1); err != nil {
			t.Errorf("Acquire(1) of a size-2 Semaphore with one permit held: %v (state %v)", err, rdb.HGetAll(ctx, k.State).Val())
		}
	})
}

// A fence hash without expiry whose 'e' (when the scripts last set its
// expiry) is far off gets an expiry from the next fresh hold. Before,
// set_fence trusted 'e' and wrote 'n' into the key for good.
func TestRemoteStateForeignFenceFarExpiryMark(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		name, ctx := redistest.Key(t), context.Background()
		rdb := b.NewClient(t)
		k := mutexKeys(name)
		far := rsMs(rsNow(t, rdb).Add(10 * 365 * 24 * time.Hour))
		must(t, rdb.HSet(ctx, k.Fence, "e", far).Err())
		c := newClient(t, b)
		m := c.Mutex(name, dsync.TTL(time.Second))
		o := dsync.WithOwner(ctxT(t))
		must(t, m.Lock(o))
		must(t, m.Unlock(o))
		if p := rdb.PTTL(ctx, k.Fence).Val(); p < 0 {
			t.Errorf("fence hash that dsync wrote 'n' into has PTTL %v (%v)", p, rdb.HGetAll(ctx, k.Fence).Val())
		}
	})
}

// The RWMutex writers' queue: a foreign queued writer whose place and TTL
// field are ten years off is dropped, and a free RWMutex is taken. Before,
// too_far trusted its TTL, and each waiting writer's attempt kept alive
// the keys that were to expire in 1 s.
func TestRemoteStateForeignFarHeadWithFarTTLRWMutex(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		if b.Mini != nil {
			t.Skip("needs TTLs that run down by themselves (real server)")
		}
		name, ctx := redistest.Key(t), context.Background()
		rdb := b.NewClient(t)
		k := rwk(name)
		now := rsNow(t, rdb)
		far := rsMs(now.Add(10 * 365 * 24 * time.Hour))
		must(t, rdb.Do(ctx, "zadd", k.WaitingWriters, far, "foreign").Err())
		must(t, rdb.ZAdd(ctx, k.WriterQueue, redis.Z{Score: rsUs(now), Member: "foreign"}).Err())
		must(t, rdb.HSet(ctx, k.WriterQueueData, "foreign", fsTenYearsMs+" farcall secret").Err())
		expireIn(t, rdb, time.Second, k.WaitingWriters, k.WriterQueue, k.WriterQueueData)
		c := newClient(t, b)
		rw := c.RWMutex(name, dsync.TTL(time.Second))
		lctx, cancel := context.WithTimeout(dsync.WithOwner(ctxT(t)), 4*time.Second)
		defer cancel()
		if err := rw.Lock(lctx); err != nil {
			t.Errorf("Lock of a free RWMutex behind a foreign queued writer whose keys were to expire in 1 s: %v (queue PTTL now %v, writer hash %v PTTL %v)", err, rdb.PTTL(ctx, k.WriterQueue).Val(), rdb.HGetAll(ctx, k.Writer).Val(), rdb.PTTL(ctx, k.Writer).Val())
		}
	})
}

// Waiting calls facing absurd remote TTLs return by their ctx deadline.
func TestRemoteStateWaitersReturnByDeadlineOnFarTTL(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		if b.Mini != nil {
			t.Skip("miniredis overflows such expiries into the past")
		}
		name, ctx := redistest.Key(t), context.Background()
		rdb := b.NewClient(t)
		c := newClient(t, b)
		ok := onceKeys(name)
		must(t, rdb.HSet(ctx, ok.Run, "t", "foreign").Err())
		must(t, rdb.Do(ctx, "pexpire", ok.Run, "9000000000000000").Err())
		mk := mutexKeys(name)
		must(t, rdb.HSet(ctx, mk.Lock, "foreign", "1", ":f", "5").Err())
		must(t, rdb.Do(ctx, "pexpire", mk.Lock, "9000000000000000").Err())
		for _, tc := range []struct {
			n string
			f func(context.Context) error
		}{
			{"Once", func(ctx context.Context) error {
				return c.Once(name).Do(ctx, func(context.Context) error { return nil })
			}},
			{"Mutex", func(ctx context.Context) error {
				return c.Mutex(name, dsync.TTL(time.Second)).Lock(dsync.WithOwner(ctx))
			}},
		} {
			cctx, cancel := context.WithTimeout(ctxT(t), 700*time.Millisecond)
			st := time.Now()
			err := tc.f(cctx)
			cancel()
			if d := time.Since(st); d > time.Second || err == nil {
				t.Errorf("%s: %v after %v", tc.n, err, d)
			}
		}
	})
}

// expireIn gives each of keys the expiry d, as their writer would have.
func expireIn(t *testing.T, rdb redis.UniversalClient, d time.Duration, keys ...string) {
	t.Helper()
	for _, key := range keys {
		must(t, rdb.PExpire(context.Background(), key, d).Err())
	}
}

// takesWithin fails unless take, on a ctx derived from parent that ends
// after d, succeeds: the name recovered from foreign data, as what says.
func takesWithin(t *testing.T, d time.Duration, parent context.Context, what string, take func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(parent, d)
	defer cancel()
	if err := take(ctx); err != nil {
		t.Errorf("%s within %v: %v", what, d, err)
	}
}
