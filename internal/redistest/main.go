package redistest

import (
	"bytes"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	leakWait  = 2 * time.Second // goroutines end asynchronously; wait this long
	leakPoll  = 50 * time.Millisecond
	stackSize = 64 << 20 // most bytes of goroutine stacks read
)

// Main runs the tests for TestMain: m.Run, then it stops every server the
// binary started and removes their directories (kept, and named, when a test
// failed), then checks that no goroutine started during the run is still
// alive. It exits with m.Run's code, or 1 after printing the stacks of leaked
// goroutines.
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
func Main(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	before := goroutineIDs(stacks())

	shared.mu.Lock()
	shared.mainRunning = true
	shared.mu.Unlock()

	stopSignals := onSignal(func(sig os.Signal) {
		fmt.Fprintf(os.Stderr, "redistest: %v: stopping redis servers\n", sig)
		cleanup(false)
		os.Exit(1)
	})
	code := m.Run()
	stopSignals()
	cleanup(code != 0)

	if leaked := leakedGoroutines(before); leaked != "" {
		fmt.Fprintf(os.Stderr, "redistest: goroutines leaked by the tests:\n\n%s\n", leaked)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// cleanup stops every tracked server and removes the shared directories, or
// reports where they are when keep is set.
func cleanup(keep bool) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	for s := range shared.servers {
		s.Stop()
	}
	shared.servers = nil
	shared.standalone, shared.standErr = nil, nil
	shared.cluster, shared.clusterErr = nil, nil
	for _, d := range shared.dirs {
		if keep {
			fmt.Fprintf(os.Stderr, "redistest: server logs kept in %s\n", d)
			continue
		}
		_ = os.RemoveAll(d)
	}
	shared.dirs = nil
	shared.mainRunning = false
}

// onSignal calls f on SIGINT or SIGTERM until the returned stop is called;
// stop waits for the watching goroutine to end.
func onSignal(f func(os.Signal)) (stop func()) {
	ch := make(chan os.Signal, 1)
	quit := make(chan struct{})
	done := make(chan struct{})
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		defer close(done)
		select {
		case sig := <-ch:
			f(sig)
		case <-quit:
		}
	}()
	return func() {
		signal.Stop(ch)
		close(quit)
		<-done
	}
}

// leakedGoroutines returns the stacks of goroutines not in before that are
// still alive after waiting up to leakWait, or "" when there are none.
func leakedGoroutines(before map[string]bool) string {
	deadline := time.Now().Add(leakWait)
	for {
		var leaked []string
		for _, g := range splitStacks(stacks()) {
			id, fn := parseGoroutine(g)
			if before[id] || ignorable(fn) {
				continue
			}
			leaked = append(leaked, g)
		}
		if len(leaked) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(leakPoll)
	}
}

// ignorable reports whether a goroutine whose innermost shown function is fn
// belongs to the test framework or the runtime.
func ignorable(fn string) bool {
	for _, p := range []string{"testing.", "runtime.", "os/signal.", "signal."} {
		if strings.HasPrefix(fn, p) {
			return true
		}
	}
	return false
}

func stacks() []byte {
	for n := 1 << 16; ; n *= 2 {
		buf := make([]byte, n)
		if k := runtime.Stack(buf, true); k < n || n >= stackSize {
			return buf[:k]
		}
	}
}

func splitStacks(b []byte) []string {
	var gs []string
	for _, g := range bytes.Split(bytes.TrimSpace(b), []byte("\n\n")) {
		gs = append(gs, string(g))
	}
	return gs
}

func goroutineIDs(b []byte) map[string]bool {
	ids := map[string]bool{}
	for _, g := range splitStacks(b) {
		id, _ := parseGoroutine(g)
		ids[id] = true
	}
	return ids
}

// parseGoroutine returns the id and innermost function of one goroutine's
// stack as printed by runtime.Stack:
//
//	goroutine 7 [chan receive]:
//	pkg.f(...)
//		/path/file.go:12 +0x2c
func parseGoroutine(g string) (id, fn string) {
	header, rest, _ := strings.Cut(g, "\n")
	id = strings.TrimPrefix(header, "goroutine ")
	id, _, _ = strings.Cut(id, " ")
	fn, _, _ = strings.Cut(rest, "\n")
	if i := strings.LastIndex(fn, "("); i > 0 {
		fn = fn[:i]
	}
	return id, fn
}
