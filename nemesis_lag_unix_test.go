//go:build unix

package dsync_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestNemesisDeadlineExcusesOnlyProcessStalls: a call whose deadline passes
// while the whole test process is stopped (SIGSTOP, as a loaded machine
// may deschedule it) returns late by the stop, and the nemesis's deadline
// check excuses that part, which its lag monitor measured; a call that
// returns as late while the process runs is still reported.
func TestNemesisDeadlineExcusesOnlyProcessStalls(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	w := &nemWorld{t: t, cl: &nemClass{}}
	pid := os.Getpid()

	// The child stops this process shortly after the call starts, before
	// its deadline (1.1 s of slack for the child to start), and resumes it
	// 2 s later. A child slower to start than that stops the process too
	// late: try again.
	var stalled *nemCall
	for i := 0; i < 3 && stalled == nil; i++ {
		w.lag = startLag()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
		cmd := exec.Command("sh", "-c", fmt.Sprintf("sleep 0.1; kill -STOP %d; sleep 2; kill -CONT %d", pid, pid))
		if err := cmd.Start(); err != nil {
			cancel()
			w.lag.close()
			t.Fatal(err)
		}
		<-ctx.Done()
		c := &nemCall{what: "call", start: start, deadline: start.Add(1200 * time.Millisecond), end: time.Now()}
		cancel()
		err := cmd.Wait()
		w.lag.close()
		if err != nil {
			t.Fatal(err)
		}
		if late, _ := w.overrun(c); late > nemOverrun+200*time.Millisecond {
			stalled = c
		}
	}
	if stalled == nil {
		t.Fatal("the process was never stopped across a call's deadline")
	}
	late, by := w.overrun(stalled)
	if late-by > nemOverrun {
		t.Errorf("a call that returned %v late, %v of it while the process was stopped: judged %v late, want at most %v",
			late.Round(time.Millisecond), by.Round(time.Millisecond), (late - by).Round(time.Millisecond), nemOverrun)
	}

	// A call that returns a second late while the process runs.
	w.lag = startLag()
	start := time.Now()
	time.Sleep(1200 * time.Millisecond)
	c := &nemCall{what: "call", start: start, deadline: start.Add(200 * time.Millisecond), end: time.Now()}
	w.lag.close()
	if late, by := w.overrun(c); late-by <= nemOverrun {
		t.Errorf("a call that returned %v late while the process ran (%v measured stalled): judged in time, want reported",
			late.Round(time.Millisecond), by.Round(time.Millisecond))
	}
}
