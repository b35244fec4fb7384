package dsync_test

// Property tests: a rapid state machine drives several owners and handles,
// on two Clients sharing one miniredis, through random histories of
// TryLock/Unlock (with re-entry), TryRLock/RUnlock/TryLock/Unlock,
// TryAcquire/Release, Once.Do (succeeding, failing, outliving its lease,
// with a nested Do) and clock advances short of and past the TTL; every
// result, error and lease (fencing token) is compared with package model,
// the specification. A failure shrinks to a minimal history, printed one
// step per line.
//
// Budget: DSYNC_PROPERTY_CHECKS sets the number of random histories per
// property test (default 100, which fits in well under a minute under -race
// on 2 cores); a -rapid.checks flag given on the command line wins. Run them
// longer with, for example,
//
//	DSYNC_PROPERTY_CHECKS=2000 go test -race -run 'TestProperty' .
//
// The clock: miniredis's TIME and TTLs move only with Backend.Advance, and
// the model's clock moves with them. Holds use FixedLease and a TTL of a
// minute, so nothing is renewed on the wall clock and no lease runs out on
// the wall clock during a history; Lease.Err and Lease.Done follow the wall
// clock and are therefore not compared.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/model"
)

const (
	propTTL     = time.Minute
	propTTLms   = int64(propTTL / time.Millisecond)
	propSemSize = 3
)

// propertyBudget sets rapid's number of checks from DSYNC_PROPERTY_CHECKS
// (default 100) unless -rapid.checks was given, and returns it. It also
// makes histories 60 steps long on average unless -rapid.steps was given.
func propertyBudget(t testing.TB) int {
	t.Helper()
	n := 100
	if v := os.Getenv("DSYNC_PROPERTY_CHECKS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("DSYNC_PROPERTY_CHECKS=%q, want a positive integer", v)
		}
	}
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["rapid.steps"] {
		// Histories long enough to expire a hold among live ones.
		must(t, flag.Set("rapid.steps", "60"))
	}
	if given["rapid.checks"] {
		n, _ = strconv.Atoi(flag.Lookup("rapid.checks").Value.String())
		return n
	}
	must(t, flag.Set("rapid.checks", strconv.Itoa(n)))
	return n
}

func TestPropertyHistoriesMatchModel(t *testing.T) {
	propertyBudget(t)
	b := redistest.Miniredis(t)
	rapid.Check(t, func(rt *rapid.T) { runMachine(rt, b, "") })
}

// errF is the error of a failing Once function.
var errF = errors.New("f failed")

// actor is one caller: an owner (reentrant) or a handle without an owner,
// with its handles on the machine's primitives, all on one Client.
type actor struct {
	name   string
	h      model.Holder
	ctx    context.Context
	client int
	m      *dsync.Mutex
	rw     *dsync.RWMutex
	s      *dsync.Semaphore
	o      *dsync.Once
}

type machine struct {
	t      *rapid.T
	b      redistest.Backend
	clk    model.Clock
	actors []*actor
	mm     *model.Mutex
	rwm    *model.RWMutex
	sm     *model.Semaphore
	om     *model.Once
	// Real fencing tokens by model fence, per primitive: fence k of the
	// model is the k-th fresh acquisition and must have a token larger
	// than fence k-1's.
	fences map[string]map[uint64]uint64
	last   map[string]uint64
	step   int
	calls  int
	focus  string // the primitive the history is about, or "all"
	prev   *actor
}

var machineSeq int

// runMachine runs one random history. With focus "" the history is about a
// primitive drawn at random, or all of them; otherwise about focus
// ("mutex", "rwmutex", "semaphore", "once" or "all").
func runMachine(t *rapid.T, b redistest.Backend, focus string) {
	machineSeq++
	ctx := context.Background()
	base := fmt.Sprintf("prop%d:%d", machineSeq, time.Now().UnixNano())
	// Most histories are about one primitive, so that the few steps of a
	// history reach deep states of it; some mix them all.
	if focus == "" {
		focus = rapid.SampledFrom([]string{"mutex", "rwmutex", "semaphore", "once", "all"}).Draw(t, "focus")
	}
	period := rapid.SampledFrom([]int64{0, propTTLms / 2, 3 * propTTLms}).Draw(t, "oncePeriod")
	// TIME stands still from here on except when the machine advances it,
	// so that fencing tokens (at least the server time in µs) must rise by
	// the counter alone.
	b.Advance(0)
	m := &machine{
		t: t, b: b,
		fences: map[string]map[uint64]uint64{"mutex": {}, "rwmutex": {}, "semaphore": {}},
		last:   map[string]uint64{},
		focus:  focus,
	}
	m.mm = model.NewMutex(&m.clk, propTTLms)
	m.rwm = model.NewRWMutex(&m.clk, propTTLms)
	m.sm = model.NewSemaphore(&m.clk, propTTLms, propSemSize)
	m.om = model.NewOnce(&m.clk, propTTLms, period)

	var clients []*dsync.Client
	for i := 0; i < 2; i++ {
		rdb := redis.NewClient(&redis.Options{Addr: b.Addrs[0]})
		c := dsync.New(rdb, dsync.TTL(propTTL), dsync.FixedLease())
		clients = append(clients, c)
		t.Cleanup(func() {
			c.Close()
			_ = rdb.Close()
		})
	}
	var onceOpts []dsync.Option
	if period > 0 {
		onceOpts = append(onceOpts, dsync.Period(time.Duration(period)*time.Millisecond))
	}
	add := func(name string, owner bool, client int) {
		a := &actor{name: name, h: model.Holder{ID: name, Owner: owner}, ctx: ctx, client: client}
		if owner {
			a.ctx = dsync.WithOwner(ctx)
		}
		c := clients[client]
		a.m = c.Mutex(base + ":m")
		a.rw = c.RWMutex(base + ":rw")
		a.s = c.Semaphore(base+":s", propSemSize)
		a.o = c.Once(base+":o", onceOpts...)
		m.actors = append(m.actors, a)
	}
	add("A", true, 0)   // owner on client 0
	add("B", true, 1)   // owner on client 1
	add("h0", false, 0) // handle on client 0
	add("h1", false, 1) // handle on client 1
	t.Logf("history of %s on %s (Once period %d ms, TTL %d ms):", focus, base, period, propTTLms)

	t.Repeat(map[string]func(*rapid.T){
		"":              m.check,
		"Mutex.TryLock": m.mutexTryLock,
		"Mutex.Unlock": m.release("mutex", "Mutex.Unlock", m.mm.Unlock,
			func(ctx context.Context, a *actor) error { return a.m.Unlock(ctx) }),
		"RWMutex.TryRLock": m.rwTryRLock,
		"RWMutex.RUnlock": m.release("rwmutex", "RWMutex.RUnlock", m.rwm.RUnlock,
			func(ctx context.Context, a *actor) error { return a.rw.RUnlock(ctx) }),
		"RWMutex.TryLock": m.rwTryLock,
		"RWMutex.Unlock": m.release("rwmutex", "RWMutex.Unlock", m.rwm.Unlock,
			func(ctx context.Context, a *actor) error { return a.rw.Unlock(ctx) }),
		"Sem.TryAcquire": m.semTryAcquire,
		"Sem.Release":    m.semRelease,
		"Once.Do":        m.onceDo,
		"Once.Reset":     m.onceReset,
		"Advance":        m.advance,
	})
}

func (m *machine) logf(format string, args ...any) {
	m.step++
	m.t.Logf("%3d  t=%6dms  %s", m.step, m.clk.Now(), fmt.Sprintf(format, args...))
}

// on skips the action unless the history is about prim.
func (m *machine) on(t *rapid.T, prim string) {
	if m.focus != "all" && m.focus != prim {
		t.Skip()
	}
}

// actor draws the caller of a step: often the previous one again, so that
// re-entries and releases by the same caller are common.
func (m *machine) actor(t *rapid.T) *actor {
	if m.prev != nil && rapid.Bool().Draw(t, "same") {
		return m.prev
	}
	m.prev = rapid.SampledFrom(m.actors).Draw(t, "actor")
	return m.prev
}

func (m *machine) ctxOf(a *actor) (context.Context, context.CancelFunc) {
	return context.WithTimeout(a.ctx, 10*time.Second)
}

// perform runs one operation of prim for a drawn caller, with a bounded ctx;
// it skips unless the history is about prim.
func (m *machine) perform(t *rapid.T, prim string, op func(ctx context.Context, a *actor)) {
	m.on(t, prim)
	a := m.actor(t)
	ctx, cancel := m.ctxOf(a)
	defer cancel()
	op(ctx, a)
}

// release returns the step that releases prim through call and compares
// the error with the model's outcome.
func (m *machine) release(prim, op string, modelOp func(model.Holder) model.Err, call func(context.Context, *actor) error) func(*rapid.T) {
	return func(t *rapid.T) {
		m.perform(t, prim, func(ctx context.Context, a *actor) {
			err := call(ctx, a)
			want := modelOp(a.h)
			m.logf("%s %s -> %v (model %v)", a.name, op, err, want)
			m.expect(op, err, want)
		})
	}
}

// tried compares a Try call's result and error with the model's and, when
// it acquired (fresh, or any acquisition with always), reads the handle's
// Lease: a fresh acquisition (model fence k) must carry a fencing token
// above every earlier one of prim.
func (m *machine) tried(t *rapid.T, prim, op string, got bool, err error, want, isFresh bool, werr model.Err, always bool, lease func() (uint64, *dsync.Lease, error)) {
	m.expect(op, err, werr)
	m.expectBool(op, got, want)
	if !want || !(isFresh || always) {
		return
	}
	k, l, err := lease()
	if err != nil {
		t.Fatalf("Lease after %s: %v", op, err)
	}
	if isFresh {
		m.fresh(prim, k, l.Token(), op)
	}
}

// expect fails unless err is the outcome want of the model.
func (m *machine) expect(op string, err error, want model.Err) {
	m.t.Helper()
	var ok bool
	switch want {
	case model.OK:
		ok = err == nil
	case model.NotHeld:
		ok = errors.Is(err, dsync.ErrNotHeld) && !errors.Is(err, dsync.ErrInvalid)
	case model.LeaseLost:
		ok = errors.Is(err, dsync.ErrLeaseLost)
	case model.Upgrade:
		ok = errors.Is(err, dsync.ErrUpgrade)
	case model.Invalid:
		ok = errors.Is(err, dsync.ErrInvalid) && !errors.Is(err, dsync.ErrNotHeld)
	case model.TooMany:
		ok = errors.Is(err, dsync.ErrNotHeld) && errors.Is(err, dsync.ErrInvalid)
	case model.Failed:
		ok = errors.Is(err, errF)
	}
	if !ok {
		m.t.Fatalf("%s: got error %v, model says %v", op, err, want)
	}
}

func (m *machine) expectBool(op string, got, want bool) {
	m.t.Helper()
	if got != want {
		m.t.Fatalf("%s: got %v, model says %v", op, got, want)
	}
}

// fresh checks the token of a fresh acquisition (model fence k) against
// every earlier one of the primitive.
func (m *machine) fresh(prim string, k uint64, tok uint64, op string) {
	m.t.Helper()
	if tok <= m.last[prim] {
		m.t.Fatalf("%s: fencing token %d after %d: not increasing", op, tok, m.last[prim])
	}
	m.last[prim] = tok
	m.fences[prim][k] = tok
}

// leaseToken checks a Lease against the model's remembered fence.
func (m *machine) leaseToken(prim, who string, l *dsync.Lease, err error, k uint64, want model.Err) {
	m.t.Helper()
	if want != model.OK {
		m.expect(prim+".Lease("+who+")", err, want)
		return
	}
	if err != nil {
		m.t.Fatalf("%s.Lease(%s): %v, model holds fence %d", prim, who, err, k)
	}
	if tok, ok := m.fences[prim][k]; ok && l.Token() != tok {
		m.t.Fatalf("%s.Lease(%s).Token() = %d, want %d (fence %d)", prim, who, l.Token(), tok, k)
	}
}

// check compares every actor's leases with the model, and Once's mark.
func (m *machine) check(t *rapid.T) {
	for _, a := range m.actors {
		k, want := m.mm.Lease(a.h)
		l, err := a.m.Lease(a.ctx)
		m.leaseToken("mutex", a.name, l, err, k, want)
		k, want = m.rwm.Lease(a.h)
		l, err = a.rw.Lease(a.ctx)
		m.leaseToken("rwmutex", a.name, l, err, k, want)
		k, want = m.sm.Lease(a.h)
		l, err = a.s.Lease(a.ctx)
		m.leaseToken("semaphore", a.name, l, err, k, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done, err := m.actors[0].o.Done(ctx)
	if err != nil {
		t.Fatalf("Once.Done: %v", err)
	}
	m.expectBool("Once.Done", done, m.om.IsDone())
}

func (m *machine) mutexTryLock(t *rapid.T) {
	m.perform(t, "mutex", func(ctx context.Context, a *actor) {
		got, err := a.m.TryLock(ctx)
		want, isFresh := m.mm.TryLock(a.h)
		m.logf("%s Mutex.TryLock -> %v, %v (model %v, fresh %v)", a.name, got, err, want, isFresh)
		// Lease must answer after a re-entry too.
		m.tried(t, "mutex", "Mutex.TryLock", got, err, want, isFresh, model.OK, true, func() (uint64, *dsync.Lease, error) {
			k, _ := m.mm.Lease(a.h)
			l, err := a.m.Lease(a.ctx)
			return k, l, err
		})
	})
}

func (m *machine) rwTryRLock(t *rapid.T) {
	m.perform(t, "rwmutex", func(ctx context.Context, a *actor) {
		got, err := a.rw.TryRLock(ctx)
		want := m.rwm.TryRLock(a.h)
		m.logf("%s RWMutex.TryRLock -> %v, %v (model %v)", a.name, got, err, want)
		m.tried(t, "rwmutex", "RWMutex.TryRLock", got, err, want, false, model.OK, false, nil)
	})
}

func (m *machine) rwTryLock(t *rapid.T) {
	m.perform(t, "rwmutex", func(ctx context.Context, a *actor) {
		got, err := a.rw.TryLock(ctx)
		want, isFresh, werr := m.rwm.TryLock(a.h)
		m.logf("%s RWMutex.TryLock -> %v, %v (model %v, fresh %v, %v)", a.name, got, err, want, isFresh, werr)
		m.tried(t, "rwmutex", "RWMutex.TryLock", got, err, want, isFresh, werr, false, func() (uint64, *dsync.Lease, error) {
			k, _ := m.rwm.Lease(a.h)
			l, err := a.rw.Lease(a.ctx)
			return k, l, err
		})
	})
}

func (m *machine) semTryAcquire(t *rapid.T) {
	m.perform(t, "semaphore", func(ctx context.Context, a *actor) {
		n := rapid.Int64Range(0, propSemSize+1).Draw(t, "n")
		got, err := a.s.TryAcquire(ctx, n)
		want, isFresh, werr := m.sm.TryAcquire(a.h, n)
		m.logf("%s Semaphore.TryAcquire(%d) -> %v, %v (model %v, fresh %v, %v; used %d)", a.name, n, got, err, want, isFresh, werr, m.sm.Used())
		m.tried(t, "semaphore", "Semaphore.TryAcquire", got, err, want, isFresh, werr, false, func() (uint64, *dsync.Lease, error) {
			k, _ := m.sm.Lease(a.h)
			l, err := a.s.Lease(a.ctx)
			return k, l, err
		})
	})
}

func (m *machine) semRelease(t *rapid.T) {
	m.perform(t, "semaphore", func(ctx context.Context, a *actor) {
		n := rapid.Int64Range(0, propSemSize+1).Draw(t, "n")
		err := a.s.Release(ctx, n)
		want := m.sm.Release(a.h, n)
		m.logf("%s Semaphore.Release(%d) -> %v (model %v; used %d)", a.name, n, err, want, m.sm.Used())
		m.expect("Semaphore.Release", err, want)
	})
}

// onceDo runs Once.Do with an f that succeeds or fails, optionally after
// the clock moved (the run may outlive its lease) and after a nested Do by
// another actor (which waits, takes over, or finds the Once done).
func (m *machine) onceDo(t *rapid.T) {
	m.on(t, "once")
	a := m.actor(t)
	ok := rapid.Bool().Draw(t, "ok")
	slow := rapid.SampledFrom([]int64{0, 0, propTTLms / 2, propTTLms}).Draw(t, "inside")
	nested := rapid.Bool().Draw(t, "nested")
	var b *actor
	var okB bool
	if nested {
		b = m.actor(t)
		okB = rapid.Bool().Draw(t, "okNested")
	}
	m.calls++
	tok := fmt.Sprintf("call%d", m.calls)
	state := m.om.Begin(tok)
	m.logf("%s Once.Do begins (model %v; f ok=%v, advance %d ms inside, nested=%v)", a.name, state, ok, slow, nested)
	called := false
	ctx, cancel := m.ctxOf(a)
	defer cancel()
	var inner func()
	err := a.o.Do(ctx, func(context.Context) error {
		called = true
		if slow > 0 {
			m.advanceBy(slow)
		}
		if nested {
			inner = m.nestedDo(b, okB)
		}
		if ok {
			return nil
		}
		return errF
	})
	if inner != nil {
		inner()
	}
	if state != model.Run {
		m.logf("%s Once.Do -> called %v, %v (model: not called, nil)", a.name, called, err)
		m.expectBool("Once.Do called f", called, false)
		m.expect("Once.Do", err, model.OK)
		return
	}
	want := m.om.End(tok, ok)
	m.logf("%s Once.Do -> called %v, %v (model: called, %v)", a.name, called, err, want)
	m.expectBool("Once.Do called f", called, true)
	if want == model.Failed {
		// Whether ErrLeaseLost is joined depends on the wall-clock lease.
		m.expect("Once.Do", err, model.Failed)
		return
	}
	m.expect("Once.Do", err, want)
}

// nestedDo runs b's Do from inside another run's f and returns the checks
// to make once the outer Do returned (rapid's T must not fail inside f).
func (m *machine) nestedDo(b *actor, ok bool) func() {
	m.calls++
	tok := fmt.Sprintf("call%d", m.calls)
	state := m.om.Begin(tok)
	wait := 10 * time.Second
	if state == model.Wait {
		wait = 100 * time.Millisecond // Do waits until its ctx ends
	}
	ctx, cancel := context.WithTimeout(b.ctx, wait)
	defer cancel()
	called := false
	err := b.o.Do(ctx, func(context.Context) error {
		called = true
		if ok {
			return nil
		}
		return errF
	})
	want := model.OK
	if state == model.Run {
		want = m.om.End(tok, ok)
	}
	m.logf("  %s nested Once.Do -> called %v, %v (model %v, then %v)", b.name, called, err, state, want)
	return func() {
		m.expectBool("nested Once.Do called f", called, state == model.Run)
		switch state {
		case model.Wait:
			if !errors.Is(err, context.DeadlineExceeded) {
				m.t.Fatalf("nested Once.Do: got %v, want a deadline error while another call runs f", err)
			}
		default:
			m.expect("nested Once.Do", err, want)
		}
	}
}

func (m *machine) onceReset(t *rapid.T) {
	m.perform(t, "once", func(ctx context.Context, a *actor) {
		err := a.o.Reset(ctx)
		m.om.Reset()
		m.logf("%s Once.Reset -> %v", a.name, err)
		m.expect("Once.Reset", err, model.OK)
	})
}

func (m *machine) advance(t *rapid.T) {
	d := rapid.SampledFrom([]int64{1, propTTLms / 3, propTTLms / 2, propTTLms - 1, propTTLms, propTTLms + 1}).Draw(t, "ms")
	m.advanceBy(d)
}

func (m *machine) advanceBy(d int64) {
	m.b.Advance(time.Duration(d) * time.Millisecond)
	m.clk.Advance(d)
	m.logf("advance %d ms", d)
}
