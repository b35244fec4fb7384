package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
)

// One Client renews the holds of many names in one script call. A key of
// another type (foreign data) written over one name's key makes that
// name's hold lost, and no other: a script error for the whole call would
// leave every hold in it unrenewed until lost.
func TestForeignKeyCostsOtherHoldsNothing(t *testing.T) {
	// Renewals every TTL/3: the other hold is lost only if none succeeds
	// for about a TTL (a stall of the test process of a second or more).
	const ttl = 1500 * time.Millisecond
	kinds := []struct {
		name string
		kind holdKind
		key  func(name string) string // the key the renewal reads first
	}{
		{"Mutex", mutexHold, func(n string) string { return mutexKeys(n).Lock }},
		{"RWMutex/write", writeHold, func(n string) string { return rwk(n).Writer }},
		{"RWMutex/read", readHold, func(n string) string { return rwk(n).Readers }},
		{"Semaphore/holders", semHold(2, 1), func(n string) string { return semKeys(n).Holders }},
		{"Semaphore/state", semHold(2, 1), func(n string) string { return semKeys(n).State }},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			b, ctx, name := realName(t)
			rdb := b.NewClient(t)
			c := newClient(t, b, dsync.TTL(ttl))
			good, bad := k.kind(c, name+"-good"), k.kind(c, name+"-bad")
			must(t, good.lock(ctx))
			must(t, bad.lock(ctx))
			gl, err := good.lease(ctx)
			must(t, err)
			bl, err := bad.lease(ctx)
			must(t, err)
			badKey := k.key(name + "-bad")
			must(t, rdb.Set(ctx, badKey, "foreign", 0).Err())
			t.Cleanup(func() { rdb.Del(context.Background(), badKey) })
			select {
			case <-bl.Done():
				if !errors.Is(bl.Err(), dsync.ErrLeaseLost) {
					t.Fatalf("the hold whose key was overwritten: Lease.Err = %v, want ErrLeaseLost", bl.Err())
				}
			case <-time.After(10 * ttl):
				t.Fatal("the hold whose key was overwritten was not found lost")
			}
			// Two TTLs see about six renewals.
			select {
			case <-gl.Done():
				t.Fatalf("the hold of another name was lost: %v", gl.Err())
			case <-time.After(2 * ttl):
			}
			must(t, good.unlock(ctx))
		})
	}
	t.Run("Once", func(t *testing.T) {
		b, ctx, name := realName(t)
		rdb := b.NewClient(t)
		c := newClient(t, b, dsync.TTL(ttl))
		bad, good := name+"-bad", name+"-good"
		run := func(o *dsync.Once, in chan<- struct{}, stop <-chan struct{}, cause chan<- error) <-chan error {
			return async(func() error {
				return o.Do(ctx, func(fctx context.Context) error {
					close(in)
					select {
					case <-fctx.Done():
						cause <- context.Cause(fctx)
						return fctx.Err()
					case <-stop:
						cause <- nil
						return nil
					}
				})
			})
		}
		goodIn, badIn, stop := make(chan struct{}), make(chan struct{}), make(chan struct{})
		goodCause, badCause := make(chan error, 1), make(chan error, 1)
		goodDone := run(c.Once(good), goodIn, stop, goodCause)
		badDone := run(c.Once(bad), badIn, stop, badCause)
		<-goodIn
		<-badIn
		badKey := keys.ForOnce(dsync.DefaultPrefix, bad).Run
		must(t, rdb.Set(ctx, badKey, "foreign", 0).Err())
		t.Cleanup(func() { rdb.Del(context.Background(), badKey) })
		select {
		case err := <-badCause:
			if !errors.Is(err, dsync.ErrLeaseLost) {
				t.Fatalf("the run whose key was overwritten: cause %v, want ErrLeaseLost", err)
			}
		case <-time.After(10 * ttl):
			t.Fatal("the run whose key was overwritten was not found lost")
		}
		select {
		case err := <-goodCause:
			t.Fatalf("the run of another name ended: cause %v", err)
		case <-time.After(2 * ttl):
		}
		close(stop)
		if err := <-goodCause; err != nil {
			t.Fatal(err)
		}
		recvNil(t, goodDone, 10*time.Second, "the healthy run did not end")
		select {
		case <-badDone:
		case <-time.After(10 * time.Second):
			t.Fatal("the run whose key was overwritten did not return")
		}
	})
}
