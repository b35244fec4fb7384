package dsync_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/internal/redistest"
)

// A name taken thousands of times a second gathers tens of thousands of
// call ids between two prunes of its ids (every 5 s), and one command that
// removes them all holds the server, and so every client of it, for as
// long (50,000: about 14 ms). A script prunes pruneMax old ids at the most;
// the next scripts on the name prune the rest.

// pruneBacklog is the number of old ids the tests put in an ids zset;
// pruneMax is lib.lua's PRUNE_MAX.
const pruneBacklog, pruneMax = 2500, 500

// fillOldIDs adds pruneBacklog ids to the zset key whose replay window
// ended a second ago, and removes its prune marker: the next script that
// notes an id into key prunes. It returns their score, for oldIDs.
func fillOldIDs(t *testing.T, rdb redis.UniversalClient, key string) string {
	t.Helper()
	ctx := context.Background()
	score := rsNow(t, rdb).Add(-time.Second).UnixMilli() * 4
	zs := make([]redis.Z, pruneBacklog)
	for i := range zs {
		zs[i] = redis.Z{Score: float64(score), Member: fmt.Sprintf("old%06d", i)}
	}
	must(t, rdb.ZAdd(ctx, key, zs...).Err())
	must(t, rdb.ZRem(ctx, key, ":p").Err())
	must(t, rdb.PExpire(ctx, key, time.Minute).Err())
	return strconv.FormatInt(score, 10)
}

// oldIDs returns how many of the ids fillOldIDs added with score are
// left in key (the scripts' ids and prune marker score later).
func oldIDs(t *testing.T, rdb redis.UniversalClient, key, score string) int {
	t.Helper()
	n, err := rdb.ZCount(context.Background(), key, "-inf", score).Result()
	must(t, err)
	return int(n)
}

func TestCallIDPruneIsBounded(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, k := range boundKinds() {
			t.Run(k.name, func(t *testing.T) {
				name, ctx := redistest.Key(t), ctxT(t)
				rdb := b.NewClient(t)
				take, release := k.calls(newClient(t, b), name)
				ids := k.idKey(name)
				old := fillOldIDs(t, rdb, ids)
				must(t, take(ctx)) // one script: uncontended
				if n := oldIDs(t, rdb, ids, old); n < pruneBacklog-pruneMax {
					t.Fatalf("one script pruned %d old ids, want %d at most", pruneBacklog-n, pruneMax)
				}
				must(t, release(ctx))
				for i := 0; i < pruneBacklog/pruneMax && oldIDs(t, rdb, ids, old) > 0; i++ {
					must(t, take(ctx))
					must(t, release(ctx))
				}
				if n := oldIDs(t, rdb, ids, old); n != 0 {
					t.Errorf("%d old ids left after %d pairs", n, 1+pruneBacklog/pruneMax)
				}
			})
		}
		t.Run("Once", func(t *testing.T) {
			name, ctx := redistest.Key(t), ctxT(t)
			rdb := b.NewClient(t)
			c := newClient(t, b)
			ids := onceKeys(name).Calls
			old := fillOldIDs(t, rdb, ids)
			// A run: its Do and the release that marks it done.
			must(t, c.Once(name).Do(ctx, func(context.Context) error { return nil }))
			if n := oldIDs(t, rdb, ids, old); n < pruneBacklog-2*pruneMax {
				t.Fatalf("two scripts pruned %d old ids, want %d at most", pruneBacklog-n, 2*pruneMax)
			}
		})
	})
}
