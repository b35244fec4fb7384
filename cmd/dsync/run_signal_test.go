//go:build unix

package main

import (
	"os"
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
