package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

const (
	cmdTimeout  = 60 * time.Second // bound of one dsync invocation
	lineTimeout = 20 * time.Second // bound of waiting for a child's output
)

// binary builds the command into a temporary directory of t.
func binary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dsync")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// env is the environment of the commands under test: without REDIS_URL,
// so that only -redis decides.
func env() []string {
	var out []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, envURL+"=") {
			out = append(out, e)
		}
	}
	return out
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is one running dsync.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	err            error
	cancel         context.CancelFunc
}

func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	p := &proc{stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{}), cancel: cancel}
	p.cmd = exec.CommandContext(ctx, bin, args...)
	p.cmd.Env = env()
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start dsync %v: %v", args, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		cancel()
		close(p.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
	})
	return p
}

// wait waits for p to exit and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(cmdTimeout + 5*time.Second):
		t.Fatalf("dsync %v did not exit", p.cmd.Args[1:])
	}
	var ee *exec.ExitError
	if p.err != nil && !errors.As(p.err, &ee) {
		t.Fatalf("dsync %v: %v", p.cmd.Args[1:], p.err)
	}
	return p.cmd.ProcessState.ExitCode()
}

// awaitOutput waits until p's stdout contains s.
func (p *proc) awaitOutput(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(lineTimeout)
	for !strings.Contains(p.stdout.String(), s) {
		select {
		case <-p.done:
			t.Fatalf("dsync %v exited before printing %q; stdout %q, stderr %q", p.cmd.Args[1:], s, p.stdout, p.stderr)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("dsync %v printed no %q within %v; stdout %q, stderr %q", p.cmd.Args[1:], s, lineTimeout, p.stdout, p.stderr)
		}
	}
}

// dsync runs the command to its end.
func runDsync(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	p := start(t, bin, args...)
	code = p.wait(t)
	return p.stdout.String(), p.stderr.String(), code
}

func realURL(t *testing.T) (redistest.Backend, string) {
	t.Helper()
	b, ok := redistest.Real(t)
	if !ok {
		t.Skip("no redis-server")
	}
	return b, "redis://" + b.Addrs[0]
}

func TestCommand(t *testing.T) {
	bin := binary(t)

	t.Run("UsageWithoutArgs", func(t *testing.T) {
		t.Parallel()
		_, stderr, code := runDsync(t, bin)
		if code != exitUsage || !strings.Contains(stderr, "Usage:") {
			t.Errorf("dsync: code %d, stderr %q; want %d and the usage", code, stderr, exitUsage)
		}
		for _, sub := range []string{"demo", "run", "inspect", "list"} {
			stdout, _, code := runDsync(t, bin, sub, "-h")
			if code != 0 || !strings.Contains(stdout, "Usage: dsync "+sub) || !strings.Contains(stdout, "Exit status") {
				t.Errorf("dsync %s -h: code %d, stdout %q; want 0, usage and exit status", sub, code, stdout)
			}
		}
		_, stderr, code = runDsync(t, bin, "inspect", "-redis", "redis://127.0.0.1:1", "x")
		if code != exitError || strings.Count(stderr, "\n") != 1 {
			t.Errorf("inspect on a closed port: code %d, stderr %q; want %d and one line", code, stderr, exitError)
		}
	})

	t.Run("DemoOnEmbeddedRedis", func(t *testing.T) {
		t.Parallel()
		stdout, stderr, code := runDsync(t, bin, "demo", "-for", "500ms", "-replicas", "4")
		if code != 0 {
			t.Fatalf("demo: code %d; stdout %q, stderr %q", code, stdout, stderr)
		}
		if !strings.Contains(stdout, "embedded Redis") {
			t.Errorf("demo did not run on the embedded Redis: %q", stdout)
		}
		var winners []string
		drew := 0
		for _, l := range strings.Split(stdout, "\n") {
			if _, w, ok := strings.Cut(l, "winners: "); ok {
				winners = append(winners, w)
				if strings.Contains(l, "DREW") {
					drew++
				}
			}
		}
		if len(winners) != 4 || drew != 1 {
			t.Fatalf("got %d replicas with winners, %d drew; want 4 and 1\n%s", len(winners), drew, stdout)
		}
		for _, w := range winners[1:] {
			if w != winners[0] || strings.Count(w, "#") != winnersDrawn {
				t.Errorf("winners %q and %q; want the same %d", winners[0], w, winnersDrawn)
			}
		}
		if !strings.Contains(stdout, "violations    0 ") {
			t.Errorf("demo summary without 0 violations:\n%s", stdout)
		}
	})

	t.Run("RunNeverOverlaps", func(t *testing.T) {
		t.Parallel()
		_, url := realURL(t)
		name := redistest.Key(t)
		file := filepath.Join(t.TempDir(), "log")
		script := `echo "start $1" >> "$2"; sleep 0.1; echo "end $1" >> "$2"`
		const runners, rounds = 2, 3
		var wg sync.WaitGroup
		codes := make([]int, runners*rounds)
		for r := range runners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range rounds {
					p := start(t, bin, "run", "-redis", url, "-q", name, "--", "sh", "-c", script, "sh", strconv.Itoa(r*rounds+i), file)
					codes[r*rounds+i] = p.wait(t)
				}
			}()
		}
		wg.Wait()
		for i, c := range codes {
			if c != 0 {
				t.Errorf("run %d: exit code %d, want 0", i, c)
			}
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 2*runners*rounds {
			t.Fatalf("got %d lines, want %d:\n%s", len(lines), 2*runners*rounds, b)
		}
		for i := 0; i < len(lines); i += 2 {
			id, ok := strings.CutPrefix(lines[i], "start ")
			if !ok || lines[i+1] != "end "+id {
				t.Fatalf("runs overlap at line %d:\n%s", i+1, b)
			}
		}
	})

	t.Run("RunPassesExitStatus", func(t *testing.T) {
		t.Parallel()
		_, url := realURL(t)
		_, stderr, code := runDsync(t, bin, "run", "-redis", url, redistest.Key(t), "--", "sh", "-c", "exit 7")
		if code != 7 {
			t.Errorf("run of exit 7: code %d (stderr %q), want 7", code, stderr)
		}
		_, _, code = runDsync(t, bin, "run", "-redis", url, redistest.Key(t), "--", "/nonexistent/cmd")
		if code != exitMissing {
			t.Errorf("run of a missing command: code %d, want %d", code, exitMissing)
		}
	})

	t.Run("LeaseLossKillsChild", func(t *testing.T) {
		t.Parallel()
		b, url := realURL(t)
		name := redistest.Key(t)
		p := start(t, bin, "run", "-redis", url, "-ttl", "1s", "-grace", "2s", name, "--",
			"sh", "-c", `echo "pid $$"; exec sleep 60`)
		p.awaitOutput(t, "\n")
		pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(p.stdout.String(), "pid ")))
		if err != nil {
			t.Fatalf("child pid: %v (stdout %q)", err, p.stdout)
		}
		rdb := b.NewClient(t)
		ctx, cancel := context.WithTimeout(context.Background(), lineTimeout)
		defer cancel()
		if n, err := rdb.Del(ctx, keys.ForMutex(dsync.DefaultPrefix, name).Lock).Result(); err != nil || n != 1 {
			t.Fatalf("DEL lock key: %d, %v; want 1", n, err)
		}
		t0 := time.Now()
		if code := p.wait(t); code != exitLost {
			t.Errorf("exit code %d, want %d; stderr %q", code, exitLost, p.stderr)
		}
		if d := time.Since(t0); d > 10*time.Second {
			t.Errorf("lease loss took %v to end the run", d)
		}
		if !strings.Contains(p.stderr.String(), "lost") {
			t.Errorf("stderr %q does not report the loss", p.stderr)
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("child %d still exists after the run ended (kill -0: %v)", pid, err)
		}
	})

	t.Run("InspectShowsHeldLock", func(t *testing.T) {
		t.Parallel()
		_, url := realURL(t)
		name := redistest.Key(t)
		holder := start(t, bin, "run", "-redis", url, name, "--", "sh", "-c", "echo ready; exec sleep 60")
		holder.awaitOutput(t, "ready")

		stdout, stderr, code := runDsync(t, bin, "inspect", "-redis", url, name)
		if code != 0 {
			t.Fatalf("inspect: code %d, stderr %q", code, stderr)
		}
		for _, want := range []string{"mutex", "held", "(count 1)", "/" + strconv.Itoa(holder.cmd.Process.Pid) + "/"} {
			if !strings.Contains(stdout, want) {
				t.Errorf("inspect output lacks %q:\n%s", want, stdout)
			}
		}

		stdout, stderr, code = runDsync(t, bin, "inspect", "-json", "-redis", url, name)
		if code != 0 {
			t.Fatalf("inspect -json: code %d, stderr %q", code, stderr)
		}
		var sts []lockState
		if err := json.Unmarshal([]byte(stdout), &sts); err != nil || len(sts) != 1 {
			t.Fatalf("inspect -json: %v, %d objects, want 1\n%s", err, len(sts), stdout)
		}
		st := sts[0]
		if st.Mode != "mutex" || st.State != "held" || len(st.Holders) != 1 || st.Holders[0].Count != 1 ||
			st.Fence == 0 || st.TTLMillis <= 0 || st.TTLMillis > 30_000 {
			t.Errorf("inspect -json = %+v; want a held mutex, one holder with count 1, a fence and a TTL", st)
		}

		stdout, _, code = runDsync(t, bin, "list", "-json", "-redis", url, name)
		sts = nil
		if err := json.Unmarshal([]byte(stdout), &sts); code != 0 || err != nil || len(sts) != 1 || sts[0].Name != name {
			t.Errorf("list -json %s: code %d, %v, %q; want the one lock", name, code, err, stdout)
		}

		_, stderr, code = runDsync(t, bin, "run", "-redis", url, "-wait", "0", name, "--", "true")
		if code != exitHeld || !strings.Contains(stderr, "held by") {
			t.Errorf("run -wait 0 on a held lock: code %d, stderr %q; want %d and who holds it", code, stderr, exitHeld)
		}
		_, stderr, code = runDsync(t, bin, "run", "-redis", url, "-wait", "300ms", name, "--", "true")
		if code != exitHeld || !strings.Contains(stderr, "still held after") {
			t.Errorf("run -wait 300ms on a held lock: code %d, stderr %q; want %d", code, stderr, exitHeld)
		}

		// SIGTERM reaches the child, and the lock is released.
		if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := holder.wait(t); code != exitSignal+int(syscall.SIGTERM) {
			t.Errorf("run after SIGTERM: code %d, want %d; stderr %q", code, exitSignal+int(syscall.SIGTERM), holder.stderr)
		}
		stdout, _, _ = runDsync(t, bin, "inspect", "-json", "-redis", url, name)
		sts = nil
		if err := json.Unmarshal([]byte(stdout), &sts); err != nil || len(sts) != 1 || sts[0].State != "free" || len(sts[0].Holders) != 0 {
			t.Errorf("after the run ended: %+v (%v); want one free mutex", sts, err)
		}
	})
}
