//go:build unix

package main

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsync-go/dsync/internal/redistest"
)

// procState returns the state letter of process pid from /proc ('S', 'T'
// stopped, 'Z' zombie, ...), or 0 once the process is gone. It skips the
// test without /proc.
func procState(t *testing.T, pid int) byte {
	t.Helper()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// "pid (comm) S ...": the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}

// awaitState waits until process pid is in one of the states want (0 for
// gone) and reports whether it got there within lineTimeout.
func awaitState(t *testing.T, pid int, want string) bool {
	t.Helper()
	deadline := time.Now().Add(lineTimeout)
	for {
		st := procState(t, pid)
		if (st == 0 && strings.Contains(want, "0")) || (st != 0 && strings.IndexByte(want, st) >= 0) {
			return true
		}
		if time.Now().After(deadline) {
			t.Logf("process %d in state %q after %v, want one of %q", pid, st, lineTimeout, want)
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startSleeper starts "dsync run" on name with a CMD that prints its pid and
// then sleeps for 60 s (as the same process, its output no longer dsync's,
// so that dsync's pipes close when dsync exits), and returns CMD's pid.
func startSleeper(t *testing.T, bin, url, name string, flags ...string) (*proc, int) {
	t.Helper()
	args := append(append([]string{"run", "-redis", url}, flags...), name, "--", "sh", "-c", `echo "pid $$"; exec sleep 60 >/dev/null 2>&1`)
	p := start(t, bin, args...)
	p.awaitOutput(t, "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(p.stdout.String(), "pid ")))
	if err != nil {
		t.Fatalf("child pid: %v (stdout %q)", err, p.stdout)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return p, pid
}

// TestRunCMDDoesNotOutliveDsync: CMD runs in a process group of its own,
// so what stops or kills dsync alone must not leave CMD running without
// the lock, which another "dsync run" takes once the lease runs out.
//
// Before: SIGQUIT (Ctrl-\ on a terminal reaches dsync's group only) killed
// dsync with a goroutine dump, exit 2, CMD running on; SIGTSTP (Ctrl-Z)
// stopped dsync, whose lease then ran out, CMD running on (state S); after
// SIGKILL CMD ran on. Each time a second run took the lock while CMD ran.
// After: SIGQUIT is passed on (CMD dies of it, exit 131); SIGTSTP stops
// CMD (state T), then dsync, and SIGCONT continues both; on Linux the
// kernel kills CMD when dsync dies.
func TestRunCMDDoesNotOutliveDsync(t *testing.T) {
	bin := binary(t)
	_, url := realURL(t)

	t.Run("SIGQUIT", func(t *testing.T) {
		t.Parallel()
		p, pid := startSleeper(t, bin, url, redistest.Key(t))
		if err := p.cmd.Process.Signal(syscall.SIGQUIT); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t); code != exitSignal+int(syscall.SIGQUIT) {
			t.Errorf("run after SIGQUIT: code %d, want %d; stderr %.200q", code, exitSignal+int(syscall.SIGQUIT), p.stderr)
		}
		if !awaitState(t, pid, "0Z") {
			t.Errorf("CMD %d still runs after dsync got SIGQUIT and exited", pid)
		}
	})

	t.Run("SIGTSTP", func(t *testing.T) {
		t.Parallel()
		p, pid := startSleeper(t, bin, url, redistest.Key(t), "-ttl", "1s")
		if err := p.cmd.Process.Signal(syscall.SIGTSTP); err != nil {
			t.Fatal(err)
		}
		if !awaitState(t, p.cmd.Process.Pid, "T") {
			t.Fatalf("dsync not stopped by SIGTSTP")
		}
		if !awaitState(t, pid, "T") {
			t.Errorf("CMD %d runs on while dsync is stopped", pid)
		}
		if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if !awaitState(t, pid, "S") {
			t.Errorf("CMD %d not continued with dsync", pid)
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		p.wait(t)
	})

	t.Run("SIGKILL", func(t *testing.T) {
		t.Parallel()
		if runtime.GOOS != "linux" {
			t.Skip("a child is killed with its parent on Linux only")
		}
		p, pid := startSleeper(t, bin, url, redistest.Key(t))
		if err := p.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		p.wait(t)
		if !awaitState(t, pid, "0Z") {
			t.Errorf("CMD %d still runs after dsync was killed", pid)
		}
	})
}

// TestRunSignalBeforeCMDStarts: a signal that comes before CMD starts
// stops dsync at once, with 128+n, and CMD is never started, also while
// Redis does not answer. The server's clients are paused (CLIENT PAUSE):
// ALL holds the connection's PING, WRITE the lock attempt, for 12 s.
//
// Before: the signal waited in a channel until Redis answered. Paused
// connecting, dsync exited 1 ("no answer within 5s"); paused trying, it
// took the lock when the pause ended (12 s), started CMD and passed it the
// old signal, exit 130 after CMD may have begun its work. After: exit 130
// within a second of the signal, connecting, and within the 5 s that
// dsync's Client gives the abandoned attempt's clean-up, trying; CMD not
// started.
func TestRunSignalBeforeCMDStarts(t *testing.T) {
	bin := binary(t)
	srv := redistest.StartStandalone(t)
	url := "redis://" + srv.Addr()
	// WRITE comes first: a pause of ALL holds CLIENT UNPAUSE too, and
	// ends only when it runs out.
	for _, mode := range []string{"WRITE", "ALL"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// One connection pauses and unpauses: a new one would be
			// held by the pause.
			rdb := srv.Client(t).Conn()
			defer rdb.Close()
			const pause = 12 * time.Second
			if err := rdb.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), mode).Err(); err != nil {
				t.Fatal(err)
			}
			unpause := func() {
				if mode == "WRITE" {
					if err := rdb.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
			defer unpause()
			file := filepath.Join(t.TempDir(), "ran")
			p := start(t, bin, "run", "-redis", url, redistest.Key(t), "--", "sh", "-c", `echo ran > "$1"`, "sh", file)
			time.Sleep(time.Second)
			if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			code := p.wait(t)
			// Paused while trying, the abandoned attempt's clean-up has
			// up to 5 s when the Client closes.
			bound := 3 * time.Second
			if mode == "WRITE" {
				bound = 8 * time.Second
			}
			if d := time.Since(t0); d > bound {
				t.Errorf("dsync exited %v after SIGINT", d)
			}
			if code != exitSignal+int(syscall.SIGINT) {
				t.Errorf("code %d, want %d; stderr %q", code, exitSignal+int(syscall.SIGINT), p.stderr)
			}
			unpause()
			if _, err := os.Stat(file); err == nil {
				t.Errorf("CMD ran after the signal; stderr %q", p.stderr)
			}
		})
	}
}

// TestRunWaitBoundsTheFirstAttempt: with -wait 0, a server that holds the
// lock attempt (its clients paused for writes) is reported as not
// answering within 5 s, exit 1, and CMD never starts. Before, the attempt
// waited until go-redis gave up on it (25 s: exit 1, "i/o timeout"), or
// for the pause to end when that came first, then took the lock and ran
// CMD, against the help's "0 fails at once".
func TestRunWaitBoundsTheFirstAttempt(t *testing.T) {
	bin := binary(t)
	srv := redistest.StartStandalone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rdb := srv.Client(t).Conn()
	defer rdb.Close()
	if err := rdb.Do(ctx, "CLIENT", "PAUSE", (40 * time.Second).Milliseconds(), "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := rdb.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
			t.Error(err)
		}
	}()
	file := filepath.Join(t.TempDir(), "ran")
	t0 := time.Now()
	p := start(t, bin, "run", "-wait", "0", "-redis", "redis://"+srv.Addr(), redistest.Key(t), "--", "sh", "-c", `echo ran > "$1"`, "sh", file)
	code := p.wait(t)
	// 5 s for the attempt, and up to 5 s for the Client's clean-up of it
	// at Close; go-redis alone gives up after 25 s.
	d := time.Since(t0)
	t.Logf("dsync exited after %v", d)
	if d > 20*time.Second {
		t.Errorf("dsync exited %v after it started, want within 20 s", d)
	}
	if code != exitError {
		t.Errorf("code %d, want %d; stderr %q", code, exitError, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "no answer") {
		t.Errorf("stderr %q, want it to say Redis did not answer", p.stderr)
	}
	if _, err := os.Stat(file); err == nil {
		t.Error("CMD ran")
	}
}
