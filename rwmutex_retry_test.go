package dsync_test

import (
	"context"
	"crypto/sha1"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// These tests send a script again after other calls of the same owner ran,
// as go-redis does when it retries a script after a read timeout: the late
// repeat must answer as the first run did and change nothing.

// rwRetryRig is an owner's RWMutex on a client whose scripts are recorded,
// and another owner's handle on the same name.
type rwRetryRig struct {
	ctx   context.Context // with the owner
	name  string
	rdb   redis.UniversalClient
	rec   *redistest.Recorder
	rw    *dsync.RWMutex
	other *dsync.RWMutex
	octx  context.Context // with the other owner
}

func newRWRetryRig(t *testing.T, b redistest.Backend) *rwRetryRig {
	t.Helper()
	name := redistest.Key(t)
	rdb := b.NewClient(t)
	rec := &redistest.Recorder{}
	rdb.AddHook(rec)
	// A long lease keeps renewals out of the way.
	c := dsync.New(rdb, dsync.TTL(time.Minute))
	t.Cleanup(func() { c.Close() })
	return &rwRetryRig{
		ctx:   dsync.WithOwner(ctxT(t)),
		name:  name,
		rdb:   rdb,
		rec:   rec,
		rw:    c.RWMutex(name),
		other: newClient(t, b).RWMutex(name),
		octx:  dsync.WithOwner(ctxT(t)),
	}
}

// record runs call and returns the arguments of the last run of script it
// sent (renewals may be recorded too).
func (r *rwRetryRig) record(t *testing.T, script *redis.Script, call func(context.Context) error) []any {
	t.Helper()
	r.rec.Reset()
	must(t, call(r.ctx))
	all := r.rec.All()
	for i := len(all) - 1; i >= 0; i-- {
		if a := all[i]; len(a) > 1 && rwScriptHash(a) == script.Hash() {
			return a
		}
	}
	t.Fatalf("no run of the script recorded among %d scripts", len(all))
	return nil
}

// rwScriptHash returns the SHA1 of the script an EVALSHA or EVAL runs.
func rwScriptHash(args []any) string {
	s, _ := args[1].(string)
	if args[0] == "eval" {
		return fmt.Sprintf("%x", sha1.Sum([]byte(s)))
	}
	return s
}

// replay sends a recorded script again and returns its reply: for a lock
// script, > 0 for a hold (the fencing token, or a read hold's id), minus
// the ms to wait when refused, 0 for an upgrade refused.
func (r *rwRetryRig) replay(t *testing.T, args []any) int64 {
	t.Helper()
	v, err := r.rdb.Do(context.Background(), args...).Result()
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	switch v := v.(type) {
	case int64:
		return v
	case []any:
		// {code, value}, or a refusal's {0, ms, server time µs}.
		if len(v) == 2 || len(v) == 3 && v[0] == int64(0) {
			code, _ := v[0].(int64)
			n, _ := v[1].(int64)
			switch code {
			case 1, 2:
				return n
			case 0:
				return -n
			case 4:
				return 0
			}
		}
	}
	t.Fatalf("replay: reply %v", v)
	return 0
}

// readHoldID returns the id of the owner's read hold in Redis, 0 if none.
func (r *rwRetryRig) readHoldID(t *testing.T) int64 {
	t.Helper()
	v, _ := r.rdb.HGet(context.Background(), rwk(r.name).ReaderData, dsync.OwnerToken(r.ctx)).Result()
	var n, id int64
	fmt.Sscan(v, &n, &id)
	return id
}

// count returns the owner's reentry count in Redis for mode "r" or "w".
func (r *rwRetryRig) count(t *testing.T, mode string) string {
	t.Helper()
	tok := dsync.OwnerToken(r.ctx)
	if mode == "w" {
		v, _ := r.rdb.HGet(context.Background(), rwk(r.name).Writer, tok).Result()
		return v
	}
	v, _ := r.rdb.HGet(context.Background(), rwk(r.name).ReaderData, tok).Result()
	var n string
	fmt.Sscan(v, &n)
	return n
}

// otherGetsIn reports whether the other owner can take the write lock, and
// leaves it free.
func (r *rwRetryRig) otherGetsIn(t *testing.T) bool {
	t.Helper()
	return writeFree(t, r.octx, r.other)
}

// lockUnlock runs n lock/unlock pairs of the owner in mode.
func (r *rwRetryRig) lockUnlock(t *testing.T, mode string, n int) {
	t.Helper()
	lock, unlock := r.rw.Lock, r.rw.Unlock
	if mode == "r" {
		lock, unlock = r.rw.RLock, r.rw.RUnlock
	}
	for i := 0; i < n; i++ {
		must(t, lock(r.ctx))
		must(t, unlock(r.ctx))
	}
}

// Extra lock/unlock pairs of the same owner between a call and its late
// repeat: none, and 7, which puts the repeated call at the oldest end of the
// 16 call ids a hold remembers.
var rwRetryGaps = []int{0, 7}

// An Unlock or RUnlock whose reply "timed out" is sent again after the
// owner locked once more (and gap more lock/unlock pairs): it answers as
// the first time and lowers no count.
func TestRWMutexLateUnlockRetryAfterReentry(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, mode := range []string{"w", "r"} {
			for _, gap := range rwRetryGaps {
				r := newRWRetryRig(t, b)
				lock, unlock := rwOps(r.rw, mode)
				for i := 0; i < 2; i++ {
					must(t, lock(r.ctx))
				}
				args := r.record(t, lua.Script("rwmutex_unlock"), unlock)
				must(t, lock(r.ctx))
				r.lockUnlock(t, mode, gap)
				if got := r.replay(t, args); got != 2 {
					t.Errorf("%s gap %d: late repeat of the unlock replied %d, want 2 as the first time", mode, gap, got)
				}
				if got := r.count(t, mode); got != "2" {
					t.Errorf("%s gap %d: count after the repeat = %q, want 2", mode, gap, got)
				}
				unlockLevels(t, 2, func() bool { return r.otherGetsIn(t) }, func() error { return unlock(r.ctx) },
					fmt.Sprintf("%s gap %d", mode, gap))
			}
		}
	})
}

// A re-entering Lock or RLock whose reply "timed out" is sent again after
// the owner unlocked once (and gap more lock/unlock pairs): it answers as
// the first time (the fencing token, or the read hold's id) and raises no
// count.
func TestRWMutexLateLockRetryAfterUnlock(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, mode := range []string{"w", "r"} {
			for _, gap := range rwRetryGaps {
				r := newRWRetryRig(t, b)
				lock, unlock := rwOps(r.rw, mode)
				must(t, lock(r.ctx))
				args := r.record(t, lua.Script("rwmutex_lock"), lock)
				var want int64
				if mode == "w" {
					first, err := r.rw.Lease(r.ctx)
					must(t, err)
					want = int64(first.Token())
				}
				must(t, unlock(r.ctx))
				r.lockUnlock(t, mode, gap)
				if mode == "r" {
					want = r.readHoldID(t)
				}
				if got := r.replay(t, args); got != want || got <= 0 {
					t.Errorf("%s gap %d: late repeat of the lock replied %d, want %d (the fencing token, or the read hold's id)", mode, gap, got, want)
				}
				if got := r.count(t, mode); got != "1" {
					t.Errorf("%s gap %d: count after the repeat = %q, want 1", mode, gap, got)
				}
				if r.otherGetsIn(t) {
					t.Fatalf("%s gap %d: another owner took the write lock while the owner holds it", mode, gap)
				}
				must(t, unlock(r.ctx))
				if !r.otherGetsIn(t) {
					t.Fatalf("%s gap %d: hold leaked: write lock not free after the last unlock", mode, gap)
				}
			}
		}
	})
}

// rwKeyCount is the number of keys of an RWMutex script.
const rwKeyCount = 9

// rwLockCallID returns the call id a recorded RWMutex lock script carries.
func rwLockCallID(t *testing.T, args []any) string {
	t.Helper()
	// evalsha, sha, 9, nine keys, mode, token, ttl, call id, ...
	id, ok := args[3+rwKeyCount+3].(string)
	if !ok {
		t.Fatalf("no call id in %v", args)
	}
	return id
}

func TestRWMutexAbandonAfterLaterCall(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, mode := range []string{"w", "r"} {
			r := newRWRetryRig(t, b)
			lock, unlock := r.rw.Lock, r.rw.Unlock
			if mode == "r" {
				lock, unlock = r.rw.RLock, r.rw.RUnlock
			}
			must(t, lock(r.ctx))
			// A re-entering lock call whose caller gave up (its reply was
			// lost), and another call of the same owner before the cleanup.
			args := r.record(t, lua.Script("rwmutex_lock"), lock)
			must(t, lock(r.ctx))
			keys := make([]string, rwKeyCount)
			for i := range keys {
				keys[i] = args[3+i].(string)
			}
			tok := dsync.OwnerToken(r.ctx)
			got, err := lua.Script("rwmutex_unlock").Run(context.Background(), r.rdb, keys, mode, tok, "cleanup-"+mode, keys[0], "", rwLockCallID(t, args), "", 86400000).Int64()
			if err != nil {
				t.Fatal(err)
			}
			if got != 2 {
				t.Errorf("%s: cleanup of the abandoned call replied %d, want 2", mode, got)
			}
			if got := r.count(t, mode); got != "2" {
				t.Errorf("%s: count after the cleanup = %q, want 2", mode, got)
			}
			// The abandoned call arriving late takes no effect.
			if got := r.replay(t, args); got >= 0 {
				t.Errorf("%s: late abandoned lock call replied %d, want < 0", mode, got)
			}
			if got := r.count(t, mode); got != "2" {
				t.Errorf("%s: count after the late arrival = %q, want 2", mode, got)
			}
			// The owner's two successful calls need two unlocks.
			unlockLevels(t, 2, func() bool { return r.otherGetsIn(t) }, func() error { return unlock(r.ctx) }, mode)
			assertRWReleased(t, b, r.name)
		}
	})
}

func TestRWMutexRemembersBoundedCallIDs(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		r := newRWRetryRig(t, b)
		tok := dsync.OwnerToken(r.ctx)
		must(t, r.rw.Lock(r.ctx))
		must(t, r.rw.RLock(r.ctx))
		r.lockUnlock(t, "w", 20)
		r.lockUnlock(t, "r", 20)
		ctx := context.Background()
		ids, err := r.rdb.HGet(ctx, rwk(r.name).Writer, ":c").Result()
		if err != nil {
			t.Fatal(err)
		}
		if n := len(strings.Fields(ids)); n != 16 {
			t.Errorf("writer remembers %d call ids, want 16: %q", n, ids)
		}
		rec, err := r.rdb.HGet(ctx, rwk(r.name).ReaderData, tok).Result()
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(rec); len(f) != 18 || f[0] != "1" {
			t.Errorf("reader record = %q, want a count of 1, the hold id and 16 call ids", rec)
		}
		must(t, r.rw.RUnlock(r.ctx))
		must(t, r.rw.Unlock(r.ctx))
		assertRWReleased(t, b, r.name)
	})
}
