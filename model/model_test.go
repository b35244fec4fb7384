package model

import "testing"

var (
	alice = Holder{ID: "alice", Owner: true}
	bob   = Holder{ID: "bob", Owner: true}
	h1    = Holder{ID: "h1"}
)

func TestMutexReentryAndExpiry(t *testing.T) {
	var clk Clock
	m := NewMutex(&clk, 100)
	if ok, f := m.TryLock(alice); !ok || !f {
		t.Fatalf("first TryLock = %v, %v; want true, true", ok, f)
	}
	if ok, f := m.TryLock(alice); !ok || f {
		t.Fatalf("re-entry = %v, %v; want true, false", ok, f)
	}
	if ok, _ := m.TryLock(bob); ok {
		t.Fatal("bob got a held lock")
	}
	if e := m.Unlock(bob); e != NotHeld {
		t.Fatalf("bob Unlock = %v, want NotHeld", e)
	}
	if e := m.Unlock(alice); e != OK {
		t.Fatalf("Unlock = %v", e)
	}
	clk.Advance(100) // the re-entry's lease ends
	if ok, f := m.TryLock(bob); !ok || !f {
		t.Fatal("bob did not get an expired lock")
	}
	if fa, _ := m.Lease(alice); fa != 1 {
		t.Fatalf("alice's fence = %d, want 1", fa)
	}
	if fb, _ := m.Lease(bob); fb != 2 {
		t.Fatalf("bob's fence = %d, want 2", fb)
	}
	if e := m.Unlock(alice); e != LeaseLost {
		t.Fatalf("Unlock of a lost hold = %v, want LeaseLost", e)
	}
	if e := m.Unlock(alice); e != NotHeld {
		t.Fatalf("second Unlock of a lost hold = %v, want NotHeld", e)
	}
}

func TestMutexHandleNotReentrant(t *testing.T) {
	var clk Clock
	m := NewMutex(&clk, 100)
	m.TryLock(h1)
	if ok, _ := m.TryLock(h1); ok {
		t.Fatal("a handle re-entered")
	}
	clk.Advance(99)
	if e := m.Unlock(h1); e != OK {
		t.Fatalf("Unlock at 99 ms = %v", e)
	}
}

func TestRWMutexWriterPreference(t *testing.T) {
	var clk Clock
	rw := NewRWMutex(&clk, 100)
	if !rw.TryRLock(alice) {
		t.Fatal("TryRLock failed")
	}
	if _, _, e := rw.TryLock(alice); e != Upgrade {
		t.Fatalf("upgrade = %v, want Upgrade", e)
	}
	if !rw.Wait(bob) {
		t.Fatal("bob would not wait")
	}
	if !rw.TryRLock(alice) {
		t.Fatal("a reader could not re-enter while a writer waits")
	}
	if rw.TryRLock(h1) {
		t.Fatal("a new reader passed a waiting writer")
	}
	if rw.Grantable(bob) {
		t.Fatal("writer granted while read")
	}
	rw.RUnlock(alice)
	rw.RUnlock(alice)
	if !rw.Grantable(bob) {
		t.Fatal("writer not granted after the last reader left")
	}
	if !rw.TryRLock(bob) {
		t.Fatal("the writer could not downgrade")
	}
	if e := rw.Unlock(bob); e != OK {
		t.Fatalf("Unlock = %v", e)
	}
	if w, r := rw.Writer(); w != "" || r != 1 {
		t.Fatalf("Writer = %q, %d; want \"\", 1", w, r)
	}
}

func TestRWMutexReadersExpireAlone(t *testing.T) {
	var clk Clock
	rw := NewRWMutex(&clk, 100)
	rw.TryRLock(h1)
	clk.Advance(50)
	rw.TryRLock(alice)
	clk.Advance(50)
	if _, r := rw.Writer(); r != 1 {
		t.Fatalf("readers = %d, want 1", r)
	}
	if e := rw.RUnlock(h1); e != LeaseLost {
		t.Fatalf("RUnlock of the expired reader = %v", e)
	}
	if ok, _, _ := rw.TryLock(bob); ok {
		t.Fatal("writer got in past a live reader")
	}
	clk.Advance(50)
	if ok, f, _ := rw.TryLock(bob); !ok || !f {
		t.Fatal("writer did not get in after every reader expired")
	}
}

func TestSemaphore(t *testing.T) {
	var clk Clock
	s := NewSemaphore(&clk, 100, 3)
	if _, _, e := s.TryAcquire(alice, 4); e != Invalid {
		t.Fatalf("n > size = %v", e)
	}
	s.TryAcquire(alice, 2)
	if ok, _, _ := s.TryAcquire(bob, 2); ok {
		t.Fatal("over the size")
	}
	if e := s.Release(alice, 3); e != TooMany {
		t.Fatalf("Release(3) of 2 = %v", e)
	}
	clk.Advance(60)
	if ok, f, _ := s.TryAcquire(alice, 1); !ok || f {
		t.Fatal("adding to a holding")
	}
	clk.Advance(39) // the holding lives until 100: adding kept its deadline
	if s.Used() != 3 {
		t.Fatalf("used = %d, want 3", s.Used())
	}
	clk.Advance(1)
	if s.Used() != 0 {
		t.Fatalf("used after expiry = %d", s.Used())
	}
	if e := s.Release(alice, 1); e != LeaseLost {
		t.Fatalf("Release after expiry = %v", e)
	}
}

// A handle's permits of a lost holding are owed: Releases settle them
// before touching a later holding of the handle.
func TestSemaphoreHandleOwes(t *testing.T) {
	var clk Clock
	s := NewSemaphore(&clk, 100, 3)
	handle := Holder{ID: "handle"}
	s.TryAcquire(handle, 2)
	clk.Advance(100) // lost
	if ok, fresh, _ := s.TryAcquire(handle, 1); !ok || !fresh {
		t.Fatal("a fresh holding after the loss")
	}
	if e := s.Release(handle, 1); e != LeaseLost || s.Held(handle) != 1 {
		t.Fatalf("Release(1) of 2 owed = %v, held %d; want LeaseLost, 1", e, s.Held(handle))
	}
	if e := s.Release(handle, 2); e != LeaseLost || s.Held(handle) != 0 {
		t.Fatalf("Release(2) of 1 owed and 1 held = %v, held %d; want LeaseLost, 0", e, s.Held(handle))
	}
	if e := s.Release(handle, 1); e != NotHeld {
		t.Fatalf("Release with nothing owed or held = %v", e)
	}
	// An owner is one holder across processes: it owes nothing.
	owner := Holder{ID: "owner", Owner: true}
	s.TryAcquire(owner, 1)
	clk.Advance(100)
	s.TryAcquire(owner, 1)
	if e := s.Release(owner, 1); e != OK {
		t.Fatalf("owner's Release after a loss and a fresh holding = %v", e)
	}
}

func TestOnce(t *testing.T) {
	var clk Clock
	o := NewOnce(&clk, 100, 1000)
	if o.Begin("a") != Run || o.End("a", false) != Failed || o.IsDone() {
		t.Fatal("a failing run")
	}
	if o.Begin("b") != Run || o.Begin("c") != Wait {
		t.Fatal("one run at a time")
	}
	clk.Advance(100)
	if o.Begin("c") != Run || o.End("c", true) != OK {
		t.Fatal("take-over after the lease expired")
	}
	if o.End("b", true) != OK || !o.IsDone() {
		t.Fatal("the late run of b, after c made the Once done: Do returns nil (c's value)")
	}
	if o.Begin("e") != Done {
		t.Fatal("not done")
	}
	o.Reset()
	if o.Begin("f") != Run {
		t.Fatal("after a Reset")
	}
	clk.Advance(100)
	if o.Begin("g") != Run {
		t.Fatal("take-over after the lease expired")
	}
	if o.End("f", true) != LeaseLost || o.IsDone() {
		t.Fatal("the late run of f while g runs must not count")
	}
	if o.End("g", true) != OK {
		t.Fatal("g's run")
	}
	if o.Begin("d") != Done {
		t.Fatal("not done")
	}
	clk.Advance(1000)
	if o.IsDone() {
		t.Fatal("done past the period")
	}
	o.Begin("e")
	clk.Advance(100)
	if o.End("e", true) != OK {
		t.Fatal("a success after an unchallenged expiry counts")
	}
}
