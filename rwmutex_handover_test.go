package dsync_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// RWMutex hand-over: a release hands the lock to the queued writer.

// queueWriter waits until the waiting writer with owner token tok has a
// place in the writers' queue. A writer queues when an attempt finds that
// it has waited past the starvation threshold, so each poll that finds it
// not queued yet sends a release notification, which makes it try again.
func queueWriter(t *testing.T, rdb redis.UniversalClient, name, tok string) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, 5*time.Second, "the writer to queue", func() bool {
		if err := rdb.ZScore(ctx, rwk(name).WriterQueue, tok).Err(); err == nil {
			return true
		}
		if err := rdb.Publish(ctx, rwk(name).Channel(), "").Err(); err != nil {
			t.Error(err)
			return true
		}
		return false
	})
	// Let an attempt that the last notification caused finish.
	time.Sleep(20 * time.Millisecond)
}

// TestRWMutexHandOverMakesWaiterOwner: a release that frees the lock (an
// Unlock, or the last reader's RUnlock) hands it to the queued writer, whose
// Lock then returns holding it without another round trip.
func TestRWMutexHandOverMakesWaiterOwner(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, by := range []string{"Unlock", "RUnlock"} {
			t.Run("by="+by, func(t *testing.T) {
				ctx := ctxT(t)
				name := redistest.Key(t)
				rdb := b.NewClient(t)
				hctx := dsync.WithOwner(ctx)
				holder := newClient(t, b).RWMutex(name)
				lock, unlock := holder.Lock, holder.Unlock
				if by == "RUnlock" {
					lock, unlock = holder.RLock, holder.RUnlock
				}
				must(t, lock(hctx))
				var before uint64
				if l, err := holder.Lease(hctx); err == nil {
					before = l.Token()
				}

				wrdb := b.NewClient(t)
				counter := &redistest.Counter{}
				wrdb.AddHook(counter)
				wc := dsync.New(wrdb)
				defer wc.Close()
				waiter := wc.RWMutex(name)
				wctx := dsync.WithOwner(ctx)
				wtok := dsync.OwnerToken(wctx)
				got := make(chan error, 1)
				go func() { got <- waiter.Lock(wctx) }()
				queueWriter(t, rdb, name, wtok)

				counter.Reset()
				must(t, unlock(hctx))
				select {
				case err := <-got:
					if err != nil {
						t.Fatalf("waiter's Lock: %v", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("the queued writer did not get the lock")
				}
				if n := counter.RoundTrips(); n != 0 {
					t.Errorf("the queued writer took %d round trips after the release, want 0", n)
				}
				l, err := waiter.Lease(wctx)
				if err != nil || l.Err() != nil {
					t.Fatalf("Lease of the handed-over hold = %v, %v; want live", l, err)
				}
				if l.Token() <= before {
					t.Errorf("fencing token of the handed-over hold = %d, want > %d", l.Token(), before)
				}
				h, err := rdb.HGetAll(ctx, rwk(name).Writer).Result()
				if err != nil {
					t.Fatal(err)
				}
				if h[wtok] != "1" || h[":f"] != strconv.FormatUint(l.Token(), 10) {
					t.Errorf("writer hash = %v, want %s holding it once with token %d", h, wtok, l.Token())
				}
				if ok, _ := newClient(t, b).RWMutex(name).TryRLock(ctx); ok {
					t.Fatal("a reader got in beside the handed-over writer")
				}
				must(t, waiter.Unlock(wctx))
				assertRWReleased(t, b, name)
			})
		}
	})
}

func TestRWMutexCancelledQueuedWriterLeavesNothing(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		holder := newClient(t, b).RWMutex(name)
		must(t, holder.Lock(ctx))
		// Two queued writers; the first in line gives up.
		fc := newClient(t, b)
		first := fc.RWMutex(name)
		fctx, cancel := context.WithCancel(dsync.WithOwner(ctx))
		defer cancel()
		ftok := dsync.OwnerToken(fctx)
		fgot := make(chan error, 1)
		go func() { fgot <- first.Lock(fctx) }()
		queueWriter(t, rdb, name, ftok)
		second := newClient(t, b).RWMutex(name)
		sctx := dsync.WithOwner(ctx)
		stok := dsync.OwnerToken(sctx)
		sgot := make(chan error, 1)
		go func() { sgot <- second.Lock(sctx) }()
		queueWriter(t, rdb, name, stok)
		if q, _ := rdb.ZRange(ctx, rwk(name).WriterQueue, 0, -1).Result(); !slices.Equal(q, []string{ftok, stok}) {
			t.Fatalf("queue = %v, want [%s %s]", q, ftok, stok)
		}
		for _, s := range []string{rwk(name).WriterQueue, rwk(name).WriterQueueData, rwk(name).WaitingWriters} {
			if ttl, _ := rdb.PTTL(ctx, s).Result(); ttl <= 0 {
				t.Errorf("%s has no expiry while writers wait (PTTL %v)", s, ttl)
			}
		}

		cancel()
		mustIs(t, <-fgot, context.Canceled, "Lock = %v, want Canceled")
		dsync.WaitCleanups(fc) // the clean-up may outlive the call
		checkIs(t, rdb.ZScore(ctx, rwk(name).WriterQueue, ftok).Err(), redis.Nil, "the cancelled writer's queue place is left: %v")
		checkIs(t, rdb.ZScore(ctx, rwk(name).WaitingWriters, ftok).Err(), redis.Nil, "the cancelled writer's waiting place is left: %v")
		if ok, _ := rdb.HExists(ctx, rwk(name).WriterQueueData, ftok).Result(); ok {
			t.Error("the cancelled writer's queue record is left")
		}
		// The next in line gets the lock from the holder's Unlock.
		must(t, holder.Unlock(ctx))
		recvNil(t, sgot, 5*time.Second, "the second writer did not get the lock")
		must(t, second.Unlock(sctx))
		assertRWReleased(t, b, name)
	})
}

// TestRWMutexAbandonedHandOver: a hold handed to a queued writer whose call
// its caller abandoned (the hand-over raced with its ctx) is released by
// the call's cleanup, and the call arriving late takes nothing.
func TestRWMutexAbandonedHandOver(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		keys := rwk(name).Keys()
		holder := newClient(t, b).RWMutex(name)
		must(t, holder.Lock(ctx))
		// A writer's starving lock call, as its caller sends it.
		const tok, id = "abandoning-writer", "lock-call"
		const secret = "the-call-secret"
		lockArgs := []any{"w", tok, 60000, id, "1", 86400000, "0", "1", secret, boundNow(t, ctx, rdb, 20*time.Second)}
		lockScript := lua.Script("rwmutex_lock")
		if v, err := lockScript.Run(ctx, rdb, keys, lockArgs...).Int64Slice(); err != nil || v[0] != 0 {
			t.Fatalf("lock call = %v, %v; want refused", v, err)
		}
		ps := rdb.Subscribe(ctx, rwk(name).Channel())
		defer ps.Close()
		if _, err := ps.Receive(ctx); err != nil {
			t.Fatal(err)
		}
		must(t, holder.Unlock(ctx))
		select {
		case m := <-ps.Channel():
			// "<call id> <sha1(holder)> <fencing token> <sha1(secret token)>"
			f := strings.Fields(m.Payload)
			if len(f) != 4 || f[0] != id || f[1] != sha1hex(tok) || f[3] != sha1hex(secret+" "+f[2]) {
				t.Fatalf("notification %q, want a proven hand-over to %s's call %s", m.Payload, tok, id)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no hand-over notification")
		}
		if n, _ := rdb.HGet(ctx, keys[0], tok).Result(); n != "1" {
			t.Fatalf("count of the handed-over hold = %q, want 1", n)
		}
		// The caller gave up before it saw the notification: the cleanup
		// releases the hold the call was handed.
		got, err := lua.Script("rwmutex_unlock").Run(ctx, rdb, keys, "w", tok, "cleanup", keys[0], "", id, "", 86400000).Int64()
		if err != nil || got != 1 {
			t.Fatalf("cleanup = %v, %v; want 1 (released)", got, err)
		}
		// The call arriving late (a go-redis retry) takes nothing.
		if v, err := lockScript.Run(ctx, rdb, keys, lockArgs...).Int64Slice(); err != nil || v[0] != 0 {
			t.Fatalf("late lock call = %v, %v; want refused", v, err)
		}
		for _, k := range []string{rwk(name).Writer, rwk(name).WaitingWriters, rwk(name).WriterQueue} {
			if n, _ := rdb.Exists(ctx, k).Result(); n != 0 {
				t.Errorf("%s exists after the late call", k)
			}
		}
		other := newClient(t, b).RWMutex(name)
		if ok, err := other.TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock after the cleanup = %v, %v; want true", ok, err)
		}
		must(t, other.Unlock(ctx))
		assertRWReleased(t, b, name)
	})
}

func sha1hex(s string) string {
	d := sha1.Sum([]byte(s))
	return hex.EncodeToString(d[:])
}
