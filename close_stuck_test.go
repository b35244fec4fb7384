package dsync_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// pauseAfter pauses the server (CLIENT PAUSE ms ALL, through admin) right
// after the next run of the script sha got its reply, once armed.
type pauseAfter struct {
	sha   string
	admin *redis.Client
	ms    int64
	armed atomic.Bool
	at    atomic.Int64 // unix ns when the pause began
}

func (p *pauseAfter) after(cmd redis.Cmder) {
	if a := cmd.Args(); cmd.Name() == "evalsha" && len(a) > 1 && a[1] == p.sha && p.armed.CompareAndSwap(true, false) {
		_ = p.admin.Do(context.Background(), "CLIENT", "PAUSE", p.ms, "ALL").Err()
		p.at.Store(time.Now().UnixNano())
	}
}

func (p *pauseAfter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *pauseAfter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		p.after(cmd)
		return err
	}
}

func (p *pauseAfter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			p.after(c)
		}
		return err
	}
}

// A waiter's subscription (the Client's pub/sub connection, dialled after
// its first refused attempt) that the server holds: Close must still return
// within its documented budget ("5 s at most in all for those sent to a
// server that does not answer"), whatever rdb's ReadTimeout.
func TestCloseSubscriptionInFlight(t *testing.T) {
	s := redistest.StartStandalone(t)
	admin := s.Client(t)
	ctx := ctxT(t)
	name := redistest.Key(t)
	holder := dsync.New(s.Client(t))
	t.Cleanup(func() { holder.Close() })
	must(t, holder.Mutex(name).Lock(ctx))

	const pause = 9 * time.Second
	hook := &pauseAfter{sha: lua.Script("mutex_lock").Hash(), admin: admin, ms: pause.Milliseconds()}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: 20 * time.Second})
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(hook)
	c := dsync.New(rdb)
	// Warm up: a pooled connection, the script loaded; no waiter yet.
	warm := c.Mutex(name + "-warm")
	ok, err := warm.TryLock(ctx)
	must(t, err)
	if !ok {
		t.Fatal("warm-up")
	}
	must(t, warm.Unlock(ctx))

	hook.armed.Store(true)
	lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start := time.Now()
	err = c.Mutex(name).Lock(lctx)
	took := time.Since(start)
	cancel()
	mustIs(t, err, context.DeadlineExceeded, "waiting Lock: %v")
	if took > 300*time.Millisecond+time.Second {
		t.Errorf("Lock with a 300ms deadline took %v", took)
	}
	if hook.at.Load() == 0 {
		t.Fatal("the server was not paused")
	}
	cstart := time.Now()
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(pause + 2*time.Second):
	}
	d := time.Since(cstart)
	if d > 5*time.Second+time.Second {
		t.Errorf("Close took %v with a subscription held by the server, want ≤ 5 s", d.Round(time.Millisecond))
	}
	<-done
}

// A Client whose go-redis client the user closed first: every call fails
// at once (nothing can be sent: redis.ErrClosed), and Close returns at once
// (no clean-up can ever get through).
func TestCloseRedisClientClosedFirst(t *testing.T) {
	b, ctx, name := realName(t)
	rdb := b.NewClient(t)
	c := dsync.New(rdb)
	m := c.Mutex(name)
	must(t, m.Lock(ctx))
	must(t, m.Unlock(ctx))
	must(t, rdb.Close())
	kinds := map[string]func(context.Context) error{
		"Mutex.Lock":        m.Lock,
		"RWMutex.RLock":     c.RWMutex(name).RLock,
		"Semaphore.Acquire": func(ctx context.Context) error { return c.Semaphore(name, 2).Acquire(ctx, 1) },
		"Once.Do": func(ctx context.Context) error {
			return c.Once(name).Do(ctx, func(context.Context) error { return nil })
		},
		"Once.Reset": c.Once(name).Reset,
	}
	for kn, call := range kinds {
		start := time.Now()
		err := call(ctx)
		if err == nil {
			t.Errorf("%s on a closed go-redis client: nil", kn)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s on a closed go-redis client took %v (%v)", kn, d.Round(time.Millisecond), err)
		}
	}
	start := time.Now()
	c.Close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d.Round(time.Millisecond))
	}
}
