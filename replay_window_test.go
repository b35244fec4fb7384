package dsync_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// The replay window runs from the call's return, not from the first run
// of its script: a copy that reaches the server less than 60 s after the
// call returned changes nothing. A release of one of an owner's two
// levels whose reply is lost runs on the server; the owner repeats it 10 s
// later (a release whose outcome is unknown is repeated, under the first
// one's call id) and the repeat returns. A copy of the first send,
// delivered 61 s after the first run (51 s after the call returned), must
// find the call's id and lower nothing: the owner still holds its other
// level, in Redis too (Mutex, RWMutex write and read holds). On
// miniredis, whose clock a test moves.
func TestReleaseCopyWithinTheWindowAfterARepeatChangesNothing(t *testing.T) {
	// A Semaphore's Release of some of the permits whose outcome is
	// unknown counts as done and is not repeated; a Release of all of
	// them ends the holding, which its copies name.
	eachLockRelease(t, func(t *testing.T, b redistest.Backend, k ownerReleaseKind, ctx context.Context, name string) {
		f := scriptFaults(k.script)
		rdb, rec, release := twoLevels(t, b, k, ctx, name, f)
		f.DropReplyNext(1, errors.New("i/o timeout"))
		if err := release(ctx); err == nil {
			t.Fatal("the release whose reply was lost returned nil")
		}
		first := lastRun(t, rec, k.script, " for the first release")
		b.Advance(10 * time.Second)
		// The repeat: the call returns now.
		must(t, release(ctx))
		b.Advance(51 * time.Second)
		if err := rdb.Do(ctx, first...).Err(); err != nil {
			t.Fatalf("the copy of the first release: %v", err)
		}
		if ok, err := k.other(dsync.WithOwner(ctxT(t)), newClient(t, b), name); err != nil || ok {
			t.Fatalf("another Client's try after the copy, 51 s after the release returned = %v, %v; want false (the owner still holds a level)", ok, err)
		}
		must(t, release(ctx))
	})
}

// As above, but the release's reply is late as well as lost: its script
// runs, and its caller learns of no outcome until 5 s later (a read
// timeout), so the call returns 5 s after the run. A copy of that send,
// held back in the network and delivered 61 s after the run (56 s after
// the call returned, within the replay window), must lower nothing: the
// owner, which still counts both levels, holds the name in Redis too. The
// release names its hold, whose count it lowered, so only its bound (20 s
// after it was sent) keeps the copy out once its id is forgotten.
// (Before, a release naming its hold carried no bound: the copy ended the
// owner's last level in Redis and another owner took the name.)
func TestReleaseCopyPastItsIDButWithinTheWindowChangesNothing(t *testing.T) {
	// For a Semaphore: TestLateCopyOfANamedPartialReleasePastItsBoundReleasesNothing.
	eachLockRelease(t, func(t *testing.T, b redistest.Backend, k ownerReleaseKind, ctx context.Context, name string) {
		late := &lateReply{sha: lua.Script(k.script).Hash(), after: func() { b.Advance(5 * time.Second) }}
		rdb, rec, release := twoLevels(t, b, k, ctx, name, late)
		late.armed.Store(true)
		if err := release(ctx); !errors.Is(err, redistest.ErrInjected) {
			t.Fatalf("the release whose reply was lost = %v, want the injected error", err)
		}
		first := lastRun(t, rec, k.script, " for the release")
		b.Advance(56 * time.Second)
		if err := rdb.Do(ctx, first...).Err(); err != nil {
			t.Fatalf("the copy of the release: %v", err)
		}
		if ok, err := k.other(dsync.WithOwner(ctxT(t)), newClient(t, b), name); err != nil || ok {
			t.Fatalf("another Client's try after the copy, 56 s after the release returned = %v, %v; want false (the owner still holds a level)", ok, err)
		}
	})
}

// eachLockRelease runs f, on miniredis (whose clock a test moves), for
// each owner release kind but the Semaphore's (Mutex, RWMutex write and
// read holds), with a ctx that carries an owner and a name of its own.
func eachLockRelease(t *testing.T, f func(t *testing.T, b redistest.Backend, k ownerReleaseKind, ctx context.Context, name string)) {
	b := redistest.Miniredis(t)
	for _, k := range ownerReleaseKinds() {
		if k.name == "Semaphore" {
			continue
		}
		t.Run(strings.ReplaceAll(k.name, " ", "-"), func(t *testing.T) {
			f(t, b, k, dsync.WithOwner(ctxT(t)), redistest.Key(t))
		})
	}
}

// twoLevels has the owner of ctx hold name twice through a handle of kind
// k, on a Client with hook (a lease of 10 minutes: nothing ends the hold
// while a test moves the clock), and returns that Client's go-redis
// client, a recorder of its commands and the handle's release. The
// release script is loaded first, so that a lost reply is of a release
// that ran.
func twoLevels(t *testing.T, b redistest.Backend, k ownerReleaseKind, ctx context.Context, name string, hook redis.Hook) (redis.UniversalClient, *redistest.Recorder, func(context.Context) error) {
	t.Helper()
	rec := &redistest.Recorder{}
	c, rdb := hookedClient(t, b, hook, dsync.TTL(10*time.Minute))
	rdb.AddHook(rec)
	take, release := k.handle(c, name)
	must(t, lua.Script(k.script).Load(ctx, rdb).Err())
	must(t, take(ctx))
	must(t, take(ctx))
	return rdb, rec, release
}

// A lateReply, once armed, lets the next call of one script run on the
// server, then calls after (a test moves the server's clock there) and
// loses the reply: the caller gets redistest.ErrInjected, the script's
// work done.
type lateReply struct {
	sha   string
	after func()
	armed atomic.Bool
}

func (l *lateReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *lateReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if cmd.Name() != "evalsha" || len(a) < 2 || a[1] != l.sha || !l.armed.CompareAndSwap(true, false) {
			return next(ctx, cmd)
		}
		_ = next(ctx, cmd)
		l.after()
		cmd.SetErr(redistest.ErrInjected)
		return redistest.ErrInjected
	}
}

func (l *lateReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
