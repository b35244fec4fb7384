package dsync_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// renewalAfterRelease holds back the reply of the first run of a release
// script after arm, which the server has run, until a renewal of the
// released hold has run on the server after it: the renewal finds the
// hold gone by that release.
type renewalAfterRelease struct {
	release string // the release script's SHA
	renews  []string
	armed   atomic.Bool
	mu      sync.Mutex
	ran     chan struct{} // closed once the release ran (its reply held)
	renewed chan struct{} // closed once a renewal ran after it
	waited  atomic.Bool   // a renewal came before the reply was let go
	// After the renewal, the reply is held until ended is closed (the
	// renewer ended the hold on the renewal's reply), for 300 ms at most,
	// time for the renewer to take in the renewal's reply.
	ended <-chan struct{}
}

func newRenewalAfterRelease(release string, renews ...string) *renewalAfterRelease {
	g := &renewalAfterRelease{release: lua.Script(release).Hash()}
	for _, r := range renews {
		g.renews = append(g.renews, lua.Script(r).Hash())
	}
	return g
}

// arm makes the next run of the release script wait for a renewal.
func (g *renewalAfterRelease) arm() {
	g.mu.Lock()
	g.ran, g.renewed = make(chan struct{}), make(chan struct{})
	g.mu.Unlock()
	g.armed.Store(true)
}

func runsScript(cmd redis.Cmder, sha string) bool {
	a := cmd.Args()
	return cmd.Name() == "evalsha" && len(a) > 1 && a[1] == sha
}

func (g *renewalAfterRelease) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *renewalAfterRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !runsScript(cmd, g.release) || !g.armed.Load() {
			return next(ctx, cmd)
		}
		err := next(ctx, cmd)
		if redis.HasErrorPrefix(err, "NOSCRIPT") || !g.armed.CompareAndSwap(true, false) {
			return err // not run: its EVAL comes next
		}
		g.mu.Lock()
		ran, renewed := g.ran, g.renewed
		g.mu.Unlock()
		close(ran)
		// Bounded: a renewal is due every 50 ms; without one in 10 s the
		// test reports it and goes on.
		select {
		case <-renewed:
			g.waited.Store(true)
		case <-time.After(10 * time.Second):
			return err
		}
		select {
		case <-g.ended:
		case <-time.After(300 * time.Millisecond):
		}
		return err
	}
}

func (g *renewalAfterRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.mu.Lock()
		ran, renewed := g.ran, g.renewed
		g.mu.Unlock()
		after := false
		if ran != nil {
			select {
			case <-ran:
				after = true
			default:
			}
		}
		err := next(ctx, cmds)
		if ran == nil {
			return err
		}
		// Sent before the release ran, a renewal may still have run after
		// it on the server (another connection), and even have its reply
		// before the release's hook learned that the release ran: then
		// it found the hold gone (0 in its reply; nothing else ends the
		// test's only hold), and nothing renews the hold again.
		for _, c := range cmds {
			for _, sha := range g.renews {
				if runsScript(c, sha) && (after || foundGone(c)) {
					g.mu.Lock()
					select {
					case <-renewed:
					default:
						close(renewed)
					}
					g.mu.Unlock()
					return err
				}
			}
		}
		return err
	}
}

// foundGone reports whether c, a renewal, replied that a hold it renews
// was gone (0 for it in the reply).
func foundGone(c redis.Cmder) bool {
	cmd, ok := c.(*redis.Cmd)
	if !ok {
		return false
	}
	v, err := cmd.Int64Slice()
	return err == nil && slices.Contains(v, 0)
}

// A renewal that reaches the server after the release of its hold, and
// finds it gone, ends nothing the release has not: the Lease of a hold
// that Unlock (RUnlock, Release) released reports it released, Err nil,
// as its godoc says, not lost. Each kind of hold, by handle and by owner:
// the release's reply is held back until a renewal ran after it.
func TestRenewalAfterTheReleaseDoesNotMakeTheLeaseLost(t *testing.T) {
	kinds := []struct {
		name, release string
		renews        []string
		kind          holdKind
	}{
		{"Mutex", "mutex_unlock", []string{"mutex_renew"}, mutexHold},
		{"RWMutex.Lock", "rwmutex_unlock", []string{"mutex_renew"}, writeHold},
		{"RWMutex.RLock", "rwmutex_unlock", []string{"rwmutex_rrenew"}, readHold},
		{"Semaphore", "semaphore_release", []string{"semaphore_renew"}, semHold(3, 2)},
	}
	for _, k := range kinds {
		for _, mode := range []string{"handle", "owner", "owner/ClientReentrancy"} {
			t.Run(k.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
					opts := []dsync.Option{dsync.TTL(10 * time.Second), dsync.RenewEvery(50 * time.Millisecond)}
					if mode != "handle" {
						ctx = dsync.WithOwner(ctx)
					}
					if mode == "owner/ClientReentrancy" {
						opts = append(opts, dsync.ClientReentrancy())
					}
					g := newRenewalAfterRelease(k.release, k.renews...)
					c, _ := hookedClient(t, b, g, opts...)
					h := k.kind(c, name)
					l := lockLeaseOf(t, ctx, h, "take")
					// A renewal's reply that ended the lease would close
					// Done before the release's reply came.
					g.ended = l.Done()
					g.arm()
					if err := h.unlock(ctx); err != nil {
						t.Fatalf("release: %v", err)
					}
					if !g.waited.Load() {
						t.Fatal("no renewal ran between the release and its reply")
					}
					select {
					case <-l.Done():
					default:
						t.Fatal("Lease.Done open after the release returned")
					}
					if err := l.Err(); err != nil {
						t.Fatalf("Lease.Err after a release that released the hold: %v, want nil", err)
					}
					// Released indeed: another Client takes it at once.
					if ok, err := k.kind(newClient(t, b), name).try(ctx); err != nil || !ok {
						t.Fatalf("another Client's try after the release: %v, %v", ok, err)
					}
				})
			})
		}
	}
}

// The same for a Once whose f failed: the run's end, which frees the run,
// is followed on the server by a renewal of the run lease; Do returns f's
// error, not a lost lease.
func TestRenewalAfterAFailedRunsEndIsNoLoss(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		g := newRenewalAfterRelease("once_release", "once_renew")
		c, _ := hookedClient(t, b, g, dsync.TTL(10*time.Second), dsync.RenewEvery(50*time.Millisecond))
		o := c.Once(name)
		boom := errors.New("boom")
		err := o.Do(ctx, func(ctx context.Context) error {
			g.arm()
			return boom
		})
		if !g.waited.Load() {
			t.Fatal("no renewal ran between the run's end and its reply")
		}
		if !errors.Is(err, boom) || errors.Is(err, dsync.ErrLeaseLost) {
			t.Fatalf("Do: %v, want f's error and no lost lease", err)
		}
	})
}

// The same for a quorum Mutex: on each master, a member renewal runs after
// the member release, and the quorum Lease reports the hold released.
func TestQuorumRenewalAfterTheReleaseDoesNotMakeTheLeaseLost(t *testing.T) {
	ctx, name := ctxT(t), redistest.Key(t)
	rdbs := miniMasters(t, 3)
	var gs []*renewalAfterRelease
	for _, rdb := range rdbs {
		g := newRenewalAfterRelease("mutex_unlock", "mutex_renew")
		rdb.AddHook(g)
		gs = append(gs, g)
	}
	q := newQuorum(t, rdbs, dsync.TTL(10*time.Second), dsync.RenewEvery(50*time.Millisecond))
	m := q.Mutex(name)
	l := lockLease(t, ctx, m)
	for _, g := range gs {
		g.ended = l.Done()
		g.arm()
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	waited := 0
	for _, g := range gs {
		if g.waited.Load() {
			waited++
		}
	}
	if waited < 2 {
		t.Fatalf("a renewal ran between the release and its reply on %d masters, want a majority", waited)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("Lease.Err after an Unlock that released the hold: %v, want nil", err)
	}
	if ok, err := newQuorum(t, rdbs).Mutex(name).TryLock(ctx); err != nil || !ok {
		t.Fatalf("another Quorum's TryLock after the Unlock: %v, %v", ok, err)
	}
}
