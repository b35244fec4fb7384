package dsync_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
)

// deadAddr returns a loopback address where nothing listens: connections
// are refused.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// silentAddr returns a loopback address that accepts connections and never
// answers, as a server that hangs or a network that drops every packet.
func silentAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}

// With Redis unreachable, every call that takes a hold returns about when
// its ctx ends, as a plain go-redis call on the same client does: the
// clean-up of a failed attempt may outlive the call, but the call does not
// wait for it (DESIGN, Deadlines). Close then stops that clean-up.
func TestDeadlineWithRedisDown(t *testing.T) {
	const deadline = 300 * time.Millisecond
	// A loaded machine under the race detector may be late by far more
	// than a few ms; the defect this guards against cost seconds.
	const slack = 400 * time.Millisecond
	for _, down := range []struct {
		name string
		opts func(t *testing.T) *redis.Options
	}{
		{"refused", func(t *testing.T) *redis.Options { return &redis.Options{Addr: deadAddr(t)} }},
		{"silent", func(t *testing.T) *redis.Options {
			return &redis.Options{Addr: silentAddr(t), ContextTimeoutEnabled: true}
		}},
	} {
		t.Run(down.name, func(t *testing.T) {
			rdb := redis.NewClient(down.opts(t))
			t.Cleanup(func() { rdb.Close() })
			c := dsync.New(rdb)
			name := "deadline"
			m, rw, s, o := c.Mutex(name), c.RWMutex(name), c.Semaphore(name, 2), c.Once(name)
			calls := []struct {
				name string
				f    func(ctx context.Context) error
			}{
				{"plain GET", func(ctx context.Context) error { return rdb.Get(ctx, "x").Err() }},
				{"Mutex.Lock", m.Lock},
				{"Mutex.TryLock", func(ctx context.Context) error { _, err := m.TryLock(ctx); return err }},
				{"Mutex.Lock with owner", func(ctx context.Context) error { return m.Lock(dsync.WithOwner(ctx)) }},
				{"RWMutex.Lock", rw.Lock},
				{"RWMutex.RLock", rw.RLock},
				{"RWMutex.TryLock", func(ctx context.Context) error { _, err := rw.TryLock(ctx); return err }},
				{"RWMutex.TryRLock", func(ctx context.Context) error { _, err := rw.TryRLock(ctx); return err }},
				{"Semaphore.Acquire", func(ctx context.Context) error { return s.Acquire(ctx, 1) }},
				{"Semaphore.TryAcquire", func(ctx context.Context) error { _, err := s.TryAcquire(ctx, 1); return err }},
				{"Once.Do", func(ctx context.Context) error {
					return o.Do(ctx, func(context.Context) error { return errors.New("f ran with Redis down") })
				}},
			}
			for _, call := range calls {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				start := time.Now()
				err := call.f(ctx)
				took := time.Since(start)
				cancel()
				if err == nil {
					t.Errorf("%s with Redis down returned nil", call.name)
				}
				if took > deadline+slack {
					t.Errorf("%s with a %v deadline returned after %v (%v)", call.name, deadline, took.Round(time.Millisecond), err)
				}
			}
			// Close waits for the clean-ups left to the background; one
			// whose command was sent to a silent server waits for its
			// reply until its own deadline (5 s), as go-redis reads cannot
			// be interrupted.
			start := time.Now()
			c.Close()
			if took := time.Since(start); took > 5*time.Second+slack {
				t.Errorf("Close took %v with clean-ups pending against a dead server", took.Round(time.Millisecond))
			}
		})
	}
}
