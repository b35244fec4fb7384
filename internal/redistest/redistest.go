package redistest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Backend is one Redis deployment for tests.
type Backend struct {
	Name string               // "miniredis", "redis", "cluster"
	Mini *miniredis.Miniredis // non-nil for miniredis, to move its clock
	// NewClient returns a new go-redis client connected to the backend,
	// closed at t.Cleanup.
	NewClient func(t testing.TB) redis.UniversalClient
	Addrs     []string
}

// Advance lets d pass for the backend. On miniredis it moves TIME and every
// TTL forward by d at once, without sleeping (see [Miniredis]); from the
// first call on, that miniredis's TIME stands still between calls. On a real
// server it sleeps for d. Safe for concurrent use.
func (b Backend) Advance(d time.Duration) {
	if b.Mini == nil {
		time.Sleep(d)
		return
	}
	c, _ := miniClocks.LoadOrStore(b.Mini, &miniClock{})
	c.(*miniClock).advance(b.Mini, d)
}

// miniClocks maps a *miniredis.Miniredis to its *miniClock.
var miniClocks sync.Map

// miniClock is the time a miniredis was last set to by Advance.
type miniClock struct {
	mu  sync.Mutex
	now time.Time // zero until the first Advance
}

func (c *miniClock) advance(m *miniredis.Miniredis, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		c.now = time.Now()
	}
	c.now = c.now.Add(d)
	m.SetTime(c.now)
	m.FastForward(d)
}

// Miniredis returns a fresh miniredis, closed at t.Cleanup.
//
// Its clock is miniredis's default: TIME follows the wall clock and TTLs
// never run down by themselves. m.FastForward(d) lowers TTLs but does not
// move TIME; m.SetTime(t) moves TIME (and what EXPIREAT compares with) but
// not TTLs. A test whose scripts read TIME must move both together:
//
//	now = now.Add(d)
//	m.SetTime(now)
//	m.FastForward(d)
//
// which is what [Backend.Advance] does. A test may instead call
// m.ClockTTL(true) and then move time with m.SetTime alone (TTLs then follow
// the clock); it must not also call FastForward or Advance, which would count
// the same interval twice.
func Miniredis(t testing.TB) Backend {
	t.Helper()
	m := miniredis.RunT(t)
	t.Cleanup(func() { miniClocks.Delete(m) })
	addr := m.Addr()
	return Backend{
		Name:      "miniredis",
		Mini:      m,
		NewClient: func(t testing.TB) redis.UniversalClient { return newClient(t, addr) },
		Addrs:     []string{addr},
	}
}

// Real returns the real standalone redis-server shared by the test binary,
// starting it on first use. It reports false, after logging why, when
// redis-server is not on PATH; with CI set that is a test failure instead.
func Real(t testing.TB) (Backend, bool) {
	t.Helper()
	if !haveBinaries(t, "redis-server") {
		return Backend{}, false
	}
	s := sharedStandalone(t)
	addr := s.Addr()
	return Backend{
		Name:      "redis",
		NewClient: func(t testing.TB) redis.UniversalClient { return newClient(t, addr) },
		Addrs:     []string{addr},
	}, true
}

// RestartReal kills the shared standalone server and starts it again, empty,
// on the same port. Every test using [Real] at that moment sees the restart:
// call it only from tests that do not run in parallel with others, or use
// [StartStandalone].
func RestartReal(t testing.TB) {
	t.Helper()
	if !haveBinaries(t, "redis-server") {
		t.Skip("redistest: redis-server not on PATH")
	}
	s := sharedStandalone(t)
	s.Stop()
	if err := s.start(); err != nil {
		t.Fatalf("redistest: restart: %v", err)
	}
}

// Backends returns miniredis and, when available, the real standalone server.
//
//	for _, b := range redistest.Backends(t) {
//		t.Run(b.Name, func(t *testing.T) { ... })
//	}
func Backends(t testing.TB) []Backend {
	t.Helper()
	bs := []Backend{Miniredis(t)}
	if b, ok := Real(t); ok {
		bs = append(bs, b)
	}
	return bs
}

// AllBackends returns [Backends] plus, when available, the Redis Cluster.
func AllBackends(t testing.TB) []Backend {
	t.Helper()
	bs := Backends(t)
	if b, ok := Cluster(t); ok {
		bs = append(bs, b)
	}
	return bs
}

var keySeq atomic.Uint64

// Key returns a name unique to this call: the test's name followed by a
// random suffix. It contains no braces, spaces or control characters, so it
// can be used inside a {hash tag}.
func Key(t testing.TB) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	name := sanitize(t.Name())
	if len(name) > 80 {
		name = name[:80]
	}
	return fmt.Sprintf("%s:%s%d", name, hex.EncodeToString(b[:]), keySeq.Add(1))
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		case r == '_', r == '-', r == '.', r == '/', r == '=':
			return r
		}
		return '_'
	}, s)
}

// haveBinaries reports whether all names are on PATH. When one is missing it
// logs that and reports false, or fails the test when CI is set.
func haveBinaries(t testing.TB, names ...string) bool {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("redistest: %s not on PATH and CI is set: %v", n, err)
			}
			t.Logf("redistest: %s not on PATH; skipping real Redis", n)
			return false
		}
	}
	return true
}

// requireBinaries is haveBinaries that skips the test.
func requireBinaries(t testing.TB, names ...string) {
	t.Helper()
	if !haveBinaries(t, names...) {
		t.Skip("redistest: real Redis not available")
	}
}

// Shared servers, started once per binary and stopped by Main.
var shared struct {
	mu          sync.Mutex
	standalone  *Server
	standErr    error
	cluster     *cluster
	clusterErr  error
	dirs        []string
	servers     map[*Server]struct{} // every server to kill in Main
	mainRunning bool
}

func track(s *Server) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	trackLocked(s)
}

func trackLocked(s *Server) {
	if shared.servers == nil {
		shared.servers = make(map[*Server]struct{})
	}
	shared.servers[s] = struct{}{}
}

func untrack(s *Server) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	delete(shared.servers, s)
}

// requireMainLocked fails the test unless Main is running: without it nothing would
// stop the shared servers. Called with shared.mu held.
func requireMainLocked(t testing.TB) {
	t.Helper()
	if !shared.mainRunning {
		t.Fatal("redistest: shared servers need TestMain to call redistest.Main(m)")
	}
}

func sharedStandalone(t testing.TB) *Server {
	t.Helper()
	return sharedGet(t, "standalone redis-server", &shared.standalone, &shared.standErr, func(dir string) (*Server, error) {
		s, err := startFreePort(dir, nil)
		if err == nil {
			trackLocked(s)
		}
		return s, err
	})
}

// sharedGet returns the shared deployment *v, which start starts in a new
// temporary directory (see startShared) on first use. A failure to start
// is kept in *verr: this test and every later one that asks fail with it.
func sharedGet[T comparable](t testing.TB, what string, v *T, verr *error, start func(dir string) (T, error)) T {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	requireMainLocked(t)
	var none T
	if *v == none && *verr == nil {
		*verr = startShared(func(dir string) error {
			x, err := start(dir)
			if err == nil {
				*v = x
			}
			return err
		})
	}
	if *verr != nil {
		t.Fatalf("redistest: %s: %v", what, *verr)
	}
	return *v
}

// startShared runs start in a new temporary directory that Main removes.
// Called with shared.mu held.
func startShared(start func(dir string) error) error {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return err
	}
	shared.dirs = append(shared.dirs, dir)
	return start(dir)
}
