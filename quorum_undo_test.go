package dsync_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A quorum Lock granted by two masters of three, whose grant on the third
// was taken there but its reply lost, undoes that grant in the background;
// an undo that fails once on the way (a connection reset) is tried again,
// as a single master's is (TestAbandonTriedAgainAfterAFailure; Mutex.Lock:
// "leaves no hold behind, also when the server took the lock but the reply
// was lost"), so the third master holds nothing once the clean-ups are
// over, and nothing after the Unlock.
func TestQuorumStragglerUndoRetried(t *testing.T) {
	_, rdbs := masters(t, 3)
	lockF, undoF := scriptFaults("mutex_lock"), scriptFaults("mutex_unlock")
	rdbs[0].AddHook(lockF)
	rdbs[0].AddHook(undoF)
	q := newQuorum(t, rdbs)
	ctx := ctxT(t)
	octx := dsync.WithOwner(ctx)
	name := redistest.Key(t)
	warm := q.Mutex(name + "-warm")
	must(t, warm.Lock(ctx))
	must(t, warm.Unlock(ctx))

	lockF.DropReplyNext(1, errors.New("i/o timeout"))
	undoF.FailNext(1, errors.New("connection reset"))
	m := q.Mutex(name)
	must(t, m.Lock(octx))
	dsync.WaitCleanups(q)
	if n := undoF.Injected(); n != 1 {
		t.Fatalf("undo faults injected %d, want 1", n)
	}
	key, tok := mutexKeys(name).Lock, dsync.OwnerToken(octx)
	if v := holderField(t, rdbs[0], key, tok); v != "" {
		t.Errorf("master 0 still records the owner's grant (count %s) after the clean-ups: its failed undo was not tried again", v)
	}
	must(t, m.Unlock(octx))
	for i, rdb := range rdbs {
		if v := holderField(t, rdb, key, tok); v != "" {
			pttl, _ := rdb.PTTL(ctx, key).Result()
			t.Errorf("master %d still holds the owner's hold after Unlock (count %s, for %v more)", i, v, pttl.Round(time.Millisecond))
		}
	}
}

// One paused master of three, a free name and a short TTL (195 ms, well
// above the 5 ms a Quorum accepts): a majority grants at once, so TryLock
// must take the name (scaling.md: "A slow or paused master does not hold
// calls back"). Waiting 200 ms for the paused master before judging the
// grant let its validity run out: TryLock reported a free name as held,
// every time. (Now the wait ends at half the validity: the grants of the
// two others may take up to about 190 ms on a loaded machine.)
func TestQuorumShortTTLPausedMaster(t *testing.T) {
	const ttl = 195 * time.Millisecond
	ps, rdbs := pausableMasters(t, 3)
	ctx := ctxT(t)
	name := redistest.Key(t)
	q := newQuorum(t, rdbs, dsync.TTL(ttl))
	m := q.Mutex(name)
	must(t, m.Lock(ctx)) // load the scripts
	must(t, m.Unlock(ctx))
	ps[0].pause(t)
	start := time.Now()
	ok, err := m.TryLock(ctx)
	t.Logf("TryLock = %v, %v after %v", ok, err, time.Since(start))
	if !ok || err != nil {
		t.Fatalf("TryLock of a free name with 2 of 3 masters answering at once = %v, %v; want true", ok, err)
	}
	// The lease may run out before the paused master answers again (the
	// renewals on the two others go on): either outcome is an honest one.
	if err := m.Unlock(ctx); err != nil && !errors.Is(err, dsync.ErrLeaseLost) {
		t.Errorf("Unlock = %v", err)
	}
}

// A quorum TryLock that got no majority (one master of three held by
// another process, the replies of the other two lost after they granted)
// returns without the name, and must leave nothing behind; an undo that
// fails once on each of the two is tried again. Not tried, the two
// orphaned grants, renewed by nobody, held a majority for the whole TTL:
// the name stayed locked by a call that failed, and once the other
// process let go, nobody could take it.
func TestQuorumFailedTryLeavesNoMajority(t *testing.T) {
	_, rdbs := masters(t, 3)
	var lockFs, undoFs []*redistest.Faults
	for _, rdb := range rdbs[:2] {
		lf, uf := scriptFaults("mutex_lock"), scriptFaults("mutex_unlock")
		rdb.AddHook(lf)
		rdb.AddHook(uf)
		lockFs, undoFs = append(lockFs, lf), append(undoFs, uf)
	}
	q := newQuorum(t, rdbs)
	ctx := ctxT(t)
	name := redistest.Key(t)
	warm := q.Mutex(name + "-warm")
	must(t, warm.Lock(ctx))
	must(t, warm.Unlock(ctx))

	// Another process holds master 2 alone.
	c := dsync.New(rdbs[2])
	t.Cleanup(func() { c.Close() })
	blocker := c.Mutex(name)
	must(t, blocker.Lock(ctx))

	for i := range lockFs {
		lockFs[i].DropReplyNext(1, errors.New("i/o timeout"))
		undoFs[i].FailNext(1, errors.New("connection reset"))
	}
	ok, err := q.Mutex(name).TryLock(ctx)
	if ok {
		t.Fatalf("TryLock = %v, %v; want no hold (no master's reply came but master 2's refusal)", ok, err)
	}
	t.Logf("TryLock = %v, %v", ok, err)
	dsync.WaitCleanups(q)
	must(t, blocker.Unlock(ctx))
	other := newQuorum(t, rdbs).Mutex(name)
	if ok, err := other.TryLock(ctx); !ok || err != nil {
		for i, rdb := range rdbs {
			pttl, _ := rdb.PTTL(ctx, mutexKeys(name).Lock).Result()
			t.Logf("master %d: lock key PTTL %v", i, pttl)
		}
		t.Fatalf("another process's TryLock after the failed call's clean-ups = %v, %v; want the name (nothing left behind)", ok, err)
	}
	must(t, other.Unlock(ctx))
}
