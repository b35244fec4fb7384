//go:build unix

package dsync_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
)

// stoppedReplica is a replica the test can freeze (SIGSTOP of its own
// redis-server, whose PID it asks the server) and thaw again.
type stoppedReplica struct {
	t       *testing.T
	master  redis.UniversalClient
	replica redis.UniversalClient
	pid     int
	stopped bool
}

func newStoppedReplica(t *testing.T) *stoppedReplica {
	t.Helper()
	master, replica := masterWithReplica(t)
	info, err := replica.Info(context.Background(), "server").Result()
	must(t, err)
	m := regexp.MustCompile(`process_id:(\d+)`).FindStringSubmatch(info)
	if m == nil {
		t.Fatalf("no process_id in INFO server")
	}
	pid, _ := strconv.Atoi(m[1])
	r := &stoppedReplica{t: t, master: master, replica: replica, pid: pid}
	t.Cleanup(r.cont)
	return r
}

func (r *stoppedReplica) stop() {
	r.t.Helper()
	must(r.t, syscall.Kill(r.pid, syscall.SIGSTOP))
	r.stopped = true
}

func (r *stoppedReplica) cont() {
	if r.stopped {
		_ = syscall.Kill(r.pid, syscall.SIGCONT)
		r.stopped = false
	}
}

// sync waits until the replica acknowledged every write the master has
// had so far: a write and WAIT on one connection cover every earlier
// write of anyone.
func (r *stoppedReplica) sync(ctx context.Context) {
	r.t.Helper()
	waitFor(r.t, 15*time.Second, "the replica catches up", func() bool {
		var wait *redis.IntCmd
		_, err := r.master.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "hunt:sync", time.Now().UnixNano(), 0)
			wait = redis.NewIntCmd(ctx, "wait", 1, 1000)
			_ = p.Process(ctx, wait)
			return nil
		})
		return err == nil && wait.Val() == 1
	})
}

// lagging reports whether the replica has not acknowledged everything
// the master has (from the master's INFO replication).

// WaitReplicas(n, timeout) waits "for at most timeout". The acquire
// pipeline is EVALSHA + WAIT; when the server lacks the script (a fresh
// master, a promoted replica after a failover, SCRIPT FLUSH), EVALSHA fails
// with NOSCRIPT but the WAIT behind it still blocks for the whole timeout,
// and the pipeline is then sent again with a second full WAIT: with a
// lagging replica the acquire took twice the timeout (4 s for 2 s).
func TestWaitReplicasAfterNoScriptWaitsOnce(t *testing.T) {
	r := newStoppedReplica(t)
	ctx := ctxT(t)
	name := strings.ReplaceAll(t.Name(), "/", "-")
	c := dsync.New(r.master, dsync.WaitReplicas(1, 2*time.Second))
	defer c.Close()
	must(t, r.master.ScriptFlush(ctx).Err())
	r.sync(ctx)
	r.stop()
	start := time.Now()
	err := c.Mutex(name).Lock(ctx)
	el := time.Since(start)
	checkIs(t, err, dsync.ErrNotReplicated, "Lock = %v, want ErrNotReplicated")
	if el > 3900*time.Millisecond { // twice the timeout is 4 s
		t.Errorf("Lock with WaitReplicas(1, 2s) and a stopped replica took %v, want about 2 s", el)
	}
	if n := r.master.Exists(ctx, mutexKeys(name).Lock).Val(); n != 0 {
		t.Errorf("the failed Lock left the lock held on the master")
	}
}
