package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	readyTries    = 100                   // PING attempts while a server starts
	readyInterval = 50 * time.Millisecond // pause between attempts
	portTries     = 3                     // fresh ports tried when one is taken meanwhile
	logTail       = 2048                  // bytes of a server log quoted in errors
)

// Server is a redis-server process on a loopback port. Its methods are safe
// for concurrent use.
type Server struct {
	tb    testing.TB // reports Start failures; nil for shared servers
	port  int
	dir   string   // data directory; the log is dir/redis.log
	extra []string // flags after the standalone ones
	bin   string   // program to run; "" is redis-server
	conf  string   // config file passed first, if any (sentinels need one)

	mu   sync.Mutex
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when the process has exited and been reaped
}

// StartStandalone starts a private standalone redis-server on a free loopback
// port for a test that kills or restarts it. The server is stopped and its
// directory removed at t.Cleanup. When redis-server is not available it skips
// the test (fails it when CI is set).
func StartStandalone(t testing.TB) *Server {
	t.Helper()
	requireBinaries(t, "redis-server")
	dir := t.TempDir()
	s, err := startFreePort(dir, nil)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s.tb = t
	track(s)
	t.Cleanup(func() {
		s.Stop()
		untrack(s)
	})
	return s
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Client returns a new client connected to the server, closed at t.Cleanup.
func (s *Server) Client(t testing.TB) *redis.Client { return newClient(t, s.Addr()) }

// newClient returns a new client connected to the server at addr, closed
// at t.Cleanup.
func newClient(t testing.TB, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Stop kills the server (SIGKILL: no save, no goodbye to clients) and waits
// for it to exit. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

// Start starts a stopped server again on the same port, with an empty
// dataset, and waits until it answers PING. Starting a running server does
// nothing. On failure it ends the test with t.Fatal, so call it from the
// test's goroutine.
func (s *Server) Start() {
	if err := s.start(); err != nil {
		if s.tb == nil {
			panic(err)
		}
		s.tb.Helper()
		s.tb.Fatalf("redistest: %v", err)
	}
}

// Restart stops the server and starts it again on the same port.
func (s *Server) Restart() {
	s.Stop()
	s.Start()
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(s.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
	}
	args = append(args, s.extra...)
	bin := "redis-server"
	if s.bin != "" {
		bin = s.bin
	}
	if s.conf != "" {
		args = append([]string{s.conf}, args...)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	// The waiter is the process's only reaper; Stop waits for it.
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.cmd, s.log, s.done = cmd, logf, done

	if err := waitReady(s.Addr(), done); err != nil {
		s.stopLocked()
		return fmt.Errorf("redis-server on %s: %w\n%s", s.Addr(), err, s.tail())
	}
	return nil
}

func (s *Server) stopLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	_ = s.log.Close()
	s.cmd, s.log, s.done = nil, nil, nil
}

// tail returns the end of the server's log, for error messages.
func (s *Server) tail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return ""
	}
	if len(b) > logTail {
		b = b[len(b)-logTail:]
	}
	return "--- redis.log (tail) ---\n" + string(b)
}

var errExited = errors.New("process exited")

// waitReady polls addr with PING until it answers, the process exits, or
// readyTries attempts have failed.
func waitReady(addr string, exited <-chan struct{}) error {
	rdb := redis.NewClient(&redis.Options{
		Addr:         addr,
		DialTimeout:  time.Second,
		ReadTimeout:  time.Second,
		WriteTimeout: time.Second,
		MaxRetries:   -1,
		PoolSize:     1,
	})
	defer rdb.Close()
	var err error
	for range readyTries {
		select {
		case <-exited:
			return errExited
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(readyInterval)
	}
	return fmt.Errorf("not ready after %d tries: %w", readyTries, err)
}

// startFreePort starts a server in a subdirectory of root on a port the
// kernel reports free, trying another port if that one is taken before the
// server binds it.
func startFreePort(root string, extra []string) (*Server, error) {
	var err error
	for range portTries {
		var port int
		port, err = freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{port: port, dir: filepath.Join(root, strconv.Itoa(port)), extra: extra}
		if err = s.start(); err == nil {
			return s, nil
		}
	}
	return nil, err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// portFree reports whether port can be bound on 127.0.0.1 right now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
