package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// The readers zset and hash as the read scripts leave them: each key lasts
// as long as the furthest reader's deadline, and no longer, also when the
// scripts know the zset from their first look at it (a reader alone, or
// the first reader of a free name) and do not read it again.
func TestRWMutexReadersKeysFollowTheReaders(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		k := rwk(name)
		c := newClient(t, b)
		// Fixed leases: no renewal moves a deadline.
		short := c.RWMutex(name, dsync.TTL(10*time.Second), dsync.FixedLease())
		long := c.RWMutex(name, dsync.TTL(40*time.Second), dsync.FixedLease())
		ttls := func() (readers, data time.Duration) {
			t.Helper()
			r, err := rdb.PTTL(ctx, k.Readers).Result()
			if err != nil {
				t.Fatal(err)
			}
			d, err := rdb.PTTL(ctx, k.ReaderData).Result()
			if err != nil {
				t.Fatal(err)
			}
			return r, d
		}
		// Both keys' expiries, when what has happened, within [lo, hi].
		keysWithin := func(what string, lo, hi time.Duration) {
			t.Helper()
			r, d := ttls()
			for _, k := range []struct {
				key string
				got time.Duration
			}{{"readers zset", r}, {"readers hash", d}} {
				if k.got < lo || k.got > hi {
					t.Errorf("%s, %s: PTTL = %v, want within [%v, %v]", k.key, what, k.got, lo, hi)
				}
			}
		}

		keysGone := func(what string) {
			t.Helper()
			for _, key := range []string{k.Readers, k.ReaderData} {
				if n, err := rdb.Exists(ctx, key).Result(); err != nil || n != 0 {
					t.Errorf("%s after %s: exists = %d, %v; want gone", key, what, n, err)
				}
			}
		}

		// The first reader of a free name: both keys get its TTL.
		must(t, short.RLock(ctx))
		keysWithin("first reader", 8*time.Second, 10*time.Second)

		// A second reader with a longer TTL: both keys outlast it.
		must(t, long.RLock(ctx))
		keysWithin("two readers", 38*time.Second, 40*time.Second)

		// A third reader with a shorter TTL moves neither key's expiry
		// earlier; its leaving neither.
		third := newClient(t, b).RWMutex(name, dsync.TTL(5*time.Second), dsync.FixedLease())
		must(t, third.RLock(ctx))
		keysWithin("a shorter third reader", 38*time.Second, 40*time.Second)
		must(t, third.RUnlock(ctx))
		keysWithin("the third reader left", 38*time.Second, 40*time.Second)

		// The longer one leaves: the keys shrink to the one left.
		must(t, long.RUnlock(ctx))
		keysWithin("the short reader left", 1, 10*time.Second)
		if n, err := rdb.HLen(ctx, k.ReaderData).Result(); err != nil || n != 1 {
			t.Errorf("readers hash fields = %d, %v; want 1", n, err)
		}

		// The last reader leaves: no reader key is left, and a writer
		// takes the lock at once.
		must(t, short.RUnlock(ctx))
		keysGone("the last reader left")
		w := newClient(t, b).RWMutex(name)
		if ok, err := w.TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock after the last reader left = %v, %v; want true", ok, err)
		}
		must(t, w.Unlock(ctx))

		// A reader alone whose deadline in Redis has passed (moved there
		// by hand: Redis's view decides) holds nothing: its RUnlock says
		// the lease was lost, and leaves no reader key.
		must(t, short.RLock(ctx))
		readers, err := rdb.ZRange(ctx, k.Readers, 0, -1).Result()
		if err != nil || len(readers) != 1 {
			t.Fatalf("readers = %v, %v; want the one", readers, err)
		}
		if err := rdb.ZAddXX(ctx, k.Readers, redis.Z{Score: 1, Member: readers[0]}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := short.RUnlock(ctx); !errors.Is(err, dsync.ErrLeaseLost) {
			t.Errorf("RUnlock of a read hold past its deadline in Redis = %v, want ErrLeaseLost", err)
		}
		keysGone("the lapsed reader's RUnlock")
	})
}
