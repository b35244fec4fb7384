package dsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// queued returns the number of places in name's Mutex queue.
func queued(t *testing.T, b redistest.Backend, name string) int64 {
	t.Helper()
	n, err := b.NewClient(t).ZCard(context.Background(), "dsync:{"+name+"}:q").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitMutexQueued waits, boundedly, until name's Mutex queue has n places.
func waitMutexQueued(t *testing.T, b redistest.Backend, name string, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for queued(t, b, name) != n {
		if time.Now().After(deadline) {
			t.Fatalf("queue has %d places, want %d", queued(t, b, name), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestMutexTryLockTakesNoQueuePlace checks that a TryLock that fails while
// waiters are queued leaves no place behind: a place would later be handed
// the lock with nobody there to use it, blocking the name for a TTL.
func TestMutexTryLockTakesNoQueuePlace(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		holder := newClient(t, b).Mutex(name)
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		waiter := newClient(t, b).Mutex(name)
		got := make(chan error, 1)
		go func() { got <- waiter.Lock(ctx) }()
		waitMutexQueued(t, b, name, 1)

		try := newClient(t, b).Mutex(name)
		if ok, err := try.TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock = %v, %v; want false, nil", ok, err)
		}
		if n := queued(t, b, name); n != 1 {
			t.Fatalf("after a failed TryLock the queue has %d places, want 1", n)
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if err := waiter.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// The name is free now: nothing was handed to the TryLock caller.
		ctx2, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if ok, err := newClient(t, b).Mutex(name).TryLock(ctx2); !ok || err != nil {
			t.Fatalf("TryLock after the queue drained = %v, %v; want true, nil", ok, err)
		}
	})
}

// TestMutexWaiterNotStalledByHandOvers checks that a waiter that found the
// lock held is served in turn even while every release hands the lock on
// to a queued waiter (no plain release ever wakes it): it must not sleep
// until its timer, which with the default 30 s TTL is many seconds.
func TestMutexWaiterNotStalledByHandOvers(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		c := newClient(t, b)
		first := c.Mutex(name)
		if err := first.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		// Late arrives while there is no queue.
		late := newClient(t, b).Mutex(name)
		lateDone := make(chan time.Time, 1)
		go func() {
			if err := late.Lock(ctx); err != nil {
				t.Error(err)
			}
			lateDone <- time.Now()
			_ = late.Unlock(ctx)
		}()
		time.Sleep(20 * time.Millisecond)
		// Others keep the lock busy by hand-over for a while.
		others := make([]*dsync.Mutex, 3)
		for i := range others {
			others[i] = newClient(t, b).Mutex(name)
		}
		stop := time.Now().Add(1500 * time.Millisecond)
		done := make(chan struct{})
		for _, m := range others {
			go func() {
				defer func() { done <- struct{}{} }()
				for time.Now().Before(stop) {
					if err := m.Lock(ctx); err != nil {
						t.Error(err)
						return
					}
					time.Sleep(time.Millisecond)
					if err := m.Unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		time.Sleep(20 * time.Millisecond)
		released := time.Now()
		if err := first.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		var at time.Time
		select {
		case at = <-lateDone:
		case <-time.After(10 * time.Second):
			t.Fatal("the late waiter did not get the lock within 10 s")
		}
		for range others {
			<-done
		}
		// Three other goroutines hold it ~1 ms each, so a turn comes within
		// a few ms; 1 s leaves room for a slow machine.
		if d := at.Sub(released); d > time.Second {
			t.Errorf("the late waiter got the lock %v after the release, want under 1s", d)
		}
	})
}

// TestRWMutexTryLockTakesNoQueuePlace is TestMutexTryLockTakesNoQueuePlace
// for the writers' queue of an RWMutex.
func TestRWMutexTryLockTakesNoQueuePlace(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		rdb := b.NewClient(t)
		places := func() int64 {
			n, err := rdb.ZCard(ctx, "dsync:{"+name+"}:rw:wq").Result()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		holder := newClient(t, b).RWMutex(name)
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		waiter := newClient(t, b).RWMutex(name)
		got := make(chan error, 1)
		go func() { got <- waiter.Lock(ctx) }()
		deadline := time.Now().Add(5 * time.Second)
		for places() != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("writers' queue has %d places, want 1", places())
			}
			time.Sleep(2 * time.Millisecond)
		}
		try := newClient(t, b).RWMutex(name)
		if ok, err := try.TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock = %v, %v; want false, nil", ok, err)
		}
		if n := places(); n != 1 {
			t.Fatalf("after a failed TryLock the writers' queue has %d places, want 1", n)
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if err := waiter.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if ok, err := newClient(t, b).RWMutex(name).TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock after the queue drained = %v, %v; want true, nil", ok, err)
		}
	})
}
