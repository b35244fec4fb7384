package renew_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// renewScript is the renewal the tests use: KEYS[1] the lock key, ARGV[1] the
// owner, ARGV[2] the TTL in ms. Replies 1 if extended, 0 if not held.
const renewScript = `if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0`

// renewBatchScript is renewScript for many holds at once (Spec.Batch).
const renewBatchScript = `local out = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out`

// backend is one Redis to test against.
type backend struct {
	name  string
	rdb   *redis.Client // the renewer's client, counted by cnt
	probe *redis.Client // the test's own client, not counted
	cnt   *counter
	stop  func() // makes the server unreachable
}

// eachBackend runs f against miniredis and, when redis-server is on PATH,
// against a real server started for the subtest.
func eachBackend(t *testing.T, parallel bool, f func(t *testing.T, b *backend)) {
	t.Run("miniredis", func(t *testing.T) {
		if parallel {
			t.Parallel()
		}
		f(t, newMiniredis(t))
	})
	t.Run("redis-server", func(t *testing.T) {
		if parallel {
			t.Parallel()
		}
		addr, kill := startRedisServer(t)
		if addr == "" {
			t.Skip("redis-server not on PATH")
		}
		f(t, newBackend(t, "redis-server", addr, kill))
	})
}

func newMiniredis(t *testing.T) *backend {
	mr := miniredis.RunT(t)
	// miniredis expires keys only when told time has passed: keep its TTLs
	// moving with the wall clock.
	stopClock := make(chan struct{})
	clockDone := make(chan struct{})
	go func() {
		defer close(clockDone)
		last := time.Now()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopClock:
				return
			case now := <-tick.C:
				mr.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
	t.Cleanup(func() {
		close(stopClock)
		<-clockDone
	})
	return newBackend(t, "miniredis", mr.Addr(), mr.Close)
}

func newBackend(t testing.TB, name, addr string, stop func()) *backend {
	b := &backend{
		name:  name,
		rdb:   redis.NewClient(&redis.Options{Addr: addr}),
		probe: redis.NewClient(&redis.Options{Addr: addr}),
		cnt:   &counter{},
		stop:  stop,
	}
	b.rdb.AddHook(b.cnt)
	t.Cleanup(func() {
		b.rdb.Close()
		b.probe.Close()
	})
	return b
}

// startRedisServer starts redis-server on a free loopback port and returns
// its address and a function that kills it; the process is also killed at
// cleanup. It returns "" if redis-server is not on PATH.
func startRedisServer(t testing.TB) (string, func()) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil
	}
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no")
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		exited := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(exited)
		}()
		kill := func() {
			_ = cmd.Process.Kill()
			<-exited
		}
		if waitPing(addr, exited, 5*time.Second) {
			t.Cleanup(kill)
			return addr, kill
		}
		kill() // the port was taken meanwhile, or the server is stuck
	}
	t.Fatalf("redis-server did not answer PING")
	return "", nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func waitPing(addr string, exited <-chan struct{}, limit time.Duration) bool {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return false
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// counter is a go-redis hook that counts what the renewer sends.
type counter struct {
	pipes  atomic.Int64              // pipelined round trips of renewals
	evals  atomic.Int64              // EVALSHA commands in them
	loads  atomic.Int64              // SCRIPT LOAD commands
	single atomic.Int64              // commands sent alone, loads included
	other  atomic.Int64              // other pipelines: connection handshakes
	lastOK atomic.Pointer[time.Time] // start of the latest renewal pipeline whose commands all succeeded
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.single.Add(1)
		if args := cmd.Args(); cmd.Name() == "script" && len(args) > 1 && fmt.Sprint(args[1]) == "load" {
			c.loads.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		ok, evals := true, int64(0)
		for _, cmd := range cmds {
			if cmd.Name() == "evalsha" {
				evals++
			}
			if cmd.Err() != nil {
				ok = false
			}
		}
		if evals == 0 {
			c.other.Add(1) // connection handshake (HELLO, CLIENT SETINFO)
			return err
		}
		c.pipes.Add(1)
		c.evals.Add(evals)
		if ok {
			c.lastOK.Store(&start)
		}
		return err
	}
}

// total is every round trip counted so far.
func (c *counter) total() int64 { return c.pipes.Load() + c.single.Load() + c.other.Load() }
