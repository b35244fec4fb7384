package redistest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestKeyIsUniqueAndBraceFree(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		k := redistest.Key(t)
		if strings.ContainsAny(k, "{} \t\r\n") {
			t.Fatalf("Key() = %q, contains a brace or space", k)
		}
		if !strings.HasPrefix(k, "TestKeyIsUniqueAndBraceFree:") {
			t.Fatalf("Key() = %q, want the test name as prefix", k)
		}
		if seen[k] {
			t.Fatalf("Key() = %q twice", k)
		}
		seen[k] = true
	}
	t.Run("sub test {x} y", func(t *testing.T) {
		if k := redistest.Key(t); strings.ContainsAny(k, "{} ") {
			t.Fatalf("Key() = %q, contains a brace or space", k)
		}
	})
}

func TestBackendsRoundTrip(t *testing.T) {
	for _, b := range redistest.AllBackends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb := b.NewClient(t)
			key := "{" + redistest.Key(t) + "}:k"
			if err := rdb.Set(ctx, key, "v", time.Minute).Err(); err != nil {
				t.Fatalf("SET: %v", err)
			}
			got, err := rdb.Get(ctx, key).Result()
			if err != nil || got != "v" {
				t.Fatalf("GET = %q, %v; want \"v\", nil", got, err)
			}
			if (b.Mini != nil) != (b.Name == "miniredis") {
				t.Errorf("Mini set = %v for backend %q", b.Mini != nil, b.Name)
			}
			if len(b.Addrs) == 0 {
				t.Errorf("Addrs empty")
			}
		})
	}
}

func TestRealIsShared(t *testing.T) {
	a, ok := redistest.Real(t)
	if !ok {
		t.Skip("redis-server not available")
	}
	b, _ := redistest.Real(t)
	if a.Addrs[0] != b.Addrs[0] {
		t.Fatalf("Real addresses differ: %v, %v", a.Addrs, b.Addrs)
	}
	if !strings.HasPrefix(a.Addrs[0], "127.0.0.1:") {
		t.Fatalf("Real address %q not on loopback", a.Addrs[0])
	}
}

func TestClusterSpreadsKeysOverMasters(t *testing.T) {
	b, ok := redistest.Cluster(t)
	if !ok {
		t.Skip("redis cluster not available")
	}
	if len(b.Addrs) != 3 {
		t.Fatalf("cluster has %d nodes, want 3", len(b.Addrs))
	}
	ctx := context.Background()
	rdb := b.NewClient(t).(*redis.ClusterClient)
	base := redistest.Key(t)
	for i := range 30 {
		key := fmt.Sprintf("{%s-%d}:k", base, i)
		if err := rdb.Set(ctx, key, i, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
	}
	var mu sync.Mutex
	masters := 0
	err := rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		masters++
		mu.Unlock()
		return c.Ping(ctx).Err()
	})
	if err != nil {
		t.Fatalf("ForEachMaster: %v", err)
	}
	if masters != 3 {
		t.Fatalf("%d masters, want 3", masters)
	}
	// A cross-slot script must be rejected by a real cluster.
	k1, k2 := "{"+base+"-a}:k", "{"+base+"-b}:k"
	if rdb.ClusterKeySlot(ctx, k1).Val() != rdb.ClusterKeySlot(ctx, k2).Val() {
		if err := redis.NewScript(`return 1`).Run(ctx, rdb, []string{k1, k2}).Err(); err == nil {
			t.Errorf("cross-slot script succeeded on cluster")
		}
	}
}

func TestMiniredisAdvanceMovesTimeAndTTL(t *testing.T) {
	b := redistest.Miniredis(t)
	ctx := context.Background()
	rdb := b.NewClient(t)
	key := redistest.Key(t)
	if err := rdb.Set(ctx, key, "v", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	t0, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	b.Advance(4 * time.Second)
	t1, _ := rdb.Time(ctx).Result()
	if d := t1.Sub(t0); d < 4*time.Second || d > 5*time.Second {
		t.Errorf("TIME moved by %v, want about 4s", d)
	}
	if ttl := rdb.TTL(ctx, key).Val(); ttl != 6*time.Second {
		t.Errorf("TTL = %v, want 6s", ttl)
	}
	b.Advance(6 * time.Second)
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Errorf("key still exists after its TTL")
	}
	t2, _ := rdb.Time(ctx).Result()
	if d := t2.Sub(t1); d != 6*time.Second {
		t.Errorf("TIME moved by %v, want 6s", d)
	}
}

func TestCounterCountsRoundTrips(t *testing.T) {
	for _, b := range redistest.AllBackends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb := b.NewClient(t)
			var c redistest.Counter
			rdb.AddHook(&c)
			key := "{" + redistest.Key(t) + "}"
			c.Reset()

			rdb.Set(ctx, key+":a", 1, time.Minute)
			rdb.Get(ctx, key+":a")
			if got := c.RoundTrips(); got != 2 {
				t.Errorf("after 2 commands RoundTrips() = %d, want 2", got)
			}
			c.Reset()
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := range 5 {
					p.Incr(ctx, fmt.Sprintf("%s:%d", key, i))
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := c.RoundTrips(); got != 1 {
				t.Errorf("after a 5-command pipeline RoundTrips() = %d, want 1", got)
			}
			c.Reset()
			_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Incr(ctx, key+":0")
				p.Incr(ctx, key+":1")
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := c.RoundTrips(); got != 1 {
				t.Errorf("after a transaction RoundTrips() = %d, want 1", got)
			}
		})
	}
}

func TestCountOnClusterCountsEachNode(t *testing.T) {
	b, ok := redistest.Cluster(t)
	if !ok {
		t.Skip("redis cluster not available")
	}
	ctx := context.Background()
	look := b.NewClient(t)
	slots, err := look.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	master := func(key string) string {
		slot := int(look.ClusterKeySlot(ctx, key).Val())
		for _, r := range slots {
			if r.Start <= slot && slot <= r.End {
				return r.Nodes[0].Addr
			}
		}
		t.Fatalf("no master serves slot %d", slot)
		return ""
	}
	// Keys until every master has one (bounded: 30 random keys miss a
	// master with probability about 1e-5, 1000 never in practice).
	base := redistest.Key(t)
	var keys []string
	seen := map[string]bool{}
	for i := 0; i < 1000 && len(seen) < 3; i++ {
		k := fmt.Sprintf("%s:%d", base, i)
		if m := master(k); !seen[m] {
			seen[m] = true
			keys = append(keys, k)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("keys reach %d masters, want 3", len(seen))
	}

	rdb := b.NewClient(t)
	c := redistest.Count(rdb)
	if err := rdb.Set(ctx, keys[0], 1, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if got := c.RoundTrips(); got != 1 {
		t.Errorf("after the first command RoundTrips() = %d, want 1 (topology look-ups not counted)", got)
	}
	c.Reset()
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Incr(ctx, k)
			p.Incr(ctx, k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.RoundTrips(); got != 3 {
		t.Errorf("after a pipeline over 3 masters RoundTrips() = %d, want 3", got)
	}
}

func TestCounterConcurrent(t *testing.T) {
	b := redistest.Miniredis(t)
	rdb := b.NewClient(t)
	var c redistest.Counter
	rdb.AddHook(&c)
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 25 {
				rdb.Incr(ctx, "n")
			}
		})
	}
	wg.Wait()
	if got := c.RoundTrips(); got != 200 {
		t.Fatalf("RoundTrips() = %d, want 200", got)
	}
	if c.Dials() == 0 {
		t.Fatalf("Dials() = 0, want at least 1")
	}
}

var errBoom = errors.New("boom")

// eachFaulty runs f on every standalone backend with a client hooked to
// fresh Faults, a second, unhooked client to look at the server with, and
// a fresh key.
func eachFaulty(t *testing.T, f func(t *testing.T, ctx context.Context, rdb, check redis.UniversalClient, faults *redistest.Faults, key string)) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.NewClient(t)
			var faults redistest.Faults
			rdb.AddHook(&faults)
			f(t, context.Background(), rdb, b.NewClient(t), &faults, redistest.Key(t))
		})
	}
}

// incrAB runs INCR key:a and INCR key:b in one pipeline.
func incrAB(ctx context.Context, rdb redis.UniversalClient, key string) ([]redis.Cmder, error) {
	return rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Incr(ctx, key+":a")
		p.Incr(ctx, key+":b")
		return nil
	})
}

func TestFaultsFailNextIsNotSent(t *testing.T) {
	eachFaulty(t, func(t *testing.T, ctx context.Context, rdb, check redis.UniversalClient, f *redistest.Faults, key string) {
		f.FailNext(2, errBoom)
		for i := range 2 {
			if err := rdb.Incr(ctx, key).Err(); !errors.Is(err, errBoom) {
				t.Fatalf("INCR %d error = %v, want %v", i, err, errBoom)
			}
		}
		if got := check.Get(ctx, key).Val(); got != "" {
			t.Fatalf("failed commands reached the server: value %q", got)
		}
		if err := rdb.Incr(ctx, key).Err(); err != nil {
			t.Fatalf("third INCR: %v", err)
		}
		if got := check.Get(ctx, key).Val(); got != "1" {
			t.Fatalf("value = %q, want 1", got)
		}
		if got := f.Injected(); got != 2 {
			t.Errorf("Injected() = %d, want 2", got)
		}
	})
}

func TestFaultsDropReplyRunsCommand(t *testing.T) {
	eachFaulty(t, func(t *testing.T, ctx context.Context, rdb, _ redis.UniversalClient, f *redistest.Faults, key string) {
		f.DropReplyNext(1, context.DeadlineExceeded)
		if err := rdb.Incr(ctx, key).Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("INCR error = %v, want %v", err, context.DeadlineExceeded)
		}
		if got := rdb.Get(ctx, key).Val(); got != "1" {
			t.Fatalf("after a dropped reply value = %q, want 1 (the command ran)", got)
		}
	})
}

func TestFaultsMatchOnlyScripts(t *testing.T) {
	eachFaulty(t, func(t *testing.T, ctx context.Context, rdb, _ redis.UniversalClient, f *redistest.Faults, key string) {
		f.Match(func(c redis.Cmder) bool { return c.Name() == "evalsha" || c.Name() == "eval" })
		incr := redis.NewScript(`return redis.call("INCR", KEYS[1])`)
		if err := incr.Load(ctx, rdb).Err(); err != nil {
			t.Fatal(err)
		}

		f.DropReplyNext(1, nil)
		if err := rdb.Set(ctx, key, 10, time.Minute).Err(); err != nil {
			t.Fatalf("SET not matched but failed: %v", err)
		}
		if err := incr.Run(ctx, rdb, []string{key}).Err(); !errors.Is(err, redistest.ErrInjected) {
			t.Fatalf("script error = %v, want ErrInjected", err)
		}
		n, err := incr.Run(ctx, rdb, []string{key}).Int()
		if err != nil || n != 12 {
			t.Fatalf("second script = %d, %v; want 12, nil (first one ran)", n, err)
		}
	})
}

func TestFaultsPipeline(t *testing.T) {
	eachFaulty(t, func(t *testing.T, ctx context.Context, rdb, check redis.UniversalClient, f *redistest.Faults, key string) {
		key = "{" + key + "}"
		f.FailNext(1, errBoom)
		cmds, err := incrAB(ctx, rdb, key)
		if !errors.Is(err, errBoom) {
			t.Fatalf("pipeline error = %v, want %v", err, errBoom)
		}
		for _, c := range cmds {
			if !errors.Is(c.Err(), errBoom) {
				t.Errorf("%v error = %v, want %v", c.Args(), c.Err(), errBoom)
			}
		}
		if n := check.Exists(ctx, key+":a", key+":b").Val(); n != 0 {
			t.Fatalf("failed pipeline reached the server")
		}

		f.DropReplyNext(1, errBoom)
		cmds, _ = incrAB(ctx, rdb, key)
		if !errors.Is(cmds[0].Err(), errBoom) || cmds[1].Err() != nil {
			t.Fatalf("errors = %v, %v; want %v, nil", cmds[0].Err(), cmds[1].Err(), errBoom)
		}
		if n := check.Exists(ctx, key+":a", key+":b").Val(); n != 2 {
			t.Fatalf("%d keys exist after a dropped reply, want 2", n)
		}
	})
}

func TestFaultsConcurrent(t *testing.T) {
	b := redistest.Miniredis(t)
	rdb := b.NewClient(t)
	var f redistest.Faults
	rdb.AddHook(&f)
	ctx := context.Background()
	f.FailNext(50, nil)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed int
	)
	for range 8 {
		wg.Go(func() {
			for range 25 {
				if err := rdb.Incr(ctx, "n").Err(); errors.Is(err, redistest.ErrInjected) {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
			f.Match(nil)
		})
	}
	wg.Wait()
	if failed != 50 {
		t.Fatalf("%d commands failed, want 50", failed)
	}
	if got := rdb.Get(ctx, "n").Val(); got != "150" {
		t.Fatalf("n = %s, want 150", got)
	}
}

func TestStandaloneStopStart(t *testing.T) {
	s := redistest.StartStandalone(t)
	ctx := context.Background()
	rdb := s.Client(t)
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	s.Stop()
	if err := rdb.Get(ctx, "k").Err(); err == nil {
		t.Fatal("GET succeeded on a stopped server")
	}
	s.Start()
	if s.Addr() != addr {
		t.Fatalf("address changed from %s to %s", addr, s.Addr())
	}
	if err := rdb.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after restart error = %v, want redis.Nil (empty dataset)", err)
	}
	s.Stop()
	s.Stop() // idempotent
}

func TestRestartReal(t *testing.T) {
	b, ok := redistest.Real(t)
	if !ok {
		t.Skip("redis-server not available")
	}
	ctx := context.Background()
	rdb := b.NewClient(t)
	key := redistest.Key(t)
	if err := rdb.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.RestartReal(t)
	if err := rdb.Get(ctx, key).Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after restart error = %v, want redis.Nil", err)
	}
}
