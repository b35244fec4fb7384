package dsync_test

import (
	"errors"
	"strings"
	"testing"
	"time"

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
	b := redistest.Miniredis(t)
	for _, k := range ownerReleaseKinds() {
		if k.name == "Semaphore" {
			// A Release of some of the permits whose outcome is unknown
			// counts as done and is not repeated; a Release of all of
			// them ends the holding, which its copies name.
			continue
		}
		t.Run(strings.ReplaceAll(k.name, " ", "-"), func(t *testing.T) {
			ctx := dsync.WithOwner(ctxT(t))
			name := redistest.Key(t)
			f := scriptFaults(k.script)
			rec := &redistest.Recorder{}
			c, rdb := hookedClient(t, b, f, dsync.TTL(10*time.Minute))
			rdb.AddHook(rec)
			take, release := k.handle(c, name)
			// Loaded first: the lost reply is of a release that ran.
			must(t, lua.Script(k.script).Load(ctx, rdb).Err())
			must(t, take(ctx))
			must(t, take(ctx))
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
}
