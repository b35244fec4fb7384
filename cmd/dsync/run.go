package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
)

const (
	defaultGrace = 10 * time.Second
	holderPoll   = 2 * time.Second // how often a waiting run re-reads who holds the lock
	unlockWait   = 5 * time.Second
)

const runHead = `Usage: dsync run [flags] NAME -- CMD [ARGS...]

Runs CMD while holding the Mutex NAME, like flock(1) across machines: waits
until NAME is free (saying on stderr who holds it), takes it, runs CMD with
the lease renewed every TTL/3, and releases it when CMD exits.

CMD inherits stdin, stdout, stderr and the environment, plus DSYNC_NAME (the
lock's name), DSYNC_FENCE (the hold's fencing token: larger than that of
every earlier hold of NAME, for storage that rejects stale writers) and
DSYNC_OWNER (the owner token, HOST/PID/RANDOM, as "dsync inspect" shows it).

SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to dsync are passed on to CMD; one
that comes before CMD starts stops dsync (CMD is not started, the lock is
not kept). SIGTSTP (Ctrl-Z) stops CMD and then dsync, and SIGCONT continues
both; the lease is not renewed while dsync is stopped. If dsync dies of
SIGKILL, CMD is killed too (on Linux, CMD itself: not its children). If the
lease is lost while CMD runs (Redis lost the key, or could not be reached to
renew it before the lease ran out), another process may hold NAME already:
dsync says so on stderr, sends CMD SIGTERM, then SIGKILL after -grace, and
exits 75.

CMD runs in a process group of its own, so signals reach its children too;
-foreground keeps it in dsync's group instead, so that it can read from the
terminal (signals then go to CMD alone, and a terminal's Ctrl-C reaches CMD
directly as well as through dsync).
`

const runTail = `Exit status:
  CMD's status     CMD ran and the lease held throughout
  128+n            CMD died of signal n, or dsync got signal n before CMD
                   started (connecting, trying or waiting for NAME)
  73               NAME stayed held by another owner for the whole -wait
  75               the lease was lost while CMD ran
  126, 127         CMD could not be started, or was not found
  1, 2             an error (Redis, ...), bad usage
`

// waitFlag is -wait: a duration, or forever when negative.
type waitFlag struct{ d time.Duration }

func (w *waitFlag) String() string {
	if w == nil || w.d < 0 {
		return "forever"
	}
	return w.d.String()
}

func (w *waitFlag) Set(s string) error {
	if s == "forever" {
		w.d = -1
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return errors.New("negative duration (use forever)")
	}
	w.d = d
	return nil
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	var c conn
	fs := newFlagSet("run", runHead, runTail, stdout)
	c.register(fs, defaultURL)
	ttl := fs.Duration("ttl", dsync.DefaultTTL, "lease `TTL` (1ms to 24h): how long the lock outlives a dsync that dies; renewed every TTL/3")
	wait := waitFlag{d: -1}
	fs.Var(&wait, "wait", "how long to wait for the lock (`duration` or forever); 0 fails at once if held. With a duration, Redis not answering the first attempt within it (5s at least) is an error")
	grace := fs.Duration("grace", defaultGrace, "after a lost lease, how long CMD has to exit after SIGTERM before SIGKILL")
	foreground := fs.Bool("foreground", false, "keep CMD in dsync's process group (it may read the terminal)")
	quiet := fs.Bool("q", false, "say nothing on stderr while waiting")
	if code, done := parse(fs, args, stderr); done {
		return code
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return usageErr(stderr, "run", "missing NAME and CMD")
	}
	name, rest := rest[0], rest[1:]
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	switch {
	case name == "":
		return usageErr(stderr, "run", "empty NAME")
	case len(rest) == 0:
		return usageErr(stderr, "run", "missing CMD after NAME")
	case *ttl < time.Millisecond || *ttl > dsync.MaxTTL:
		return usageErr(stderr, "run", "-ttl %v, want 1ms to %v", *ttl, dsync.MaxTTL)
	case *grace < 0:
		return usageErr(stderr, "run", "-grace %v, want ≥ 0", *grace)
	}

	// Signals are caught from the start: one that comes before CMD starts
	// (while connecting, trying or waiting) stops dsync; one that comes
	// while CMD runs is passed on.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, passedSignals...)
	defer signal.Stop(sigs)

	r := &runner{
		name: name, prefix: c.prefix, wait: wait.d, quiet: *quiet,
		stdout: stdout, stderr: stderr, sigs: sigs,
	}
	r.owner = ownerToken()
	ctx := dsync.WithOwnerToken(context.Background(), r.owner)
	// Until CMD starts, a signal cancels actx: the connection, the
	// attempt and the wait end at once.
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	var gotSig os.Signal
	stopWatch, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case gotSig = <-sigs:
			cancel()
		case <-stopWatch:
		}
	}()
	endWatch := func() os.Signal {
		close(stopWatch)
		<-watched
		return gotSig
	}
	signalled := func(s os.Signal) int {
		r.say("%v before %s started; not running it", s, rest[0])
		return exitSignal + sigNum(s)
	}

	rdb, _, err := c.dial(actx, c.resolved(defaultURL))
	if err != nil {
		if s := endWatch(); s != nil {
			return signalled(s)
		}
		return fail(stderr, "run", exitError, err)
	}
	defer rdb.Close()
	r.rdb = rdb
	client := dsync.New(rdb, dsync.TTL(*ttl), dsync.Prefix(c.prefix))
	defer client.Close()
	r.m = client.Mutex(name)

	code, ok := r.acquire(ctx, actx)
	if s := endWatch(); s != nil {
		if ok {
			r.unlock(ctx)
		}
		return signalled(s)
	}
	if !ok {
		return code
	}
	return r.runHeld(ctx, rest, *grace, *foreground)
}

// passedSignals are the signals that stop dsync before CMD starts and are
// passed on to CMD while it runs.
var passedSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

type runner struct {
	name, prefix, owner string
	wait                time.Duration
	quiet               bool
	rdb                 redis.UniversalClient
	m                   *dsync.Mutex
	stdout, stderr      io.Writer
	sigs                chan os.Signal
}

// ownerToken returns HOST/PID/RANDOM: unguessable, and it says who holds
// a lock.
func ownerToken() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	host = strings.Map(func(r rune) rune {
		if r <= ' ' || r == '/' {
			return '_'
		}
		return r
	}, host)
	if len(host) > 64 {
		host = host[:64]
	}
	return host + "/" + strconv.Itoa(os.Getpid()) + "/" + uuid.NewString()
}

func (r *runner) say(format string, args ...any) {
	fmt.Fprintf(r.stderr, "dsync run: "+format+"\n", args...)
}

// acquire takes the lock. ctx carries the owner; actx is ctx, cancelled
// when dsync gets a signal. It returns ok, or the exit code.
func (r *runner) acquire(ctx, actx context.Context) (int, bool) {
	// With a -wait, the first attempt is bounded too: by the wait, or by
	// pingTimeout when that is longer. A server that holds the attempt
	// (paused, busy with a script) is then reported as not answering,
	// and no CMD starts when it answers much later.
	tctx, cancel := actx, context.CancelFunc(func() {})
	if r.wait >= 0 {
		tctx, cancel = context.WithTimeout(actx, max(r.wait, pingTimeout))
	}
	ok, err := r.m.TryLock(tctx)
	cancel()
	switch {
	case err != nil && actx.Err() != nil:
		return exitError, false // a signal: the caller reports it
	case err != nil && errors.Is(err, context.DeadlineExceeded):
		return fail(r.stderr, "run", exitError, fmt.Errorf("no answer from Redis within %v", max(r.wait, pingTimeout))), false
	case err != nil:
		return fail(r.stderr, "run", exitError, err), false
	}
	if ok {
		return 0, true
	}
	holder := r.holder(actx)
	if r.wait == 0 {
		r.say("%q is held%s", r.name, holder)
		return exitHeld, false
	}
	if !r.quiet {
		how := "until it is free"
		if r.wait > 0 {
			how = "up to " + r.wait.String()
		}
		r.say("%q is held%s; waiting %s", r.name, holder, how)
	}

	lctx, cancel := context.WithCancel(actx)
	defer cancel()
	if r.wait > 0 {
		lctx, cancel = context.WithTimeout(lctx, r.wait)
		defer cancel()
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(holderPoll)
		defer t.Stop()
		last := holder
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
				if h := r.holder(lctx); h != last && h != "" && lctx.Err() == nil {
					last = h
					if !r.quiet {
						r.say("%q is now held%s; waiting", r.name, h)
					}
				}
			}
		}
	}()
	start := time.Now()
	err = r.m.Lock(lctx)
	cancel()
	wg.Wait()
	switch {
	case err == nil:
		if !r.quiet && actx.Err() == nil {
			r.say("took %q after %v", r.name, time.Since(start).Round(time.Millisecond))
		}
		return 0, true
	case actx.Err() != nil:
		return exitError, false // a signal: the caller reports it
	case errors.Is(err, context.DeadlineExceeded):
		r.say("%q still held after %v%s", r.name, r.wait, r.holder(ctx))
		return exitHeld, false
	default:
		return fail(r.stderr, "run", exitError, err), false
	}
}

// holder describes who holds the lock, as " by OWNER (...)", or "" if
// that cannot be read.
func (r *runner) holder(ctx context.Context) string {
	ictx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	sts, err := inspect(ictx, r.rdb, r.prefix, r.name)
	if err != nil {
		return ""
	}
	i := slices.IndexFunc(sts, func(st *lockState) bool { return st.Mode == "mutex" })
	if i < 0 || len(sts[i].Holders) == 0 {
		return ""
	}
	st := sts[i]
	var owners []string
	for _, h := range st.Holders {
		owners = append(owners, h.Owner)
	}
	s := fmt.Sprintf(" by %s (fence %s, lease %s left", strings.Join(owners, ", "), fmtFence(st.Fence), fmtMillis(st.TTLMillis))
	if st.WaitersTotal > 0 {
		s += fmt.Sprintf(", %d queued", st.WaitersTotal)
	}
	return s + ")"
}

// runHeld runs CMD while the lock is held and releases it after.
func (r *runner) runHeld(ctx context.Context, argv []string, grace time.Duration, foreground bool) int {
	lease, err := r.m.Lease(ctx)
	if err != nil {
		r.unlock(ctx)
		return fail(r.stderr, "run", exitError, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, r.stdout, r.stderr
	cmd.Env = append(os.Environ(),
		"DSYNC_NAME="+r.name,
		"DSYNC_FENCE="+strconv.FormatUint(lease.Token(), 10),
		"DSYNC_OWNER="+r.owner)
	group := !foreground && setGroup(cmd)
	setDeathSignal(cmd)
	// The death signal is bound to the thread that starts CMD: it stays
	// this goroutine's until CMD has exited.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Job control: Ctrl-Z stops CMD with dsync, not dsync alone.
	jobs := make(chan os.Signal, 4)
	if len(jobSignals) > 0 {
		signal.Notify(jobs, jobSignals...)
		defer signal.Stop(jobs)
	}
	if err := cmd.Start(); err != nil {
		r.unlock(ctx)
		code := exitCannot
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = exitMissing
		}
		return fail(r.stderr, "run", code, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var (
		lost   error
		killed <-chan time.Time
		leased = lease.Done()
	)
	for {
		select {
		case s := <-r.sigs:
			_ = signalChild(cmd.Process, s, group)
		case s := <-jobs:
			jobControl(cmd.Process, s, group)
		case <-leased:
			leased = nil
			if lost = lease.Err(); lost == nil {
				continue // released: cannot happen before Unlock
			}
			r.say("lease on %q lost (%v): another process may hold it; sending SIGTERM to %s", r.name, lost, argv[0])
			_ = signalChild(cmd.Process, syscall.SIGTERM, group)
			t := time.NewTimer(grace)
			defer t.Stop()
			killed = t.C
		case <-killed:
			killed = nil
			r.say("%s still running %v after SIGTERM; sending SIGKILL", argv[0], grace)
			_ = signalChild(cmd.Process, syscall.SIGKILL, group)
		case err := <-done:
			if lost != nil {
				// Clears this process's record of the hold; Redis no
				// longer has it, or has someone else's.
				_ = r.m.Unlock(ctx)
				return exitLost
			}
			if uerr := r.unlock(ctx); errors.Is(uerr, dsync.ErrLeaseLost) {
				r.say("lease on %q was lost before %s exited: another process may have held it", r.name, argv[0])
				return exitLost
			}
			return exitStatus(err, cmd.ProcessState)
		}
	}
}

// unlock releases the lock and reports an error that is not loss.
func (r *runner) unlock(ctx context.Context) error {
	uctx, cancel := context.WithTimeout(ctx, unlockWait)
	defer cancel()
	err := r.m.Unlock(uctx)
	if err != nil && !errors.Is(err, dsync.ErrLeaseLost) {
		r.say("releasing %q: %v (it expires at its TTL)", r.name, err)
	}
	return err
}

// exitStatus returns the exit code that reports how CMD ended.
func exitStatus(err error, ps *os.ProcessState) int {
	if ps == nil {
		return exitError
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitSignal + int(ws.Signal())
	}
	if code := ps.ExitCode(); code >= 0 {
		return code
	}
	return exitError
}

func sigNum(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return int(n)
	}
	return 1
}
