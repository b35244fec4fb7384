package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// scriptTimes is a go-redis hook recording when each script call (EVAL,
// EVALSHA, also inside pipelines) was sent.
type scriptTimes struct {
	mu sync.Mutex
	at []time.Time
}

func isScriptCmd(cmd redis.Cmder) bool {
	n := strings.ToLower(cmd.Name())
	return n == "evalsha" || n == "eval" || n == "evalsha_ro" || n == "eval_ro"
}

func (s *scriptTimes) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *scriptTimes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScriptCmd(cmd) && !strings.Contains(strings.ToLower(fmt.Sprint(cmd.Args())), "script") {
			s.mu.Lock()
			s.at = append(s.at, time.Now())
			s.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (s *scriptTimes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if isScriptCmd(cmd) {
				s.mu.Lock()
				s.at = append(s.at, time.Now())
				s.mu.Unlock()
			}
		}
		return next(ctx, cmds)
	}
}

// stats returns the number of script calls in [from, to], and how many
// consecutive pairs of them were less than gap apart.
func (s *scriptTimes) stats(from, to time.Time, gap time.Duration) (n, close int, minGap time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var prev time.Time
	minGap = time.Hour
	for _, t := range s.at {
		if t.Before(from) || t.After(to) {
			continue
		}
		n++
		if !prev.IsZero() {
			d := t.Sub(prev)
			if d < gap {
				close++
			}
			if d < minGap {
				minGap = d
			}
		}
		prev = t
	}
	return
}

// waitKind is one kind of waiting call on a name, and the key of its channel.
type waitKind struct {
	name    string
	holder  func(c *dsync.Client, n string) holdCalls
	waiter  func(c *dsync.Client, n string) holdCalls
	channel func(n string) string
}

var waitKinds = []waitKind{
	{"Mutex", mutexHold, mutexHold, func(n string) string { return mutexKeys(n).Channel() }},
	{"RWMutexWriter", writeHold, writeHold, func(n string) string { return rwk(n).Channel() }},
	{"RWMutexReaderBehindWriter", writeHold, readHold, func(n string) string { return rwk(n).Channel() }},
	{"Semaphore", semHold(2, 2), semHold(2, 1), func(n string) string { return semKeys(n).Channel() }},
}

// queuedSecrets returns "<id> <secret>" of the waiters in a queue data hash.
func queuedSecrets(t *testing.T, rdb redis.UniversalClient, key string) [][2]string {
	vals, err := rdb.HVals(context.Background(), key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	var out [][2]string
	for _, v := range vals {
		f := strings.Fields(v)
		if len(f) >= 4 {
			out = append(out, [2]string{f[2], f[3]})
		}
	}
	return out
}

// TestOwnerAbandonDropsSharedPlace: two waiting calls of one owner, in
// one Client or two; the later one gives up (ctx cancelled) while the
// holder still holds; then the holder releases. The earlier call must get
// in promptly. DESIGN (Waiting): "the waiter sleeps until a release
// notification ... or that TTL, whichever is first"; "A waiter whose ctx
// ends returns ctx.Err() and leaves nothing behind" (it must not take
// away what others still use).
func TestOwnerAbandonDropsSharedPlace(t *testing.T) {
	for _, k := range []waitKind{waitKinds[0], waitKinds[1], waitKinds[2]} {
		for _, two := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/twoClients=%v", k.name, two), func(t *testing.T) {
				eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
					rdb := b.NewClient(t)
					hc, c1 := newClient(t, b), newClient(t, b)
					c2 := c1
					if two {
						c2 = newClient(t, b)
					}
					h := k.holder(hc, name)
					must(t, h.lock(ctx))
					octx := dsync.WithOwner(ctx)
					first := k.waiter(c1, name)
					fctx, fcancel := context.WithTimeout(octx, 8*time.Second)
					defer fcancel()
					firstRes := async(func() error { return first.lock(fctx) })
					dataKey, qKey := mutexKeys(name).QueueData, ""
					switch k.name {
					case "RWMutexWriter":
						dataKey = rwk(name).WriterQueueData
					case "RWMutexReaderBehindWriter":
						dataKey = rwk(name).WaitingReaders
					}
					_ = qKey
					var d1 string
					waitFor(t, 5*time.Second, "first call queued", func() bool {
						d1, _ = rdb.HGet(ctx, dataKey, dsync.OwnerToken(octx)).Result()
						return d1 != ""
					})
					time.Sleep(50 * time.Millisecond)
					second := k.waiter(c2, name)
					sctx, cancel := context.WithCancel(octx)
					secondRes := async(func() error { return second.lock(sctx) })
					waitFor(t, 5*time.Second, "second call queued", func() bool {
						d, _ := rdb.HGet(ctx, dataKey, dsync.OwnerToken(octx)).Result()
						return d != "" && d != d1
					})
					time.Sleep(50 * time.Millisecond)
					cancel()
					mustIs(t, <-secondRes, context.Canceled, "second call: %v")
					time.Sleep(100 * time.Millisecond)
					left, _ := rdb.HGet(ctx, dataKey, dsync.OwnerToken(octx)).Result()
					t.Logf("owner's place after the second call gave up: %q", left)
					released := time.Now()
					must(t, h.unlock(ctx))
					select {
					case err := <-firstRes:
						must(t, err)
						t.Logf("first call got in %v after the release", time.Since(released))
						must(t, first.unlock(octx))
					case <-time.After(3 * time.Second):
						err := <-firstRes
						t.Errorf("first call of the owner still waiting 3 s after the holder released the free name (it gave up at its 8 s ctx deadline: %v, %v after the release)", err, time.Since(released).Round(time.Millisecond))
						if err == nil {
							must(t, first.unlock(octx))
						}
					}
				})
			})
		}
	}
}

// TestOwnerAbandonLosesWriterPreference: a reader holds; two writer
// calls of one owner wait; the later one gives up. The earlier one still
// waits, so "once a writer waits, new readers wait" (DESIGN, RWMutex):
// a new reader of another Client must not get in.
func TestOwnerAbandonLosesWriterPreference(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		reader := newClient(t, b).RWMutex(name)
		must(t, reader.RLock(ctx))
		c := newClient(t, b)
		octx := dsync.WithOwner(ctx)
		w1 := c.RWMutex(name)
		fctx, fcancel := context.WithTimeout(octx, 8*time.Second)
		defer fcancel()
		r1 := async(func() error { return w1.Lock(fctx) })
		waitFor(t, 5*time.Second, "writer waits", writerWaits(t, rdb, name))
		time.Sleep(50 * time.Millisecond)
		newcomer := newClient(t, b).RWMutex(name)
		if ok, err := newcomer.TryRLock(ctx); ok || err != nil {
			t.Fatalf("baseline: new reader TryRLock = %v, %v while a writer waits", ok, err)
		}
		w2 := c.RWMutex(name)
		sctx, cancel := context.WithCancel(octx)
		r2 := async(func() error { return w2.Lock(sctx) })
		time.Sleep(100 * time.Millisecond)
		cancel()
		mustIs(t, <-r2, context.Canceled, "second writer call: %v")
		// The second call's clean-up is over, and the first call, woken
		// by it if it dropped the owner's place, has queued again.
		dsync.WaitCleanups(c)
		waitFor(t, 5*time.Second, "the owner's first call waiting again", writerWaits(t, rdb, name))
		select {
		case err := <-r1:
			t.Fatalf("first writer call returned %v while the reader holds", err)
		default:
		}
		ok, err := newcomer.TryRLock(ctx)
		must(t, err)
		if ok {
			t.Errorf("a new reader got in while the owner's first writer call still waits (the second call's abandon dropped the owner's waiting place)")
			must(t, newcomer.RUnlock(ctx))
		}
		must(t, reader.RUnlock(ctx))
		released := time.Now()
		select {
		case err := <-r1:
			must(t, err)
			t.Logf("first writer call got in %v after the last reader left", time.Since(released))
			must(t, w1.Unlock(octx))
		case <-time.After(5 * time.Second):
			err := <-r1
			t.Errorf("first writer call still waiting 5 s after the last reader left (returned %v after %v)", err, time.Since(released))
			if err == nil {
				must(t, w1.Unlock(octx))
			}
		}
	})
}

// A queued Mutex waiter that gives up leaves nothing in the queue, its
// arrival included, however its holder's other calls fare: the release
// after it finds only the waiters that are still there.
func TestMutexCancelledQueuedWaiterLeavesNothing(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		holder := newClient(t, b).Mutex(name)
		must(t, holder.Lock(ctx))
		wc := newClient(t, b)
		wctx, cancel := context.WithCancel(dsync.WithOwner(ctx))
		defer cancel()
		tok := dsync.OwnerToken(wctx)
		got := async(func() error { return wc.Mutex(name).Lock(wctx) })
		waitFor(t, 5*time.Second, "the waiter's place", func() bool {
			n, _ := rdb.HExists(ctx, mutexKeys(name).QueueData, tok).Result()
			return n
		})
		cancel()
		mustIs(t, <-got, context.Canceled, "Lock = %v, want Canceled")
		dsync.WaitCleanups(wc)
		checkIs(t, rdb.ZScore(ctx, mutexKeys(name).Queue, tok).Err(), redis.Nil, "the cancelled waiter's arrival is left in the queue: %v")
		if ok, _ := rdb.HExists(ctx, mutexKeys(name).QueueData, tok).Result(); ok {
			t.Error("the cancelled waiter's queue record is left")
		}
		must(t, holder.Unlock(ctx))
	})
}

// TestProvenHandoverThenFloodRate: a waiter that has waited longer than
// its TTL sees one hand-over message with a valid proof (forged from the
// secret stored in the queue data hash, or a stale real one), then a flood
// of empty PUBLISHes. README: "Whatever is published or stored, a waiter's
// attempts are at least 20 ms apart, but for the first one a notification
// asks for". Counts the waiter's script calls per second.
func TestProvenHandoverThenFloodRate(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		if b.Name == "cluster" {
			t.Skip("single node is enough")
		}
		rdb := b.NewClient(t)
		h := newClient(t, b).Mutex(name)
		must(t, h.Lock(ctx))
		st := &scriptTimes{}
		wc, _ := hookedClient(t, b, st)
		w := wc.Mutex(name, dsync.TTL(300*time.Millisecond))
		wctx, cancel := context.WithCancel(ctx)
		got := async(func() error { return w.Lock(wctx) })
		var sec [][2]string
		waitFor(t, 5*time.Second, "queued", func() bool {
			sec = queuedSecrets(t, rdb, mutexKeys(name).QueueData)
			return len(sec) == 1
		})
		b.Advance(500 * time.Millisecond) // longer than the waiter's TTL
		if b.Mini != nil {
			time.Sleep(500 * time.Millisecond)
		}
		id, secret := sec[0][0], sec[0][1]
		ch := mutexKeys(name).Channel()
		own := ch
		if at := strings.IndexByte(secret, '@'); at >= 0 {
			own += secret[at:]
		}
		f := uint64(time.Now().UnixMicro())
		must(t, rdb.Publish(ctx, own, fmt.Sprintf("%s %s %d %s", id, sha1hex("x"), f, sha1hex(fmt.Sprintf("%s %d", secret, f)))).Err())
		time.Sleep(20 * time.Millisecond)
		start := time.Now()
		for i := 0; i < 2000 && time.Since(start) < 2*time.Second; i++ {
			_ = rdb.Publish(ctx, ch, "").Err()
			time.Sleep(500 * time.Microsecond)
		}
		end := time.Now()
		n, cl, mg := st.stats(start, end, 10*time.Millisecond)
		rate := float64(n) / end.Sub(start).Seconds()
		t.Logf("waiter: %d script calls in %v (%.0f/s), %d gaps < 10 ms, min gap %v", n, end.Sub(start).Round(time.Millisecond), rate, cl, mg)
		if rate > 55 {
			t.Errorf("waiter attempted %.0f times/s under a flood of empty PUBLISHes after one proven hand-over message; want at most ~50/s (20 ms apart)", rate)
		}
		cancel()
		if err := <-got; err == nil {
			_ = w.Unlock(ctx)
		}
		must(t, h.Unlock(ctx))
	})
}

// A waiter whose TTL (legal: at least 1 ms) is shorter than the 20 ms
// between its attempts keeps its queue place (a place lasts 200 ms at
// least) and is served in its turn, against owners of two other Clients
// that keep the name busy; before, with a 5 ms TTL, its place lapsed
// between its attempts and it got nothing in 3 s. A reader behind writers
// is admitted by a writer's release for its own TTL and must confirm it
// by an attempt, so it is tried too.
func TestShortTTLWaiterIsServed(t *testing.T) {
	for _, k := range []waitKind{waitKinds[0], waitKinds[1], waitKinds[2], {"Semaphore1", semHold(1, 1), semHold(1, 1), nil}} {
		t.Run(k.name, func(t *testing.T) {
			b, ctx, name := realName(t)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 2 {
				c := newClient(t, b)
				for range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						h := k.holder(c, name)
						octx := dsync.WithOwner(ctx)
						untilClosed(stop, 100000, func() bool {
							if err := h.lock(octx); err != nil {
								t.Error(err)
								return false
							}
							time.Sleep(5 * time.Millisecond)
							if err := h.unlock(octx); err != nil {
								t.Error(err)
								return false
							}
							return true
						})
					}()
				}
			}
			defer func() { close(stop); wg.Wait() }()
			time.Sleep(200 * time.Millisecond)
			for _, ttl := range []time.Duration{5 * time.Millisecond, 15 * time.Millisecond} {
				c := newClient(t, b, dsync.TTL(ttl))
				fails := 0
				for range 5 {
					h := k.waiter(c, name)
					lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
					err := h.lock(lctx)
					cancel()
					if err != nil {
						fails++
						continue
					}
					_ = h.unlock(ctx) // a 5 ms lease may be gone by now
				}
				if fails > 0 {
					t.Errorf("waiter with TTL %v starved: %d of 5 Lock calls got nothing in 3 s while others looped", ttl, fails)
				}
			}
		})
	}
}
