package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// onceRunKey is the run hash of the Once called name.
func onceRunKey(name string) string { return "dsync:{" + name + "}:once" }

// A call that waited longer than the TTL for a run that then failed runs f
// with a fresh lease: the lease is measured from the attempt that was
// granted the run, not from the call's first attempt.
func TestOnceTakeoverAfterALongWaitHasALiveLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		const ttl = time.Second
		rdb := b.NewClient(t)
		errBoom := errors.New("boom")

		started, fail := make(chan struct{}), make(chan struct{})
		runner := make(chan error, 1)
		go func() {
			runner <- newClient(t, b, dsync.TTL(ttl)).Once(name).Do(ctx, func(fctx context.Context) error {
				close(started)
				select {
				case <-fail:
					return errBoom
				case <-fctx.Done():
					return context.Cause(fctx)
				}
			})
		}()
		<-started
		runnerTok, err := rdb.HGet(ctx, onceRunKey(name), "t").Result()
		if err != nil {
			t.Fatalf("runner's run lease: %v", err)
		}

		var (
			ranAfter   time.Duration // from the waiter's first refused attempt
			cause      error         // of f's ctx, if it was cancelled
			owner      string        // the run hash's runner while the waiter's f ran
			pttl       time.Duration
			firstAfter time.Time
		)
		waiter := make(chan error, 1)
		go func() {
			waiter <- newClient(t, b, dsync.TTL(ttl)).Once(name).Do(ctx, func(fctx context.Context) error {
				ranAfter = time.Since(firstAfter)
				select {
				case <-fctx.Done():
					cause = context.Cause(fctx)
					return fctx.Err()
				case <-time.After(300 * time.Millisecond):
				}
				owner, _ = rdb.HGet(ctx, onceRunKey(name), "t").Result()
				pttl, _ = rdb.PTTL(ctx, onceRunKey(name)).Result()
				if err := fctx.Err(); err != nil {
					cause = context.Cause(fctx)
					return err
				}
				return nil
			})
		}()
		// The waiter's first attempt was refused once it marked the run
		// hash as waited for.
		for {
			if ok, _ := rdb.HExists(ctx, onceRunKey(name), "w").Result(); ok {
				break
			}
			if ctx.Err() != nil {
				t.Fatal("the waiter never waited")
			}
			time.Sleep(5 * time.Millisecond)
		}
		firstAfter = time.Now()
		time.Sleep(ttl + ttl/2) // the runner's lease is renewed meanwhile
		close(fail)

		if err := <-runner; !errors.Is(err, errBoom) || errors.Is(err, dsync.ErrLeaseLost) {
			t.Fatalf("runner's Do = %v, want boom without ErrLeaseLost", err)
		}
		err = <-waiter
		if ranAfter < ttl {
			t.Errorf("the waiter ran f %v after its first attempt, want more than the TTL %v", ranAfter, ttl)
		}
		if cause != nil {
			t.Errorf("f's ctx was cancelled within 300ms of the takeover (cause %v), want it alive with a fresh %v lease", cause, ttl)
		}
		if err != nil {
			t.Errorf("waiter's Do = %v, want nil", err)
		}
		if owner == "" || owner == runnerTok || pttl <= 0 {
			t.Errorf("while the waiter ran f: run hash runner %q (first runner %q), PTTL %v; want the waiter's live run lease", owner, runnerTok, pttl)
		}
	})
}
