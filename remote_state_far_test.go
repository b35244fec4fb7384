package dsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A writer's waiting place that dsync did not write, with a deadline ten
// years off, in a key that expires in 1 s: a writer that waits, gives up,
// and a release that drops its place leave the key's expiry where dsync's
// own places need it, never at the foreign deadline, so the key expires
// and readers get in (before, the waiting writer's script fitted the key's
// expiry to the foreign place, and readers waited for good).
func TestRemoteStateFarForeignWaitingWriterExpires(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		if b.Mini != nil {
			t.Skip("needs TTLs that run down by themselves (real server)")
		}
		name, ctx := redistest.Key(t), context.Background()
		rdb := b.NewClient(t)
		k := rwk(name)
		far := rsMs(rsNow(t, rdb).Add(10 * 365 * 24 * time.Hour))
		must(t, rdb.Do(ctx, "zadd", k.WaitingWriters, far, "foreign-writer").Err())
		expireIn(t, rdb, time.Second, k.WaitingWriters)

		c := newClient(t, b)
		rw := c.RWMutex(name, dsync.TTL(time.Second))
		a := dsync.WithOwner(ctxT(t))
		must(t, rw.Lock(a))
		wctx, cancel := context.WithTimeout(dsync.WithOwner(ctxT(t)), 300*time.Millisecond)
		if err := rw.Lock(wctx); err == nil {
			t.Fatal("a second owner's Lock got the held write lock")
		}
		cancel()
		must(t, rw.Unlock(a))
		if p := rdb.PTTL(ctx, k.WaitingWriters).Val(); p > 2*time.Second {
			t.Errorf("waiting writers key lives %v: its expiry follows the foreign place, not dsync's (1 s TTL)", p)
		}
		deadline := time.Now().Add(10 * time.Second)
		for rdb.Exists(ctx, k.WaitingWriters).Val() == 1 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		rctx, cancel2 := context.WithTimeout(dsync.WithOwner(ctxT(t)), 5*time.Second)
		defer cancel2()
		if err := rw.RLock(rctx); err != nil {
			t.Fatalf("RLock after the foreign key expired: %v", err)
		}
		must(t, rw.RUnlock(rctx))
	})
}

// The same for a reader that dsync did not write (a record in the readers
// hash, a lease deadline ten years off): the readers keys last as long as
// dsync's own readers need them, so a writer gets in once they expire.
func TestRemoteStateFarForeignReaderExpires(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		if b.Mini != nil {
			t.Skip("needs TTLs that run down by themselves (real server)")
		}
		name, ctx := redistest.Key(t), context.Background()
		rdb := b.NewClient(t)
		k := rwk(name)
		far := rsMs(rsNow(t, rdb).Add(10 * 365 * 24 * time.Hour))
		must(t, rdb.Do(ctx, "zadd", k.Readers, far, "foreign-reader").Err())
		must(t, rdb.HSet(ctx, k.ReaderData, "foreign-reader", "1 7 x").Err())
		expireIn(t, rdb, time.Second, k.Readers, k.ReaderData)

		c := newClient(t, b)
		rw := c.RWMutex(name, dsync.TTL(time.Second))
		r1, r2 := dsync.WithOwner(ctxT(t)), dsync.WithOwner(ctxT(t))
		must(t, rw.RLock(r1))
		must(t, rw.RLock(r2))
		must(t, rw.RUnlock(r1))
		for _, key := range []string{k.Readers, k.ReaderData} {
			if p := rdb.PTTL(ctx, key).Val(); p > 2*time.Second {
				t.Errorf("%s lives %v: its expiry follows the foreign reader, not dsync's (1 s TTL)", key, p)
			}
		}
		must(t, rw.RUnlock(r2))
		deadline := time.Now().Add(10 * time.Second)
		for rdb.Exists(ctx, k.Readers).Val() == 1 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		wctx, cancel := context.WithTimeout(dsync.WithOwner(ctxT(t)), 5*time.Second)
		defer cancel()
		if err := rw.Lock(wctx); err != nil {
			t.Fatalf("Lock after the foreign reader's keys expired: %v", err)
		}
		must(t, rw.Unlock(wctx))
	})
}
