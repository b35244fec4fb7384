package dsync_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// The stale hand-over of TestStaleHandoverAfterRefusal, across the modes of
// an RWMutex. Reader: a waiting RLock is admitted by a writer's Unlock, but
// its notification is held back; every key of the name is deleted, another
// Client write-locks the name, and the reader's next attempt is refused and
// queued afresh (a waiting reader again, behind that writer). The held
// notification then arrives: the RLock must not return as if it read while
// the writer holds in Redis. Writer: the same with the roles swapped: a
// waiting Lock is handed the write lock, its hand-over is held back, the
// keys are deleted, another Client read-locks the name, the Lock's next
// attempt is refused; the late hand-over must not make it a writer while
// that reader holds in Redis. Asleep (the refused attempt is the call's
// next after the grant) and delayed (sent before the grant, run after the
// deletion), by handle and by owner.
func TestRWMutexStaleGrantAcrossModes(t *testing.T) {
	for _, reader := range []bool{true, false} {
		for _, owned := range []bool{false, true} {
			for _, delayed := range []bool{false, true} {
				t.Run(fmt.Sprintf("reader=%v/owned=%v/delayed=%v", reader, owned, delayed), func(t *testing.T) {
					eachRealName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
						testRWStaleGrant(t, b, ctx, name, reader, owned, delayed)
					})
				})
			}
		}
	}
}

func testRWStaleGrant(t *testing.T, b redistest.Backend, ctx context.Context, name string, reader, owned, delayed bool) {
	const ttl = 3 * time.Second
	k := rwk(name)
	rdb := b.NewClient(t)

	// The waiting call s, in its mode, and the other mode, other.
	sKind, other := readHold, writeHold
	queued := func() int64 { return rdb.HLen(ctx, k.WaitingReaders).Val() }
	if !reader {
		sKind, other = writeHold, readHold
		queued = func() int64 { return rdb.ZCard(ctx, k.WriterQueue).Val() }
	}

	// A writer holds; s waits for it (its notifications, also the plain
	// releases that admit a reader, held once armed).
	w := startStaleWaiter(t, b, ctx, name, "rwmutex_lock", ttl, owned, delayed, sKind, writeHold)
	msgs, gate, s, cctx, o, got := w.msgs, w.gate, w.s, w.cctx, w.o, w.got
	if n := queued(); n != 1 {
		t.Fatalf("%d waiting, want the call", n)
	}
	msgs.arm()
	// Admits the reader, or hands the write lock to the writer; the
	// notification is held.
	must(t, o.unlock(ctx))
	if reader {
		if n := rdb.ZCard(ctx, k.Readers).Val(); n != 1 {
			t.Fatalf("%d readers after the writer's Unlock, want the waiting one admitted", n)
		}
	} else if n := rdb.HLen(ctx, k.Writer).Val(); n == 0 {
		t.Fatal("the write lock was not handed to the waiting writer")
	}
	// Remote state lost: every key of the name deleted.
	must(t, rdb.Unlink(ctx, k.Keys()...).Err())
	o2 := other(newClient(t, b, dsync.TTL(ttl)), name)
	ok, err := o2.try(ctx)
	must(t, err)
	if !ok {
		t.Fatal("another Client could not take the name after the deletion")
	}
	gate.release()
	waitFor(t, 10*time.Second, "the call's next attempt queued it afresh", func() bool { return queued() == 1 })
	msgs.release() // the late notification arrives

	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the call failed: %v", err)
		}
		// Redis truth: who holds now?
		w := rdb.HGetAll(ctx, k.Writer).Val()
		rs := rdb.ZRangeWithScores(ctx, k.Readers, 0, -1).Val()
		l, lerr := s.lease(cctx)
		live := lerr == nil && l.Err() == nil
		t.Errorf("the call returned nil on a stale grant while another Client holds the other mode: writer hash %v, readers %v; the call's lease live=%v (%v)", w, rs, live, lerr)
	case <-time.After(300 * time.Millisecond):
		// Still waiting, as it should: it gets the hold once o2 gives it
		// back.
		if reader && rdb.Exists(ctx, k.Writer).Val() != 1 {
			t.Fatal("o2's write hold is gone")
		}
		if !reader && rdb.ZCard(ctx, k.Readers).Val() != 1 {
			t.Fatal("o2's read hold is gone")
		}
		must(t, o2.unlock(ctx))
		recvNil(t, got, 10*time.Second, "the call did not get the hold after o2's release")
		l, err := s.lease(cctx)
		must(t, err)
		if l.Err() != nil {
			t.Fatalf("the call's lease: %v", l.Err())
		}
		if reader && rdb.ZCard(ctx, k.Readers).Val() != 1 {
			t.Error("the reader holds, but Redis has no reader")
		}
		if !reader && rdb.Exists(ctx, k.Writer).Val() != 1 {
			t.Error("the writer holds, but Redis has no writer")
		}
		must(t, s.unlock(cctx))
	}
}
