package redistest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	clusterMasters  = 3
	clusterPortLow  = 20000 // the cluster bus listens on port+10000, so ports
	clusterPortHigh = 45000 // must stay well below 55536
	clusterPortPick = 500   // random ports tried per node
	clusterAttempts = 3     // whole-cluster starts before giving up
	clusterCreate   = 60 * time.Second
	clusterOKWait   = 20 * time.Second
	clusterReload   = time.Second // ClusterStateReloadInterval of test clients
)

type cluster struct {
	nodes []*Server
	addrs []string
}

// Cluster returns a real Redis Cluster of three masters without replicas,
// shared by the test binary and started on first use (about 3 s). It reports
// false, after logging why, when redis-server or redis-cli is not on PATH;
// with CI set that is a test failure instead.
//
// Its clients reload the slot map every second (ClusterStateReloadInterval),
// not every minute as go-redis does by default.
func Cluster(t testing.TB) (Backend, bool) {
	t.Helper()
	if !haveBinaries(t, "redis-server", "redis-cli") {
		return Backend{}, false
	}
	c := sharedCluster(t)
	addrs := c.addrs
	return Backend{
		Name: "cluster",
		NewClient: func(t testing.TB) redis.UniversalClient {
			rdb := redis.NewClusterClient(&redis.ClusterOptions{
				Addrs:                      addrs,
				ClusterStateReloadInterval: clusterReload,
			})
			t.Cleanup(func() { _ = rdb.Close() })
			return rdb
		},
		Addrs: append([]string(nil), addrs...),
	}, true
}

func sharedCluster(t testing.TB) *cluster {
	t.Helper()
	return sharedGet(t, "redis cluster", &shared.cluster, &shared.clusterErr, func(dir string) (c *cluster, err error) {
		for range clusterAttempts {
			if c, err = startCluster(dir); err == nil {
				return c, nil
			}
		}
		return nil, err
	})
}

// startCluster starts the nodes, joins them and waits until every node
// reports cluster_state:ok. On failure it stops what it started. Called with
// shared.mu held.
func startCluster(dir string) (_ *cluster, err error) {
	c := &cluster{}
	defer func() {
		if err != nil {
			for _, s := range c.nodes {
				s.Stop()
				delete(shared.servers, s)
			}
		}
	}()
	used := map[int]bool{}
	for range clusterMasters {
		port, err := clusterPort(used)
		if err != nil {
			return nil, err
		}
		used[port] = true
		nodeDir := filepath.Join(dir, strconv.Itoa(port))
		s := &Server{port: port, dir: nodeDir, extra: []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(nodeDir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
		}}
		if err := s.start(); err != nil {
			return nil, err
		}
		trackLocked(s)
		c.nodes = append(c.nodes, s)
		c.addrs = append(c.addrs, s.Addr())
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterCreate)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.addrs...)
	args = append(args, "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := waitClusterOK(c.addrs, clusterOKWait); err != nil {
		return nil, err
	}
	return c, nil
}

// clusterPort picks a random port in [clusterPortLow, clusterPortHigh) such
// that it and its bus port (port+10000) are both free and not in used.
func clusterPort(used map[int]bool) (int, error) {
	for range clusterPortPick {
		p := clusterPortLow + rand.IntN(clusterPortHigh-clusterPortLow)
		if used[p] || used[p+10000] || used[p-10000] {
			continue
		}
		if portFree(p) && portFree(p+10000) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free port pair in %d-%d after %d tries", clusterPortLow, clusterPortHigh, clusterPortPick)
}

// waitClusterOK polls CLUSTER INFO on every node until all report
// cluster_state:ok, or fails after wait.
func waitClusterOK(addrs []string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	clients := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1, PoolSize: 1})
		defer clients[i].Close()
	}
	last := ""
	for time.Now().Before(deadline) {
		ok := true
		for i, rdb := range clients {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			info, err := rdb.ClusterInfo(ctx).Result()
			cancel()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				ok = false
				last = fmt.Sprintf("%s: %v %q", addrs[i], err, firstLine(info, "cluster_state:"))
				break
			}
		}
		if ok {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("cluster not ok after %v (last: %s)", wait, last)
}

func firstLine(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}
