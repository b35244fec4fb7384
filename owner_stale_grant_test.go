package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
)

// ownerLocker is a Mutex, or an RWMutex's write side, as an owner uses it.
type ownerLocker interface {
	Lock(context.Context) error
	TryLock(context.Context) (bool, error)
	Unlock(context.Context) error
	Lease(context.Context) (*dsync.Lease, error)
}

// An owner O's Lock call A is granted a hold F1 that it learns of late
// (its hand-over notification held back, or its attempt's reply); before
// it learns, F1 ends in Redis (the name's keys are deleted, or an Unlock
// of O from another goroutine ends F1's level, as the goroutines of one
// owner share its levels), and another goroutine B of O Locks and takes
// a fresh hold F2. A's grant then arrives. F2 must stay O's live hold, as
// it is in Redis: its Lease not lost, A's Lock returning holding a level
// of what Redis holds, and O's Unlocks ending exactly the levels Redis
// counts, then freeing the name.
func TestOwnerStaleGrantKeepsLaterHold(t *testing.T) {
	for _, kind := range []string{"mutex", "write"} {
		for _, how := range []string{"handover/deleted", "handover/unlocked", "reply/unlocked"} {
			t.Run(kind+"/"+how, func(t *testing.T) { testOwnerStaleGrant(t, kind, how, checkStaleGrant) })
		}
	}
}

// An owner O's Lock call A is granted a hold F1 that it learns of late
// (its attempt's reply held back, or its hand-over notification); before
// it learns, an Unlock of O from another goroutine C ends F1 (O has
// nothing on record in the Client, so the Unlock names no hold and ends a
// level of whatever hold of O it finds), and nobody holds afresh. A's
// grant then arrives. A's call is over, as any call whose hold ended
// before it learned of it (see TestOwnerStaleGrantKeepsLaterHold): it
// takes the lock again, so A's Lock returns with a hold that Redis has,
// live, whose Unlock frees the name; never with F1, which Redis no longer
// has (its Lease lost once renewed, its Unlock ErrLeaseLost). Also when
// the reply C gets is that of a resend of its Unlock (go-redis after a
// read timeout), when A re-entered O's hold F1 in Redis (script
// reentrancy) and two Unlocks end its levels, and in both reentrancy
// modes.
func TestOwnerGrantEndedByOwnUnlock(t *testing.T) {
	for _, kind := range []string{"mutex", "write"} {
		for _, how := range []string{"reply/unlocked", "reply/resent", "reply/reentered", "handover/unlocked"} {
			for _, mode := range reentrancyModes {
				if how == "reply/reentered" && mode.name == "client" {
					continue // a re-entry makes no attempt
				}
				t.Run(kind+"/"+how+"/"+mode.name, func(t *testing.T) {
					testOwnerStaleGrant(t, kind, how, checkEndedGrant, mode.opts...)
				})
			}
		}
	}
}

// A staleCheck checks the outcome of A's grant, which deliver lets
// arrive; f1 is its token (see testOwnerStaleGrant).
type staleCheck func(t *testing.T, h ownerLocker, octx context.Context, aIn <-chan error, redisHold func() (string, string), deliver func(), f1 string)

func testOwnerStaleGrant(t *testing.T, kind, how string, check staleCheck, opts ...dsync.Option) {
	b, ctx, name := realName(t)
	octx := dsync.WithOwner(ctx) // owner O
	pctx := dsync.WithOwner(ctx) // owner P, through another Client
	hk := newOnceHook()
	c, _ := hookedClient(t, b, hk, opts...)
	msgs := newHeldMessages()
	t.Cleanup(msgs.release) // before c's Close
	probes := make(chan string, 16)
	dsync.SetMessageHook(c, func(ch, payload string) {
		if strings.HasPrefix(payload, "probe-") {
			probes <- payload
		}
		msgs.hook(ch, payload)
	})
	qc := newClient(t, b)
	rdb := b.NewClient(t)

	var h, q ownerLocker
	var script, unlockScript, queue, channel, lockKey string
	var keys []string
	if kind == "mutex" {
		h, q = c.Mutex(name), qc.Mutex(name)
		script, queue, channel, keys = "mutex_lock", mutexKeys(name).Queue, mutexKeys(name).Channel(), mutexKeys(name).Keys()
		unlockScript, lockKey = "mutex_unlock", mutexKeys(name).Lock
	} else {
		h, q = c.RWMutex(name), qc.RWMutex(name)
		script, queue, channel, keys = "rwmutex_lock", rwKeys(name).WriterQueue, rwKeys(name).Channel(), rwKeys(name).Keys()
		unlockScript, lockKey = "rwmutex_unlock", rwKeys(name).Writer
	}

	// Load the scripts; subscribe c to the channel (a wait that times out).
	must(t, h.Lock(octx))
	must(t, h.Unlock(octx))
	must(t, q.Lock(pctx))
	wctx, cancel := context.WithTimeout(octx, 200*time.Millisecond)
	mustIs(t, h.Lock(wctx), context.DeadlineExceeded, "warm-up wait: %v")
	cancel()
	dsync.WaitCleanups(c)
	// Every notification of the warm-up is delivered before A's first
	// attempt, so that A has no reason to attempt again before its
	// hand-over (a probe, no release, is not one): the second probe
	// reached the hook, so the first was delivered, and all before it.
	for _, p := range []string{"probe-1", "probe-2"} {
		must(t, rdb.Publish(ctx, channel, p).Err())
		select {
		case got := <-probes:
			if got != p {
				t.Fatalf("probe %q, want %q", got, p)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not received", p)
		}
	}

	// What Redis holds for O: its hold's fencing token and count (under
	// client reentrancy O holds as its token and c's id).
	redisHold := func() (string, string) {
		v, err := rdb.HGetAll(ctx, lockKey).Result()
		must(t, err)
		o := dsync.OwnerToken(octx)
		for k, n := range v {
			if k == o || strings.HasPrefix(k, o+"@") {
				return v[":f"], n
			}
		}
		return "", ""
	}
	if strings.HasPrefix(how, "reply/") {
		must(t, q.Unlock(pctx))
		if how == "reply/reentered" {
			must(t, h.Lock(octx)) // F1, on record in c
		}
		ran, release := hk.holdReply(t, script)
		aIn := async(func() error { return h.Lock(octx) }) // takes (re-enters) F1, its reply held
		ran("A's attempt")
		f1, _ := redisHold()
		if how == "reply/resent" {
			hk.on(unlockScript, func(run func() error) error {
				_ = run()    // the first reply is lost
				return run() // go-redis's resend answers
			})
		}
		if how == "reply/reentered" {
			// F1's level on record in c: Redis keeps A's.
			must(t, h.Unlock(octx))
		}
		// The goroutines of O share its levels: C's Unlock (O has nothing
		// on record in c, so it names no hold) ends F1's level.
		must(t, h.Unlock(octx))
		check(t, h, octx, aIn, redisHold, release, f1)
		return
	}
	aIn := async(func() error { return h.Lock(octx) })
	waitFor(t, 10*time.Second, "A queued", func() bool { return rdb.ZCard(ctx, queue).Val() == 1 })
	msgs.arm()
	must(t, q.Unlock(pctx)) // F1 handed to A, which does not hear of it yet
	f1, _ := redisHold()
	if how == "handover/deleted" {
		must(t, rdb.Del(ctx, keys...).Err())
	} else {
		must(t, h.Unlock(octx)) // C ends F1's level
	}
	check(t, h, octx, aIn, redisHold, msgs.release, f1)
}

// checkStaleGrant has goroutine B of the owner in octx take a fresh hold
// F2 through h, then lets A's grant arrive (deliver) and checks the
// outcome.
func checkStaleGrant(t *testing.T, h ownerLocker, octx context.Context, aIn <-chan error, redisHold func() (string, string), deliver func(), _ string) {
	t.Helper()
	must(t, h.Lock(octx)) // B: F2
	l2, err := h.Lease(octx)
	must(t, err)
	f2 := l2.Token()
	deliver()
	if err := recvErr(t, aIn, "A's Lock"); err != nil {
		t.Errorf("A's Lock = %v, want nil", err)
	}
	if f, n := redisHold(); f != fmt.Sprint(f2) || n != "2" {
		t.Errorf("Redis holds token %q with count %q for O; want F2 = %d with 2 levels (B's, and A's that returned nil)", f, n, f2)
	}
	if err := l2.Err(); err != nil {
		t.Errorf("F2's Lease (B's): Err = %v, want nil (Redis holds F2, and only this process renews it)", err)
	}
	if l, err := h.Lease(octx); err != nil || l.Token() != f2 || l.Err() != nil {
		tok, lerr := uint64(0), error(nil)
		if l != nil {
			tok, lerr = l.Token(), l.Err()
		}
		t.Errorf("O's Lease after A's Lock = token %d (Err %v), %v; want F2 = %d, live", tok, lerr, err, f2)
	}
	// O's levels: B's, and A's (which returned nil); each Unlock ends one
	// in Redis, and the last frees the name.
	other := dsync.WithOwner(context.Background())
	getsIn := func() bool {
		ok, err := h.TryLock(other)
		if err != nil {
			t.Fatalf("another owner's TryLock: %v", err)
		}
		if ok {
			must(t, h.Unlock(other))
		}
		return ok
	}
	for i := 0; i < 2; i++ {
		if getsIn() {
			t.Fatalf("another owner got in while O holds %d of 2 levels", 2-i)
		}
		if err := h.Unlock(octx); err != nil {
			t.Fatalf("O's Unlock %d of 2 = %v, want nil", i+1, err)
		}
	}
	if !getsIn() {
		t.Fatal("not free for another owner after O's last Unlock (a level leaked)")
	}
	if err := h.Unlock(octx); !errors.Is(err, dsync.ErrNotHeld) {
		t.Errorf("a third Unlock of O = %v, want ErrNotHeld", err)
	}
}

// checkEndedGrant lets A's grant of F1 arrive (deliver), nobody holding
// afresh, and checks that A's Lock returns with a hold of its own that
// Redis has (see TestOwnerGrantEndedByOwnUnlock).
func checkEndedGrant(t *testing.T, h ownerLocker, octx context.Context, aIn <-chan error, redisHold func() (string, string), deliver func(), f1 string) {
	t.Helper()
	if f, _ := redisHold(); f != "" {
		t.Fatalf("Redis holds token %q for O after C's Unlock; want nothing (C ended F1 = %s)", f, f1)
	}
	deliver()
	if err := recvErr(t, aIn, "A's Lock"); err != nil {
		t.Fatalf("A's Lock = %v, want nil", err)
	}
	f, n := redisHold()
	if f == "" || f == f1 || n != "1" {
		t.Errorf("Redis holds token %q with count %q for O; want a fresh hold (not F1 = %s, which C's Unlock ended) with 1 level, A's", f, n, f1)
	}
	if l, err := h.Lease(octx); err != nil || fmt.Sprint(l.Token()) != f || l.Err() != nil {
		tok, lerr := uint64(0), error(nil)
		if l != nil {
			tok, lerr = l.Token(), l.Err()
		}
		t.Errorf("O's Lease after A's Lock = token %d (Err %v), %v; want %s, live, as Redis holds it", tok, lerr, err, f)
	}
	other := dsync.WithOwner(context.Background())
	getsIn := func() bool {
		ok, err := h.TryLock(other)
		if err != nil {
			t.Fatalf("another owner's TryLock: %v", err)
		}
		if ok {
			must(t, h.Unlock(other))
		}
		return ok
	}
	if getsIn() {
		t.Error("another owner got in while A holds")
	}
	if err := h.Unlock(octx); err != nil {
		t.Fatalf("O's Unlock of A's level = %v, want nil", err)
	}
	if !getsIn() {
		t.Fatal("not free for another owner after O's Unlock (a level leaked)")
	}
	if err := h.Unlock(octx); !errors.Is(err, dsync.ErrNotHeld) {
		t.Errorf("a second Unlock of O = %v, want ErrNotHeld", err)
	}
}
