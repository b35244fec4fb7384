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
		within := func(what string, got, lo, hi time.Duration) {
			t.Helper()
			if got < lo || got > hi {
				t.Errorf("%s: PTTL = %v, want within [%v, %v]", what, got, lo, hi)
			}
		}

		// The first reader of a free name: both keys get its TTL.
		must(t, short.RLock(ctx))
		r, d := ttls()
		within("readers zset, first reader", r, 8*time.Second, 10*time.Second)
		within("readers hash, first reader", d, 8*time.Second, 10*time.Second)

		// A second reader with a longer TTL: both keys outlast it.
		must(t, long.RLock(ctx))
		r, d = ttls()
		within("readers zset, two readers", r, 38*time.Second, 40*time.Second)
		within("readers hash, two readers", d, 38*time.Second, 40*time.Second)

		// A third reader with a shorter TTL moves neither key's expiry
		// earlier; its leaving neither.
		third := newClient(t, b).RWMutex(name, dsync.TTL(5*time.Second), dsync.FixedLease())
		must(t, third.RLock(ctx))
		r, d = ttls()
		within("readers zset, a shorter third reader", r, 38*time.Second, 40*time.Second)
		within("readers hash, a shorter third reader", d, 38*time.Second, 40*time.Second)
		must(t, third.RUnlock(ctx))
		r, d = ttls()
		within("readers zset, the third reader left", r, 38*time.Second, 40*time.Second)
		within("readers hash, the third reader left", d, 38*time.Second, 40*time.Second)

		// The longer one leaves: the keys shrink to the one left.
		must(t, long.RUnlock(ctx))
		r, d = ttls()
		within("readers zset, the short reader left", r, 1, 10*time.Second)
		within("readers hash, the short reader left", d, 1, 10*time.Second)
		if n, err := rdb.HLen(ctx, k.ReaderData).Result(); err != nil || n != 1 {
			t.Errorf("readers hash fields = %d, %v; want 1", n, err)
		}

		// The last reader leaves: no reader key is left, and a writer
		// takes the lock at once.
		must(t, short.RUnlock(ctx))
		for _, key := range []string{k.Readers, k.ReaderData} {
			if n, err := rdb.Exists(ctx, key).Result(); err != nil || n != 0 {
				t.Errorf("%s after the last reader left: exists = %d, %v; want gone", key, n, err)
			}
		}
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
		for _, key := range []string{k.Readers, k.ReaderData} {
			if n, err := rdb.Exists(ctx, key).Result(); err != nil || n != 0 {
				t.Errorf("%s after the lapsed reader's RUnlock: exists = %d, %v; want gone", key, n, err)
			}
		}
	})
}
