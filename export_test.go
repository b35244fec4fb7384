package dsync

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/internal/renewhook"
	"github.com/dsync-go/dsync/lua"
	"github.com/dsync-go/dsync/renew"
)

// ScriptSource returns the source of the script called name (the file
// name in lua/ without .lua), as the package runs it.
func ScriptSource(name string) (string, error) {
	for _, n := range lua.Names() {
		if n == name {
			return lua.Source(name), nil
		}
	}
	return "", fmt.Errorf("no script %q", name)
}

// SwapScript makes the package run src in place of the script called name
// until restore is called. It is for tests that seed bugs (mutation_test.go)
// and must not run while other tests use the scripts.
func SwapScript(name, src string) (restore func()) {
	s := redis.NewScript(src)
	var w **script
	switch name {
	case "mutex_lock":
		w = &mutexLock
	case "mutex_unlock":
		w = &mutexUnlock
	case "semaphore_acquire":
		w = &semAcquire
	case "semaphore_release":
		w = &semRelease
	case "rwmutex_lock":
		w = &rwLock
	case "rwmutex_unlock":
		w = &rwUnlock
	case "once_do":
		w = &onceDo
	case "once_release":
		w = &onceRelease
	default:
		panic(fmt.Sprintf("SwapScript: unknown script %q", name))
	}
	old := *w
	*w = newScript(s)
	return func() { *w = old }
}

// RenewEvery sets the interval between the renewals of a Client's holds
// (by default a third of the TTL).
func RenewEvery(d time.Duration) Option { return func(cfg *config) { cfg.interval = d } }

// SetRenewStall makes c's renewer call f just before it sends each batch of
// renewals, on the goroutine that sends the batch; nil removes the hook.
// Only c is affected.
func SetRenewStall(c *Client, f func()) { renewhook.SetStall(c.renew, f) }

// SetSemaphoreTook makes c call f, before each Semaphore Acquire or
// TryAcquire of c that succeeds returns, with the call's ctx and the
// fencing token of the holding its permits went into (which the holder's
// Lease may no longer be by the time the call returned, see
// Semaphore.Lease). Set it before c's first call.
func SetSemaphoreTook(c *Client, f func(ctx context.Context, fence uint64)) { c.semTook = f }

// Inbox returns the suffix of c's own channels: a name's channel plus it
// is where hand-overs to c's calls without an owner are published.
func Inbox(c *Client) string { return c.notify.inbox }

// SetMessageHook makes c's notifier call f with each pub/sub message before
// it delivers it, on the goroutine that receives them: f may hold messages
// back. Only c is affected; set it before c's first call.
func SetMessageHook(c *Client, f func(channel, payload string)) {
	g := func(m *redis.Message) { f(m.Channel, m.Payload) }
	c.notify.onMessage.Store(&g)
}

// LeaseDeadline returns the local time before which the server certainly
// still holds l's hold: the time at which l is reported lost unless a
// renewal succeeds first. l must be a lease on one deployment.
func LeaseDeadline(l *Lease) time.Time { return l.h.(*renew.Hold).Deadline() }

// WaitCleanups waits for the clean-ups that failed calls of c (a *Client,
// or a *Quorum: those of its members) left to the background (undoing an
// attempt), and for the releases and commands whose callers' ctx ended
// first, without cancelling them as Close does. No call of c may start
// meanwhile.
func WaitCleanups(c any) {
	wait := func(c *Client) {
		<-c.bg.idle()
		<-c.releases.idle()
		<-c.calls.idle()
	}
	switch c := c.(type) {
	case *Client:
		wait(c)
	case *Quorum:
		<-c.releases.idle()
		for _, m := range c.members {
			wait(m)
		}
	default:
		panic(fmt.Sprintf("WaitCleanups: %T", c))
	}
}

// SetReleaseWaitHook makes the lock calls of owners under client
// reentrancy made through c (a *Client or *Quorum) call f when they start
// waiting for a release of their owner's hold under way; nil removes it.
func SetReleaseWaitHook(c any, f func()) {
	var b *base
	switch c := c.(type) {
	case *Client:
		b = c.shared()
	case *Quorum:
		b = c.shared()
	default:
		panic(fmt.Sprintf("SetReleaseWaitHook: %T", c))
	}
	if f == nil {
		b.onWait.Store(nil)
		return
	}
	b.onWait.Store(&f)
}

// SetCoalescing sets how many script calls of c may be in flight before
// later ones queue, and how long the queue waits for one to return (see
// maxFlight and maxQueueWait), for tests that make batches on purpose.
func SetCoalescing(c *Client, flight int, wait time.Duration) {
	c.batch.mu.Lock()
	c.batch.max, c.batch.wait = flight, wait
	c.batch.mu.Unlock()
}

// Queued returns how many script calls of c wait in its queue.
func Queued(c *Client) int {
	c.batch.mu.Lock()
	defer c.batch.mu.Unlock()
	return len(c.batch.queue)
}

// SetResentAfter sets how long a script call of c must take before c
// counts on go-redis having sent it again (see Client.resentAfter).
func SetResentAfter(c *Client, d time.Duration) { c.resentAfter = d }

// CohortWaiting returns how many Lock calls of c wait in the process for
// the Mutex whose lock hash is key, behind a member of c's cohort of it
// (see cohort.go).
func CohortWaiting(c *Client, key string) int {
	c.cohorts.mu.Lock()
	defer c.cohorts.mu.Unlock()
	if co := c.cohorts.m[key]; co != nil {
		return len(co.waiters)
	}
	return 0
}

// CohortMembers returns how many calls of c are members of its cohort of
// the Mutex whose lock hash is key: they hold it, or try in Redis.
func CohortMembers(c *Client, key string) int {
	c.cohorts.mu.Lock()
	defer c.cohorts.mu.Unlock()
	if co := c.cohorts.m[key]; co != nil {
		return co.members
	}
	return 0
}

// SetAttemptValid sets how long after it was sent an acquiring attempt of
// c may take effect (attemptValid by default; see clock.go).
func SetAttemptValid(c *Client, d time.Duration) { c.clock.valid = d }

// SetClockOffset sets c's estimate of the server's clock to this machine's
// wall clock plus d.
func SetClockOffset(c *Client, d time.Duration) { c.clock.off.Store(d.Milliseconds()) }
