package dsync_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
)

// Remote state (see remote_state_test.go) in the fields of a primitive's
// hashes and in its queues.

// Garbage in the fields of a Semaphore's state hash (the permits in use,
// the size in force, a holder's count, fencing token and call ids): on a
// free name (a holder field of nobody's lease), and while a live foreign
// holding is released during the call. The call takes the permits or
// reports ErrCorrupt: it does not take permits the foreign holder holds,
// nor wait for its ctx (a ':used' of "nan" kept every waiter waiting, and
// the state hash alive), nor report another size for a ':size' no
// Semaphore can have.
func TestRemoteStateSemaphoreStateGarbage(t *testing.T) {
	values := []string{"abc", "-5", "1e999", "nan", "1.5", "", "9007199254740993"}
	rsTable(t, func(p *rsPrim) []rsCase {
		if p.name != "Semaphore" {
			return nil
		}
		var cs []rsCase
		for _, f := range []string{":used", ":size", "holder", ":f:holder", ":c:holder"} {
			for _, v := range values {
				cs = rsFreeAndHeld(cs, strings.ReplaceAll(f, ":", "_")+"="+v, "held", rsNil|rsCorrupt, func(e *rsEnv, held bool) {
					ctx := context.Background()
					k := semKeys(e.name).State
					fld := f
					if strings.HasSuffix(f, "holder") {
						who := "ghost"
						if held {
							who = e.foreign
						}
						fld = strings.TrimSuffix(f, "holder") + who
					}
					must(e.t, e.rdb.HSet(ctx, k, fld, v).Err())
					if !held {
						must(e.t, e.rdb.PExpire(ctx, k, dsync.DefaultTTL).Err())
					}
					e.bad = append(e.bad, k)
					e.again = true
				})
			}
		}
		return cs
	})
}

// Garbage in the fields of a Mutex's lock hash or an RWMutex's writer hash
// (the holder's count, the hold's call ids, its flags): while a live
// foreign hold is released during the call, and on a free name, where the
// hash with an expiry holds no hold (no holder, no fencing token). An
// RWMutex waited for such a hash until its ctx ended (until the hash
// expired), where a Mutex takes the name.
func TestRemoteStateLockHashGarbage(t *testing.T) {
	values := []string{"abc", "-5", "1e999", "nan", "1.5", "", "9007199254740993", "0"}
	rsTable(t, func(p *rsPrim) []rsCase {
		var key func(string) string
		switch p.name {
		case "Mutex":
			key = mutexLockKey
		case "RWMutex.Lock", "RWMutex.RLock":
			key = rwWriterKey
		default:
			return nil
		}
		var cs []rsCase
		for _, f := range []string{"holder", ":c", ":w", ":p", ":d", ":k"} {
			for _, v := range values {
				cs = rsFreeAndHeld(cs, strings.ReplaceAll(f, ":", "_")+"="+v, "held", rsNil|rsCorrupt, func(e *rsEnv, held bool) {
					fld := f
					if f == "holder" {
						if !held {
							return
						}
						fld = e.foreign
					}
					ctx := context.Background()
					k := key(e.name)
					must(e.t, e.rdb.HSet(ctx, k, fld, v).Err())
					if !held {
						must(e.t, e.rdb.PExpire(ctx, k, dsync.DefaultTTL).Err())
					}
					e.bad = append(e.bad, k)
					e.again = true
				})
			}
		}
		return cs
	})
}

// A foreign waiter whose queue place lasts far longer than any place dsync
// writes (its deadline ten years ahead, its TTL 30 s), with no expiry on
// its keys: on a free name, and while a live foreign hold is released. The
// call takes the name or reports ErrCorrupt: it does not wait behind that
// place (which every waiter's attempt keeps alive) until its ctx ends, and
// the release does not hand the name to it for its TTL. (Not
// RWMutex.RLock: a reader waits for every waiting writer's place, also one
// without a queue place, which records no TTL to bound it by.)
func TestRemoteStateQueuePlaceTooFar(t *testing.T) {
	far := func(e *rsEnv) string { return rsMs(rsNow(e.t, e.rdb).Add(10 * 365 * 24 * time.Hour)) }
	rsTable(t, func(p *rsPrim) []rsCase {
		var write func(e *rsEnv, tok string) []string
		switch p.name {
		case "Mutex":
			write = func(e *rsEnv, tok string) []string {
				k := mutexKeys(e.name)
				ctx := context.Background()
				must(e.t, e.rdb.ZAdd(ctx, k.Queue, redis.Z{Score: rsUs(rsNow(e.t, e.rdb)), Member: tok}).Err())
				must(e.t, e.rdb.HSet(ctx, k.QueueData, tok, far(e)+" 30000 farcall secret").Err())
				return []string{k.Queue, k.QueueData}
			}
		case "RWMutex.Lock":
			write = func(e *rsEnv, tok string) []string {
				k := rwk(e.name)
				ctx := context.Background()
				must(e.t, e.rdb.Do(ctx, "zadd", k.WaitingWriters, far(e), tok).Err())
				must(e.t, e.rdb.ZAdd(ctx, k.WriterQueue, redis.Z{Score: rsUs(rsNow(e.t, e.rdb)), Member: tok}).Err())
				must(e.t, e.rdb.HSet(ctx, k.WriterQueueData, tok, "30000 farcall secret").Err())
				return []string{k.WaitingWriters, k.WriterQueue, k.WriterQueueData}
			}
		case "Semaphore":
			write = func(e *rsEnv, tok string) []string {
				k := semKeys(e.name)
				ctx := context.Background()
				must(e.t, e.rdb.ZAdd(ctx, k.Queue, redis.Z{Score: rsUs(rsNow(e.t, e.rdb)), Member: "farcall"}).Err())
				must(e.t, e.rdb.HSet(ctx, k.QueueData, "farcall", far(e)+" 30000 2 secret "+tok).Err())
				return []string{k.Queue, k.QueueData}
			}
		default:
			return nil
		}
		return rsFreeAndHeld(nil, "far", "held", rsNil|rsCorrupt, func(e *rsEnv, _ bool) {
			e.bad = append(e.bad, write(e, "waiter-"+rsRandom(e.t))...)
		})
	})
}
