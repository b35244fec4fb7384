package dsync_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// slowScripts is a go-redis hook that delays every script call after the
// first skip by delay: a slow network between a waiter and Redis.
type slowScripts struct {
	skip  int64
	delay time.Duration
	seen  atomic.Int64
}

func (s *slowScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *slowScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); (n == "evalsha" || n == "eval") && s.seen.Add(1) > s.skip {
			time.Sleep(s.delay)
		}
		return next(ctx, cmd)
	}
}

func (s *slowScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestSemaphoreWaiterAfterLastLeaseEnds: a release hands the permit to a
// waiter with a 1 s TTL, which dies holding it; the next waiter, told to
// come back when that lease ends, arrives a little late (a slow network).
// By then Redis has expired the holders zset with the last lease (the
// hand-over wrote it anew, with that 1 s expiry), while the waiters' queue
// places keep the state hash, which still counts the dead holder's permit.
// Before, the attempt forgot that permit only after it had served the
// queue and found itself not served: it was refused with nothing held and
// slept on for half its 30 s TTL, well past its 5 s ctx. Now the permits
// are forgotten and the queue is served again in the same attempt. Real
// server and cluster: miniredis expires keys only when told.
func TestSemaphoreWaiterAfterLastLeaseEnds(t *testing.T) {
	const (
		deadTTL = time.Second
		within  = 5 * time.Second // the waiter's TTL is 30 s
	)
	eachRealName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		holder := newClient(t, b).Semaphore(name, 1)
		must(t, holder.Acquire(ctx, 1))
		dc := dsync.New(b.NewClient(t))
		defer dc.Close()
		dying := make(chan error, 1)
		go func() { dying <- dc.Semaphore(name, 1, dsync.TTL(deadTTL)).Acquire(ctx, 1) }()
		waitFor(t, 10*time.Second, "the first waiter's place", func() bool {
			return rdb.ZCard(ctx, semKeys(name).Queue).Val() == 1
		})
		wrdb := b.NewClient(t)
		// The first attempt and the one after subscribing go at once;
		// later ones arrive 100 ms late.
		wrdb.AddHook(&slowScripts{skip: 2, delay: 100 * time.Millisecond})
		s := newClientOn(t, wrdb).Semaphore(name, 1)
		wctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		got := make(chan error, 1)
		start := time.Now()
		go func() { got <- s.Acquire(wctx, 1) }()
		waitFor(t, 10*time.Second, "the second waiter's place", func() bool {
			return rdb.ZCard(ctx, semKeys(name).Queue).Val() == 2
		})
		must(t, holder.Release(ctx, 1))
		if err := <-dying; err != nil {
			t.Fatalf("first waiter = %v, want the permit", err)
		}
		dc.Close() // it dies holding the permit: its lease runs out by itself
		if err := <-got; err != nil {
			t.Fatalf("Acquire after the %v lease of a dead holder = %v after %v; want the permit",
				deadTTL, err, time.Since(start).Round(time.Millisecond))
		}
		must(t, s.Release(ctx, 1))
	})
}

// newClientOn returns a dsync Client on rdb, closed at cleanup.
func newClientOn(t *testing.T, rdb redis.UniversalClient, opts ...dsync.Option) *dsync.Client {
	t.Helper()
	c := dsync.New(rdb, opts...)
	t.Cleanup(func() { c.Close() })
	return c
}
