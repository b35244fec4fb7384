package dsync_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// muted returns the source of script name with every PUBLISH sent to a
// channel nobody listens on: releases and hand-overs still happen, but no
// waiter hears of them.
func muted(t *testing.T, name string) string {
	t.Helper()
	src, err := dsync.ScriptSource(name)
	if err != nil {
		t.Fatal(err)
	}
	const pub = "redis.call('PUBLISH', ch,"
	if !strings.Contains(src, pub) {
		t.Fatalf("%s publishes no other way than %q", name, pub)
	}
	return strings.ReplaceAll(src, pub, "redis.call('PUBLISH', ch .. ':muted',")
}

// A waiter that misses the notification of a hand-over learns of it from
// its next attempt. The server's TTL of the hold started at the hand-over,
// before that attempt, so the lease must be measured from the attempt sent
// before the hand-over: the waiter's local deadline is never later than
// the server's expiry of its hold (DESIGN, Leases). Measured from the later
// attempt, it would be late by the time the waiter slept (up to a TTL), and
// another process could get in while the waiter's lease still looked live.
func TestLeaseStartAfterMissedHandover(t *testing.T) {
	type side struct {
		lock   func(ctx context.Context) error
		unlock func(ctx context.Context) error
		lease  func(ctx context.Context) (*dsync.Lease, error)
	}
	cases := []struct {
		name, script string
		key          func(name string) string
		make         func(c *dsync.Client, name string, ttl time.Duration) side
	}{
		{"Mutex", "mutex_unlock", func(n string) string { return mutexKeys(n).Lock },
			func(c *dsync.Client, n string, ttl time.Duration) side {
				m := c.Mutex(n, dsync.TTL(ttl))
				return side{m.Lock, m.Unlock, m.Lease}
			}},
		{"RWMutex", "rwmutex_unlock", func(n string) string { return rwk(n).Writer },
			func(c *dsync.Client, n string, ttl time.Duration) side {
				rw := c.RWMutex(n, dsync.TTL(ttl))
				return side{rw.Lock, rw.Unlock, rw.Lease}
			}},
		{"Semaphore", "semaphore_release", nil,
			func(c *dsync.Client, n string, ttl time.Duration) side {
				s := c.Semaphore(n, 1, dsync.TTL(ttl))
				return side{
					func(ctx context.Context) error { return s.Acquire(ctx, 1) },
					func(ctx context.Context) error { return s.Release(ctx, 1) },
					s.Lease,
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b redistest.Backend) {
				if b.Mini != nil {
					t.Skip("miniredis TTLs move only when told: its expiry says nothing about a local deadline")
				}
				ctx := ctxT(t)
				name := redistest.Key(t)
				rdb := b.NewClient(t)
				// The first holder's lease is short, so that the waiter's
				// next attempt comes within about a second; the waiter's is
				// long, so that its hold is still there when it learns of it.
				first := tc.make(newClient(t, b), name, time.Second)
				wc := newClient(t, b)
				stall := make(chan struct{})
				t.Cleanup(func() { close(stall) })
				// No renewal of the waiter's hold goes out during the test:
				// its deadline stays the one its lease started with.
				dsync.SetRenewStall(wc, func() { <-stall })
				waiter := tc.make(wc, name, 3*time.Second)

				if err := first.lock(ctx); err != nil {
					t.Fatal(err)
				}
				restore := dsync.SwapScript(tc.script, muted(t, tc.script))
				defer restore()
				got := make(chan error, 1)
				go func() { got <- waiter.lock(ctx) }()
				// Let the waiter make its first attempt and queue.
				time.Sleep(300 * time.Millisecond)
				if err := first.unlock(ctx); err != nil {
					t.Fatal(err)
				}
				handover := time.Now()
				if err := <-got; err != nil {
					t.Fatal(err)
				}
				learned := time.Since(handover)
				restore()
				l, err := waiter.lease(ctx)
				if err != nil {
					t.Fatal(err)
				}
				sent := time.Now()
				var pttl time.Duration
				if tc.key != nil {
					pttl, err = rdb.PTTL(ctx, tc.key(name)).Result()
				} else {
					pttl, err = semHolderTTL(ctx, rdb, name)
				}
				if err != nil || pttl <= 0 {
					t.Fatalf("PTTL of the waiter's hold = %v, %v", pttl, err)
				}
				// The server expires the hold at the earliest at sent+pttl.
				if d, expiry := dsync.LeaseDeadline(l), sent.Add(pttl); d.After(expiry) {
					t.Fatalf("hand-over learned %v after it happened: local deadline %v after the server's expiry",
						learned.Round(time.Millisecond), d.Sub(expiry).Round(time.Millisecond))
				}
				if learned < 100*time.Millisecond {
					t.Fatalf("the waiter learned of the hand-over %v after it: it was not missed", learned)
				}
				if err := waiter.unlock(ctx); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// semHolderTTL returns how long the server keeps the only holding of the
// Semaphore name: its deadline in the holders zset less the server's time.
func semHolderTTL(ctx context.Context, rdb redis.UniversalClient, name string) (time.Duration, error) {
	hs, err := rdb.ZRangeWithScores(ctx, semKeys(name).Holders, 0, -1).Result()
	if err != nil {
		return 0, err
	}
	if len(hs) != 1 {
		return 0, fmt.Errorf("holders %v, want one", hs)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	return time.Duration(int64(hs[0].Score)-now.UnixMilli()) * time.Millisecond, nil
}
