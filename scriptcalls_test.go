package dsync_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// Server work per operation: how many redis.call invocations the script of
// each uncontended operation makes, counted by a copy of the script whose
// redis.call goes through a counter (swapped in with dsync.SwapScript). The
// counter adds its total to a key next to the primitive's first key (same
// hash tag), read after each operation. The figures below are what the
// scripts cost now: a change that makes a hot path dearer fails here, one
// that makes it cheaper updates them.

// countingScript returns script name's source with every redis.call
// counted; the total goes to KEYS[1] .. '#calls' when the script returns.
func countingScript(t *testing.T, name string) string {
	t.Helper()
	src, err := dsync.ScriptSource(name)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.ReplaceAll(src, "redis.call(", "counted_call(")
	body = strings.ReplaceAll(body, "redis.pcall(", "counted_pcall(")
	for _, line := range strings.Split(body, "\n") {
		code, _, _ := strings.Cut(line, "--")
		if strings.Contains(code, "redis.call") || strings.Contains(code, "redis.pcall") {
			t.Fatalf("%s calls Redis in a way the counter does not see: %q", name, line)
		}
	}
	return "local calls_made = 0\n" +
		"local function counted_call(...)\n" +
		"  calls_made = calls_made + 1\n" +
		"  return redis.call(...)\n" +
		"end\n" +
		"local function counted_pcall(...)\n" +
		"  calls_made = calls_made + 1\n" +
		"  return redis.pcall(...)\n" +
		"end\n" +
		"local function script_body()\n" +
		body +
		"\nend\n" +
		"local reply = script_body()\n" +
		"redis.call('INCRBY', KEYS[1] .. '#calls', calls_made)\n" +
		"return reply\n"
}

// An operation whose calls are counted: run does it once; key is the first
// key of its primitive (KEYS[1] of its script).
type countedOp struct {
	name string
	key  string
	want int
	run  func(ctx context.Context) error
}

func TestScriptCallsPerUncontendedOperation(t *testing.T) {
	for _, s := range []string{"mutex_lock", "mutex_unlock", "rwmutex_lock", "rwmutex_unlock", "semaphore_acquire", "semaphore_release"} {
		t.Cleanup(dsync.SwapScript(s, countingScript(t, s)))
	}
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := ctxT(t)
			c := newClient(t, b)
			rdb := b.NewClient(t)
			name := redistest.Key(t)
			m, rw, sem := c.Mutex(name), c.RWMutex(name), c.Semaphore(name, 4)
			ops := []countedOp{
				{"Mutex.Lock", mutexKeys(name).Lock, 10, m.Lock},
				{"Mutex.Unlock", mutexKeys(name).Lock, 5, m.Unlock},
				{"RWMutex.Lock", rwk(name).Writer, 12, rw.Lock},
				{"RWMutex.Unlock", rwk(name).Writer, 6, rw.Unlock},
				{"RWMutex.RLock", rwk(name).Writer, 11, rw.RLock},
				{"RWMutex.RUnlock", rwk(name).Writer, 9, rw.RUnlock},
				{"Semaphore.Acquire", semKeys(name).State, 12, func(ctx context.Context) error { return sem.Acquire(ctx, 1) }},
				{"Semaphore.Release", semKeys(name).State, 6, func(ctx context.Context) error { return sem.Release(ctx, 1) }},
			}
			// The first round runs on fresh keys; the figures are those of
			// the rounds after it (the steady state of a name in use). A
			// round may pay once for pruning old call ids: the least count
			// of the rounds is the operation's.
			const rounds = 6
			got := make([]int, len(ops))
			var table strings.Builder
			for r := 0; r < rounds; r++ {
				for i, op := range ops {
					if err := op.run(ctx); err != nil {
						t.Fatalf("round %d: %s: %v", r, op.name, err)
					}
					n, err := rdb.GetDel(ctx, op.key+"#calls").Int()
					if err != nil {
						t.Fatalf("round %d: %s: reading the count: %v", r, op.name, err)
					}
					if r == 1 || (r > 1 && n < got[i]) {
						got[i] = n
					}
				}
			}
			for i, op := range ops {
				fmt.Fprintf(&table, "\n  %-18s %2d redis.call", op.name, got[i])
				if got[i] != op.want {
					t.Errorf("%s makes %d redis.calls, want %d (update the figure if the script got cheaper)", op.name, got[i], op.want)
				}
			}
			t.Logf("redis.calls per uncontended operation:%s", table.String())
		})
	}
}
