package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// The behaviours every primitive shares, written once: TestContract runs
// each scenario below over each operation that takes a hold (a row), on
// every backend and, for Mutex and RWMutex, on a Quorum.

// contractPrim is what the scenarios need of a primitive, whatever the
// operation.
type contractPrim struct {
	// handle returns the handle of c (a *dsync.Client, or a *dsync.Quorum
	// where quorum is set) called name, made with opts.
	handle func(c any, name string, opts ...dsync.Option) any
	// quorum: a Quorum has the type too.
	quorum bool
	// hold takes all of handle h, so that every operation on its name
	// waits or is refused; end ends that hold.
	hold func(t *testing.T, ctx context.Context, h any) (end func())
	// free checks that handle h can take all of its name at once (after
	// what), and gives it back.
	free func(t *testing.T, ctx context.Context, h any, after string)
	// clean, if set, checks that name left only expiring bookkeeping.
	clean func(t *testing.T, b redistest.Backend, name string)
	// waiting, if set, returns the number of queued calls on name.
	waiting func(t *testing.T, b redistest.Backend, name string) int64
	// script is the attempt script the operations run; abandoned is its
	// reply code to a late copy of an attempt whose caller abandoned it
	// (replyRefused unless set).
	script    string
	abandoned int64
	// others returns the handle's other calls, which bad input must refuse
	// as well.
	others func(h any) map[string]func(context.Context) error
	// ownerless: the type's calls do not take an owner from ctx.
	ownerless bool
	// nilHandle, if set, is the type's nil handle.
	nilHandle any
	// bad returns further handles that are invalid for this type, of c or
	// of periodc, made with Period(0).
	bad func(c, periodc any) map[string]any
}

// contractOp is a row: one operation that takes a hold.
type contractOp struct {
	name string
	p    *contractPrim
	// try: the operation reports a refusal instead of waiting.
	try bool
	// reentrant: with an owner, a second call adds to the owner's hold.
	reentrant bool
	// call runs the operation on handle h (the i-th caller of a scenario):
	// took reports whether it took a hold (or, for Once, ran f), which undo
	// ends. A refused try returns false and a nil error.
	call func(ctx context.Context, h any, i int) (took bool, undo func(context.Context) error, err error)
	// bad returns calls of c's handles with arguments that are invalid for
	// this operation.
	bad func(c any) map[string]func(context.Context) error
	// mix, if set, is the operation that every other waiter of the cancel
	// scenario calls instead, so that the two kinds of waiter interleave.
	mix *contractOp
}

// errUndo is what the f of a Once row returns: the run fails, so the Once
// stays not done and the next call runs f again, as a released lock is
// taken again.
var errUndo = errors.New("f undoes its run")

// lockMaker is what Client and Quorum share: Mutexes and RWMutexes.
type lockMaker interface {
	Mutex(name string, opts ...dsync.Option) *dsync.Mutex
	RWMutex(name string, opts ...dsync.Option) *dsync.RWMutex
}

// contractEnv is where a scenario runs: a Client on one backend, or a
// Quorum over three miniredis masters.
type contractEnv struct {
	members []redistest.Backend
	quorum  bool
}

// connect returns a new connection to each member, with hooks added.
func (e contractEnv) connect(t *testing.T, hooks ...redis.Hook) []redis.UniversalClient {
	var rdbs []redis.UniversalClient
	for _, b := range e.members {
		rdb := b.NewClient(t)
		for _, h := range hooks {
			rdb.AddHook(h)
		}
		rdbs = append(rdbs, rdb)
	}
	return rdbs
}

// over returns a Client on rdbs[0], or a Quorum over rdbs, made with
// opts and closed at cleanup (nil rdbs: a Client or Quorum of no
// connection).
func (e contractEnv) over(t *testing.T, rdbs []redis.UniversalClient, opts ...dsync.Option) any {
	if e.quorum {
		return newQuorum(t, rdbs, opts...)
	}
	var rdb redis.UniversalClient
	if len(rdbs) > 0 {
		rdb = rdbs[0]
	}
	c := dsync.New(rdb, opts...)
	t.Cleanup(func() { c.Close() })
	return c
}

// client returns a new Client or Quorum, closed at cleanup.
func (e contractEnv) client(t *testing.T) any { return e.over(t, e.connect(t)) }

// faulty returns a new Client or Quorum whose connections drop their next
// reply when drop is called.
func (e contractEnv) faulty(t *testing.T) (c any, drop func()) {
	var fs []*redistest.Faults
	var rdbs []redis.UniversalClient
	for _, b := range e.members {
		rdb, f := b.NewClient(t), &redistest.Faults{}
		rdb.AddHook(f)
		fs, rdbs = append(fs, f), append(rdbs, rdb)
	}
	return e.over(t, rdbs), func() {
		for _, f := range fs {
			f.DropReplyNext(1, context.DeadlineExceeded)
		}
	}
}

// eachEnv runs f where on says: on backends (miniredis only, or
// every backend) and, with quorum, on a Quorum of three miniredis masters.
func eachEnv(t *testing.T, on int, quorum bool, f func(t *testing.T, e contractEnv)) {
	if on == onMiniQuorum {
		t.Run("miniredis", func(t *testing.T) {
			f(t, contractEnv{members: []redistest.Backend{redistest.Miniredis(t)}})
		})
	} else {
		eachBackend(t, func(t *testing.T, b redistest.Backend) {
			f(t, contractEnv{members: []redistest.Backend{b}})
		})
	}
	if on != onBackends && quorum {
		t.Run("quorum", func(t *testing.T) { f(t, quorumEnv(t)) })
	}
}

// quorumEnv returns a Quorum's environment: three miniredis masters.
func quorumEnv(t *testing.T) contractEnv {
	var ms []redistest.Backend
	for range 3 {
		ms = append(ms, redistest.Miniredis(t))
	}
	return contractEnv{members: ms, quorum: true}
}

// holdOn takes all of name through a new Client or Quorum of e; end ends
// that hold.
func (p *contractPrim) holdOn(t *testing.T, ctx context.Context, e contractEnv, name string) (end func()) {
	return p.hold(t, ctx, p.handle(e.client(t), name))
}

// leftNothing checks that a new Client or Quorum of e can take all of name
// at once (after what) and, where the primitive has the check, that name
// left only expiring bookkeeping on each member.
func (p *contractPrim) leftNothing(t *testing.T, ctx context.Context, e contractEnv, name, after string) {
	t.Helper()
	p.free(t, ctx, p.handle(e.client(t), name), after)
	if p.clean != nil {
		for _, b := range e.members {
			p.clean(t, b, name)
		}
	}
}

// holdLocker and freeLocker are the hold and free of Mutex and RWMutex.
func holdLocker(t *testing.T, ctx context.Context, h any) func() {
	l := h.(locker)
	must(t, l.Lock(ctx))
	return func() { must(t, l.Unlock(ctx)) }
}

func freeLocker(t *testing.T, ctx context.Context, h any, after string) {
	t.Helper()
	l := h.(locker)
	if ok, err := l.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock %s = %v, %v; want true", after, ok, err)
	}
	must(t, l.Unlock(ctx))
}

func contractOps() []*contractOp {
	mutex := &contractPrim{
		handle: func(c any, name string, opts ...dsync.Option) any { return c.(lockMaker).Mutex(name, opts...) },
		quorum: true,
		hold:   holdLocker,
		free:   freeLocker,
		clean:  assertNoLockKeys,
		script: "mutex_lock",
		others: func(h any) map[string]func(context.Context) error {
			return map[string]func(context.Context) error{"Unlock": h.(*dsync.Mutex).Unlock}
		},
	}
	rwmutex := &contractPrim{
		handle: func(c any, name string, opts ...dsync.Option) any { return c.(lockMaker).RWMutex(name, opts...) },
		quorum: true,
		hold:   holdLocker,
		free:   freeLocker,
		clean:  assertRWReleased,
		script: "rwmutex_lock",
		others: func(h any) map[string]func(context.Context) error {
			rw := h.(*dsync.RWMutex)
			return map[string]func(context.Context) error{
				"Unlock":  rw.Unlock,
				"RUnlock": rw.RUnlock,
				"RLease":  func(ctx context.Context) error { _, err := rw.RLease(ctx); return err },
			}
		},
		nilHandle: (*dsync.RWMutex)(nil),
		bad: func(c, _ any) map[string]any {
			return map[string]any{"negative MaxHold": c.(lockMaker).RWMutex("x", dsync.MaxHold(-time.Second))}
		},
	}
	const size = 3
	semaphore := &contractPrim{
		handle: func(c any, name string, opts ...dsync.Option) any {
			return c.(*dsync.Client).Semaphore(name, size, opts...)
		},
		hold: func(t *testing.T, ctx context.Context, h any) func() {
			s := h.(*dsync.Semaphore)
			must(t, s.Acquire(ctx, size))
			return func() { must(t, s.Release(ctx, size)) }
		},
		free: func(t *testing.T, ctx context.Context, h any, after string) {
			t.Helper()
			s := h.(*dsync.Semaphore)
			if ok, err := s.TryAcquire(ctx, size); !ok || err != nil {
				t.Fatalf("TryAcquire(%d) %s = %v, %v; want true", size, after, ok, err)
			}
			must(t, s.Release(ctx, size))
		},
		clean: assertNoSemKeys,
		waiting: func(t *testing.T, b redistest.Backend, name string) int64 {
			n, err := b.NewClient(t).ZCard(context.Background(), semKeys(name).Queue).Result()
			must(t, err)
			return n
		},
		script: "semaphore_acquire",
		others: func(h any) map[string]func(context.Context) error {
			s := h.(*dsync.Semaphore)
			return map[string]func(context.Context) error{
				"Release": func(ctx context.Context) error { return s.Release(ctx, 1) },
				"Lease":   func(ctx context.Context) error { _, err := s.Lease(ctx); return err },
			}
		},
		nilHandle: (*dsync.Semaphore)(nil),
		bad: func(c, _ any) map[string]any {
			cl := c.(*dsync.Client)
			return map[string]any{"zero size": cl.Semaphore("x", 0), "negative size": cl.Semaphore("x", -1)}
		},
	}
	once := &contractPrim{
		handle: func(c any, name string, opts ...dsync.Option) any { return c.(*dsync.Client).Once(name, opts...) },
		// A run of f that fails when end is called.
		hold: func(t *testing.T, ctx context.Context, h any) func() {
			started, release := make(chan struct{}), make(chan struct{})
			runner := make(chan error, 1)
			go func() {
				runner <- h.(*dsync.Once).Do(ctx, func(context.Context) error {
					close(started)
					<-release
					return errors.New("failed")
				})
			}()
			<-started
			return func() {
				close(release)
				if err := <-runner; err == nil {
					t.Fatal("runner's Do = nil, want its error")
				}
			}
		},
		// A run lease left behind would make the call wait for its TTL
		// (30 s).
		free: func(t *testing.T, ctx context.Context, h any, after string) {
			t.Helper()
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			ran := false
			err := h.(*dsync.Once).Do(qctx, func(context.Context) error { ran = true; return errUndo })
			if !ran || !errors.Is(err, errUndo) {
				t.Fatalf("Do %s = %v, ran %v; want f's error, true", after, err, ran)
			}
		},
		ownerless: true,
		script:    "once_do",
		abandoned: replyOver,
		others: func(h any) map[string]func(context.Context) error {
			o := h.(*dsync.Once)
			return map[string]func(context.Context) error{
				"DoValue": func(ctx context.Context) error {
					_, err := o.DoValue(ctx, func(context.Context) ([]byte, error) { return nil, errors.New("f ran") })
					return err
				},
				"Done":  func(ctx context.Context) error { _, err := o.Done(ctx); return err },
				"Reset": o.Reset,
			}
		},
		nilHandle: (*dsync.Once)(nil),
		bad: func(c, periodc any) map[string]any {
			cl := c.(*dsync.Client)
			return map[string]any{
				"bad client option (Period)": periodc.(*dsync.Client).Once("x"),
				"zero period":                cl.Once("x", dsync.Period(0)),
				"negative period":            cl.Once("x", dsync.Period(-time.Second)),
			}
		},
	}

	mutexLock := &contractOp{name: "Mutex.Lock", p: mutex, reentrant: true,
		call: func(ctx context.Context, h any, _ int) (bool, func(context.Context) error, error) {
			m := h.(*dsync.Mutex)
			err := m.Lock(ctx)
			return err == nil, m.Unlock, err
		}}
	mutexTry := &contractOp{name: "Mutex.TryLock", p: mutex, try: true, reentrant: true,
		call: func(ctx context.Context, h any, _ int) (bool, func(context.Context) error, error) {
			m := h.(*dsync.Mutex)
			ok, err := m.TryLock(ctx)
			return ok, m.Unlock, err
		}}
	rwOp := func(op string) *contractOp {
		return &contractOp{name: "RWMutex." + op, p: rwmutex, try: op[0] == 'T', reentrant: true,
			call: func(ctx context.Context, h any, _ int) (bool, func(context.Context) error, error) {
				rw := h.(*dsync.RWMutex)
				switch op {
				case "Lock":
					err := rw.Lock(ctx)
					return err == nil, rw.Unlock, err
				case "RLock":
					err := rw.RLock(ctx)
					return err == nil, rw.RUnlock, err
				case "TryLock":
					ok, err := rw.TryLock(ctx)
					return ok, rw.Unlock, err
				}
				ok, err := rw.TryRLock(ctx)
				return ok, rw.RUnlock, err
			}}
	}
	rwLock, rwRLock, rwTry, rwTryR := rwOp("Lock"), rwOp("RLock"), rwOp("TryLock"), rwOp("TryRLock")
	rwLock.mix, rwRLock.mix = rwRLock, rwLock
	// semBad returns the calls of c's Semaphores with counts that are
	// invalid whatever the state: acquire is Acquire or TryAcquire.
	semBad := func(acquire func(s *dsync.Semaphore, ctx context.Context, n int64) error) func(c any) map[string]func(context.Context) error {
		return func(c any) map[string]func(context.Context) error {
			calls := map[string]func(context.Context) error{}
			for what, n := range map[string]int64{"zero n": 0, "negative n": -2, "n over size": 4} {
				s := c.(*dsync.Client).Semaphore("x", 3)
				calls[what] = func(ctx context.Context) error { return acquire(s, ctx, n) }
				calls[what+" (Release)"] = func(ctx context.Context) error { return s.Release(ctx, n) }
			}
			return calls
		}
	}
	// The i-th caller asks for 1 to 3 permits.
	semAcquire := &contractOp{name: "Semaphore.Acquire", p: semaphore, reentrant: true,
		call: func(ctx context.Context, h any, i int) (bool, func(context.Context) error, error) {
			s, n := h.(*dsync.Semaphore), int64(1+i%3)
			err := s.Acquire(ctx, n)
			return err == nil, func(ctx context.Context) error { return s.Release(ctx, n) }, err
		},
		bad: semBad(func(s *dsync.Semaphore, ctx context.Context, n int64) error { return s.Acquire(ctx, n) })}
	semTry := &contractOp{name: "Semaphore.TryAcquire", p: semaphore, try: true, reentrant: true,
		call: func(ctx context.Context, h any, i int) (bool, func(context.Context) error, error) {
			s, n := h.(*dsync.Semaphore), int64(1+i%3)
			ok, err := s.TryAcquire(ctx, n)
			return ok, func(ctx context.Context) error { return s.Release(ctx, n) }, err
		},
		bad: semBad(func(s *dsync.Semaphore, ctx context.Context, n int64) error {
			_, err := s.TryAcquire(ctx, n)
			return err
		})}
	// A Once's hold is its run of f: f runs and fails, which ends it.
	onceDo := &contractOp{name: "Once.Do", p: once,
		call: func(ctx context.Context, h any, _ int) (bool, func(context.Context) error, error) {
			ran := false
			err := h.(*dsync.Once).Do(ctx, func(context.Context) error { ran = true; return errUndo })
			if ran && errors.Is(err, errUndo) {
				err = nil
			}
			return ran, func(context.Context) error { return nil }, err
		},
		bad: func(c any) map[string]func(context.Context) error {
			o := c.(*dsync.Client).Once("x")
			return map[string]func(context.Context) error{
				"nil f": func(ctx context.Context) error { return o.Do(ctx, nil) },
				"nil f (DoValue)": func(ctx context.Context) error {
					_, err := o.DoValue(ctx, nil)
					return err
				},
			}
		}}
	return []*contractOp{mutexLock, mutexTry, rwLock, rwRLock, rwTry, rwTryR, semAcquire, semTry, onceDo}
}

// Where a scenario runs.
const (
	onBackends       = iota // every backend
	onBackendsQuorum        // every backend, and a Quorum where the type has one
	onMiniQuorum            // miniredis, and a Quorum where the type has one
)

func TestContract(t *testing.T) {
	scenarios := []struct {
		name  string
		waits bool // only for operations that wait
		on    int
		// run gets a context bounding the test's calls and a unique name.
		run func(t *testing.T, op *contractOp, e contractEnv, ctx context.Context, name string)
	}{
		{"cancel leaves nothing", true, onBackendsQuorum, contractCancel},
		{"lost reply leaves nothing", false, onBackendsQuorum, contractLostReply},
		{"lost reply while queued leaves nothing", true, onBackendsQuorum, contractLostReplyQueued},
		{"late copy takes nothing", false, onBackendsQuorum, contractLateCopy},
		{"abandoned call stays abandoned", false, onBackendsQuorum, contractAbandoned},
		{"bad input", false, onMiniQuorum, contractBadInput},
		{"closed client", false, onMiniQuorum, contractClosedClient},
	}
	for _, op := range contractOps() {
		t.Run(op.name, func(t *testing.T) {
			for _, sc := range scenarios {
				if sc.waits && op.try {
					continue // a try neither waits nor queues
				}
				t.Run(sc.name, func(t *testing.T) {
					eachEnv(t, sc.on, op.p.quorum, func(t *testing.T, e contractEnv) { sc.run(t, op, e, ctxT(t), redistest.Key(t)) })
				})
			}
		})
	}
}

// Waiters give up (their deadlines end) while the hold they wait for is
// released: hand-overs race with cancellations. What is left is nothing.
func contractCancel(t *testing.T, op *contractOp, e contractEnv, ctx context.Context, name string) {
	end := op.p.holdOn(t, ctx, e, name)
	cancelRace(t, op, e.client(t), ctx, name, 16, end, func(i int, wctx context.Context) context.Context {
		if i%3 == 0 {
			return dsync.WithOwner(wctx)
		}
		return wctx
	})
	op.p.leftNothing(t, ctx, e, name, "after every waiter gave up")
}

// cancelRace starts n calls of op (every other one op.mix, if any) through
// c (a Client or a quorum's), each on the ctx that ctxOf makes of a short deadline's, ends the hold
// they wait for (end) while they wait, and waits for them and for c's
// clean-ups. A call that gave up took nothing; one that won the race
// with its deadline gives its hold back. With a shared owner, an RLock
// of the owner turns its Lock into a refused upgrade (ErrUpgrade).
func cancelRace(t *testing.T, op *contractOp, c any, ctx context.Context, name string, n int, end func(), ctxOf func(i int, wctx context.Context) context.Context) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, time.Duration(1+rand.IntN(40))*time.Millisecond)
			defer cancel()
			wctx = ctxOf(i, wctx)
			o := op
			if i%2 == 1 && op.mix != nil {
				o = op.mix
			}
			took, undo, err := o.call(wctx, op.p.handle(c, name), i)
			if err != nil && took {
				t.Errorf("%s gave up (%v) but took a hold (ran f)", o.name, err)
			}
			if err != nil {
				if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, dsync.ErrUpgrade) {
					t.Errorf("%s = %v, want DeadlineExceeded", o.name, err)
				}
				return
			}
			if !took {
				t.Errorf("%s returned nil but took nothing", o.name)
				return
			}
			// It won the race with its deadline: a hold like any other.
			if err := undo(wctx); err != nil && !endedDuring(wctx, err) {
				t.Errorf("undo %s: %v", o.name, err)
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	end()
	wg.Wait()
	// A clean-up still running when its call returned finishes in the
	// background (DESIGN: Deadlines); what must be left is nothing.
	dsync.WaitCleanups(c)
}

// The server runs the attempt, its reply is lost: the caller sees the
// error, and what the attempt took is given back, not leaked until the TTL.
func contractLostReply(t *testing.T, op *contractOp, e contractEnv, ctx context.Context, name string) {
	p := op.p
	c, drop := e.faulty(t)
	for _, owned := range []bool{false, true} {
		lctx := ctx
		if owned {
			lctx = dsync.WithOwner(ctx)
		}
		drop()
		took, _, err := op.call(lctx, p.handle(c, name), 0)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("owned=%v: %s = %v, want the injected error", owned, op.name, err)
		}
		if took {
			t.Errorf("owned=%v: %s took a hold (ran f) after a lost reply", owned, op.name)
		}
		p.leftNothing(t, ctx, e, name, "after a lost reply")
	}
}

// An attempt that queued, its reply lost: its place is dropped.
func contractLostReplyQueued(t *testing.T, op *contractOp, e contractEnv, ctx context.Context, name string) {
	p := op.p
	end := p.holdOn(t, ctx, e, name)
	c, drop := e.faulty(t)
	drop()
	if _, _, err := op.call(ctx, p.handle(c, name), 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued %s = %v, want the injected error", op.name, err)
	}
	if p.waiting != nil {
		for _, b := range e.members {
			if n := p.waiting(t, b, name); n != 0 {
				t.Errorf("queue length %d after a lost reply, want 0", n)
			}
		}
	}
	end()
	p.leftNothing(t, ctx, e, name, "after a queued call's lost reply")
}

// A recMember is one master of a recorded Client or Quorum (see
// contractEnv.recorded): a plain connection to it, and the faults and the
// scripts of the Client's (or the Quorum's member's) connection to it.
type recMember struct {
	rdb    redis.UniversalClient
	faults *redistest.Faults
	rec    *redistest.Recorder
}

// recorded returns a new Client or Quorum whose connections record the
// scripts they send and drop replies on request, and its masters.
func (e contractEnv) recorded(t *testing.T) (any, []recMember) {
	t.Helper()
	var ms []recMember
	var rdbs []redis.UniversalClient
	for _, b := range e.members {
		m := recMember{rdb: b.NewClient(t), faults: &redistest.Faults{}, rec: &redistest.Recorder{}}
		rdb := b.NewClient(t)
		rdb.AddHook(m.rec)
		rdb.AddHook(m.faults)
		ms, rdbs = append(ms, m), append(rdbs, rdb)
	}
	return e.over(t, rdbs), ms
}

// recordCall runs call and returns whether it took a hold, its undo and,
// for each master, the arguments of the last run of script sent there.
func recordCall(t *testing.T, ms []recMember, script string, call func() (bool, func(context.Context) error, error)) (bool, func(context.Context) error, [][]any) {
	t.Helper()
	for _, m := range ms {
		m.rec.Reset()
	}
	took, undo, err := call()
	if err != nil {
		t.Fatal(err)
	}
	hash := lua.Script(script).Hash()
	copies := make([][]any, len(ms))
	sent := 0
	for i, m := range ms {
		all := m.rec.All()
		for j := len(all) - 1; j >= 0; j-- {
			if a := all[j]; len(a) > 1 && rwScriptHash(a) == hash {
				copies[i] = a
				sent++
				break
			}
		}
	}
	if sent != len(ms) {
		t.Fatalf("runs of %s recorded on %d of %d masters, want all", script, sent, len(ms))
	}
	return took, undo, copies
}

// Reply codes of the attempt scripts (lua/*_lock.lua, semaphore_acquire.lua,
// once_do.lua): refused, and over (the call took effect, or was abandoned,
// and its hold has ended: it takes nothing any more).
const (
	replyRefused = 0
	replyOver    = 5
)

// sendCopies sends recorded scripts again, raw, each to its master, and
// checks each reply code against want (or one of also).
func sendCopies(t *testing.T, ms []recMember, copies [][]any, want int64, what string, also ...int64) {
	t.Helper()
	for i, args := range copies {
		v, err := ms[i].rdb.Do(context.Background(), args...).Result()
		if err != nil {
			t.Fatalf("script copy on master %d: %v", i, err)
		}
		if got := code(v); got != want && !slices.Contains(also, got) {
			t.Errorf("%s replied %d on master %d, want %d", what, got, i, want)
		}
	}
}

// A late copy of an attempt that completed (go-redis re-sends a script
// after a read timeout, and the first copy reaches the server later)
// arrives after the hold ended; a late copy of a refused try arrives once
// the name is free. Neither takes a hold, which no one would renew or
// release. On a Quorum, each master gets the late copy of its own attempt.
func contractLateCopy(t *testing.T, op *contractOp, e contractEnv, ctx context.Context, name string) {
	p := op.p
	c, ms := e.recorded(t)
	octx := dsync.WithOwner(ctx)
	h := p.handle(c, name)
	// The fresh call and, if the operation is reentrant, a re-entry
	// (for a Semaphore: 2 permits, then 1 more).
	calls := []int{1}
	if op.reentrant {
		calls = append(calls, 0)
	}
	var copies [][][]any
	var undos []func(context.Context) error
	for _, i := range calls {
		took, undo, args := recordCall(t, ms, p.script, func() (bool, func(context.Context) error, error) {
			return op.call(octx, h, i)
		})
		if !took {
			t.Fatalf("%s on a free name took nothing", op.name)
		}
		copies, undos = append(copies, args), append(undos, undo)
	}
	for _, undo := range undos {
		must(t, undo(octx))
	}
	for i, args := range copies {
		what := fmt.Sprintf("late copy %d of a completed %s (the call is over)", i+1, op.name)
		if e.quorum {
			// A master slow to answer may have been given up on, and the
			// attempt undone there (see Quorum.poll): the copy finds the
			// call abandoned.
			sendCopies(t, ms, args, replyOver, what, p.abandoned)
		} else {
			sendCopies(t, ms, args, replyOver, what)
		}
	}
	p.leftNothing(t, ctx, e, name, "after the late copies")
	if !op.try {
		return
	}
	for _, tctx := range []context.Context{ctx, octx} {
		end := p.holdOn(t, ctx, e, name)
		_, _, refused := recordCall(t, ms, p.script, func() (bool, func(context.Context) error, error) {
			took, _, err := op.call(tctx, h, 0)
			if took || err != nil {
				t.Fatalf("%s while held = %v, %v; want false, nil", op.name, took, err)
			}
			return took, nil, err
		})
		end()
		sendCopies(t, ms, refused, replyRefused, "late copy of a refused "+op.name)
		p.leftNothing(t, ctx, e, name, "after the late copy of a refused try")
	}
}

// Two attempts whose replies are lost are each abandoned and undone; the
// first one's go-redis retry arrives after both: it takes nothing. On a
// Quorum, the replies are lost on every master (the call fails) and then
// on one master only (the call is granted by the others, and undone on
// that one), and each master gets the late copy of its own attempt.
func contractAbandoned(t *testing.T, op *contractOp, e contractEnv, ctx context.Context, name string) {
	p := op.p
	c, ms := e.recorded(t)
	h := p.handle(c, name)
	// Load the scripts on the name's servers.
	took, undo, err := op.call(ctx, h, 0)
	if err != nil || !took {
		t.Fatalf("%s on a free name = %v, %v; want a hold", op.name, took, err)
	}
	must(t, undo(ctx))
	var copies [][][]any
	for range 2 {
		_, _, args := recordCall(t, ms, p.script, func() (bool, func(context.Context) error, error) {
			for _, m := range ms {
				m.faults.DropReplyNext(1, context.DeadlineExceeded)
			}
			if _, _, err := op.call(ctx, h, 0); err == nil {
				t.Fatalf("%s succeeded despite the lost replies", op.name)
			}
			return false, nil, nil
		})
		copies = append(copies, args)
	}
	sendCopies(t, ms, copies[0], p.abandoned, "late retry of an abandoned "+op.name)
	p.leftNothing(t, ctx, e, name, "after an abandoned call arrived late")
	if len(ms) < 3 {
		return
	}
	// A minority of lost replies: granted, and undone where the reply was
	// lost.
	took, undo, args := recordCall(t, ms, p.script, func() (bool, func(context.Context) error, error) {
		ms[0].faults.DropReplyNext(1, context.DeadlineExceeded)
		return op.call(ctx, h, 0)
	})
	if !took {
		t.Fatalf("%s with one of %d replies lost took nothing", op.name, len(ms))
	}
	sendCopies(t, ms[:1], args[:1], p.abandoned, "late retry of an attempt undone on its master")
	must(t, undo(ctx))
	p.leftNothing(t, ctx, e, name, "after an undone attempt arrived late")
}

// Bad input is an error before any I/O: every call of an invalid handle,
// and the operation with invalid arguments or owner tokens.
func contractBadInput(t *testing.T, op *contractOp, e contractEnv, _ context.Context, _ string) {
	p := op.p
	counter := &redistest.Counter{}
	rdbs := e.connect(t, counter)
	ctx := context.Background()
	c := e.over(t, rdbs)
	nilc, badc, badPeriod := e.over(t, nil), e.over(t, rdbs, dsync.TTL(0)), e.over(t, rdbs, dsync.Period(0))
	handles := map[string]any{
		"empty name":        p.handle(c, ""),
		"zero TTL":          p.handle(c, "x", dsync.TTL(0)),
		"negative TTL":      p.handle(c, "x", dsync.TTL(-time.Second)),
		"TTL past MaxTTL":   p.handle(c, "x", dsync.TTL(dsync.MaxTTL+time.Millisecond)),
		"nil client":        p.handle(nilc, "x"),
		"bad client option": p.handle(badc, "x"),
	}
	if p.nilHandle != nil {
		handles["nil handle"] = p.nilHandle
	}
	if p.bad != nil {
		for what, h := range p.bad(c, badPeriod) {
			handles[what] = h
		}
	}
	calls := map[string]func(context.Context) error{}
	for what, h := range handles {
		calls[what] = func(ctx context.Context) error { _, _, err := op.call(ctx, h, 0); return err }
		for m, f := range p.others(h) {
			calls[what+" ("+m+")"] = f
		}
	}
	for what, tok := range map[string]string{"empty owner token": "", "bad owner token": ":x"} {
		if p.ownerless {
			break
		}
		h := p.handle(c, "x")
		calls[what] = func(ctx context.Context) error {
			_, _, err := op.call(dsync.WithOwnerToken(ctx, tok), h, 0)
			return err
		}
	}
	if op.bad != nil {
		for what, f := range op.bad(c) {
			calls[what] = f
		}
	}
	for what, f := range calls {
		if err := f(ctx); !errors.Is(err, dsync.ErrInvalid) {
			t.Errorf("%s: %s = %v, want ErrInvalid", what, op.name, err)
		}
	}
	if n := counter.RoundTrips(); n != 0 {
		t.Errorf("bad input sent %d commands, want 0", n)
	}
}

// A handle of a closed Client (or Quorum) refuses the operation.
func contractClosedClient(t *testing.T, op *contractOp, e contractEnv, _ context.Context, _ string) {
	c := e.client(t)
	h := op.p.handle(c, "x")
	c.(interface{ Close() error }).Close()
	if _, _, err := op.call(context.Background(), h, 0); !errors.Is(err, dsync.ErrClosed) {
		t.Fatalf("%s after Close = %v, want ErrClosed", op.name, err)
	}
}
