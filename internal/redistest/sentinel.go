package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// SentinelMaster is the name the sentinels of [StartSentinel] monitor.
	SentinelMaster = "mymaster"
	sentinels      = 3
	sentinelQuorum = 2
	sentinelReady  = 20 * time.Second // until every sentinel sees quorum and the replica
	failoverWait   = 20 * time.Second // until a failover has switched and settled
)

// Sentinel is a private Redis deployment watched by Sentinel: a master, one
// replica and three sentinels (quorum 2, down-after 1 s, failover-timeout
// 5 s), for a test that fails the master over.
type Sentinel struct {
	t         testing.TB
	nodes     []*Server // the master and the replica, in start order
	sentinels []*Server
}

// StartSentinel starts a master, a replica and three sentinels on free
// loopback ports and waits until the sentinels agree on the master and know
// the replica (about 3 s). Everything is stopped at t.Cleanup. When
// redis-server or redis-sentinel is not on PATH it skips the test (fails it
// when CI is set).
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	requireBinaries(t, "redis-server", "redis-sentinel")
	dir := t.TempDir()
	s := &Sentinel{t: t}
	t.Cleanup(s.stop)
	master, err := startFreePort(dir, []string{"--repl-diskless-sync-delay", "0"})
	if err != nil {
		t.Fatalf("redistest: master: %v", err)
	}
	s.add(&s.nodes, master)
	replica, err := startFreePort(dir, []string{
		"--repl-diskless-sync-delay", "0",
		"--replicaof", "127.0.0.1", strconv.Itoa(master.port),
	})
	if err != nil {
		t.Fatalf("redistest: replica: %v", err)
	}
	s.add(&s.nodes, replica)
	for range sentinels {
		sn, err := startSentinelPort(dir, master.port)
		if err != nil {
			t.Fatalf("redistest: sentinel: %v", err)
		}
		s.add(&s.sentinels, sn)
	}
	if err := s.waitReady(master.Addr(), sentinelReady); err != nil {
		t.Fatalf("redistest: sentinels not ready: %v", err)
	}
	return s
}

func (s *Sentinel) add(to *[]*Server, srv *Server) {
	srv.tb = s.t
	track(srv)
	*to = append(*to, srv)
}

func (s *Sentinel) stop() {
	for _, srv := range append(append([]*Server(nil), s.sentinels...), s.nodes...) {
		srv.Stop()
		untrack(srv)
	}
}

// startSentinelPort starts a sentinel on a free port with its own writable
// config file (sentinels rewrite it).
func startSentinelPort(root string, masterPort int) (*Server, error) {
	var err error
	for range portTries {
		var port int
		if port, err = freePort(); err != nil {
			return nil, err
		}
		dir := filepath.Join(root, "sentinel-"+strconv.Itoa(port))
		if err = os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d\n"+
			"sentinel down-after-milliseconds %[1]s 1000\n"+
			"sentinel failover-timeout %[1]s 5000\n", SentinelMaster, masterPort, sentinelQuorum)
		if err = os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return nil, err
		}
		srv := &Server{port: port, dir: dir, bin: "redis-sentinel", conf: conf}
		if err = srv.start(); err == nil {
			return srv, nil
		}
	}
	return nil, err
}

// SentinelAddrs returns the sentinels' host:port addresses.
func (s *Sentinel) SentinelAddrs() []string {
	var out []string
	for _, sn := range s.sentinels {
		out = append(out, sn.Addr())
	}
	return out
}

// Nodes returns the two data nodes in start order: the first master, then
// the first replica. Roles change with every failover; see MasterAddr.
func (s *Sentinel) Nodes() []*Server { return s.nodes }

// NewClient returns a go-redis failover client that finds the master through
// the sentinels, closed at t.Cleanup.
func (s *Sentinel) NewClient(t testing.TB) *redis.Client {
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    SentinelMaster,
		SentinelAddrs: s.SentinelAddrs(),
	})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// MasterAddr returns the master address the first sentinel that answers
// reports.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	var err error
	for _, sn := range s.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr(), MaxRetries: -1})
		var a []string
		a, err = c.GetMasterAddrByName(ctx, SentinelMaster).Result()
		c.Close()
		if err == nil && len(a) == 2 {
			return a[0] + ":" + a[1], nil
		}
	}
	return "", fmt.Errorf("no sentinel answered: %w", err)
}

// Failover asks a sentinel for a failover (SENTINEL FAILOVER) and waits
// until every sentinel reports the new master, the new master says it is
// one and the old master has become its replica (about 1–3 s). It returns
// the new master's address.
func (s *Sentinel) Failover() string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), failoverWait)
	defer cancel()
	old, err := s.MasterAddr(ctx)
	if err != nil {
		s.t.Fatalf("redistest: %v", err)
	}
	c := redis.NewSentinelClient(&redis.Options{Addr: s.sentinels[0].Addr()})
	defer c.Close()
	if err := c.Failover(ctx, SentinelMaster).Err(); err != nil {
		s.t.Fatalf("redistest: SENTINEL FAILOVER: %v", err)
	}
	return s.WaitFailover(old)
}

// WaitFailover waits until a failover away from the master at old has
// completed, as Failover does, and returns the new master's address.
func (s *Sentinel) WaitFailover(old string) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), failoverWait)
	defer cancel()
	addr, err := s.waitSwitched(ctx, old)
	if err != nil {
		s.t.Fatalf("redistest: failover: %v", err)
	}
	return addr
}

// waitSwitched waits until the sentinels agree on a master other than old,
// which reports role master, and old reports role slave with its link up.
func (s *Sentinel) waitSwitched(ctx context.Context, old string) (string, error) {
	last := ""
	for ctx.Err() == nil {
		addr, err := s.agreedMaster(ctx)
		if err == nil && addr != old &&
			roleIs(ctx, addr, "role:master") && roleIs(ctx, old, "master_link_status:up") {
			return addr, nil
		}
		last = fmt.Sprintf("master %q, %v", addr, err)
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("not switched from %s (last: %s)", old, last)
}

// agreedMaster returns the master address if every sentinel reports the same.
func (s *Sentinel) agreedMaster(ctx context.Context) (string, error) {
	addr := ""
	for _, sn := range s.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr(), MaxRetries: -1})
		a, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
		c.Close()
		if err != nil || len(a) != 2 {
			return "", fmt.Errorf("sentinel %s: %v", sn.Addr(), err)
		}
		got := a[0] + ":" + a[1]
		if addr != "" && got != addr {
			return "", fmt.Errorf("sentinels disagree: %s vs %s", addr, got)
		}
		addr = got
	}
	return addr, nil
}

// waitReady waits until every sentinel passes CKQUORUM and lists the
// replica, and the replica's link to master is up.
func (s *Sentinel) waitReady(master string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	last := ""
	for ctx.Err() == nil {
		ok := roleIs(ctx, s.nodes[1].Addr(), "master_link_status:up")
		if !ok {
			last = "replica link down"
		}
		for _, sn := range s.sentinels {
			if !ok {
				break
			}
			c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr(), MaxRetries: -1})
			q, err := c.CkQuorum(ctx, SentinelMaster).Result()
			reps, rerr := c.Replicas(ctx, SentinelMaster).Result()
			c.Close()
			if err != nil || rerr != nil || !strings.HasPrefix(q, "OK") || len(reps) == 0 {
				ok = false
				last = fmt.Sprintf("sentinel %s: ckquorum %q %v, replicas %d %v", sn.Addr(), q, err, len(reps), rerr)
			}
		}
		if ok {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("after %v: %s (master %s)", wait, last, master)
}

// roleIs reports whether INFO replication of addr contains line.
func roleIs(ctx context.Context, addr, line string) bool {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(info, line)
}
