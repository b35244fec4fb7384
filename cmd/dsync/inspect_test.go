package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
)

// heldName starts a Client on a real redis-server (it skips the test
// without one), and under a fresh name locks the Mutex and acquires 3 of the
// 4 permits of the Semaphore, given back when the test ends.
func heldName(t *testing.T) (context.Context, redis.UniversalClient, *dsync.Client, string) {
	b, ok := redistest.Real(t)
	if !ok {
		t.Skip("no redis-server")
	}
	rdb := b.NewClient(t)
	c := dsync.New(rdb)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	name := redistest.Key(t)
	m := c.Mutex(name)
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unlock(ctx) })
	s := c.Semaphore(name, 4)
	if err := s.Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Release(ctx, 3) })
	return ctx, rdb, c, name
}

// TestInspectReadsEveryLayout holds each primitive under one name and reads
// them back with inspect, in process.
func TestInspectReadsEveryLayout(t *testing.T) {
	ctx, rdb, c, name := heldName(t)
	rw := c.RWMutex(name)
	if err := rw.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	defer rw.RUnlock(ctx)
	if err := c.Once(name, dsync.Period(time.Minute)).Do(ctx, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}

	sts, err := inspect(ctx, rdb, dsync.DefaultPrefix, name)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*lockState{}
	for _, st := range sts {
		got[st.Mode] = st
	}
	if st := got["mutex"]; st == nil || st.State != "held" || len(st.Holders) != 1 || st.Fence == 0 || st.TTLMillis <= 0 {
		t.Errorf("mutex: %+v; want held by one with a fence and a TTL", st)
	}
	if st := got["rwmutex"]; st == nil || st.State != "held" || len(st.Holders) != 1 || st.Holders[0].Kind != "read" || st.Holders[0].TTLMillis <= 0 {
		t.Errorf("rwmutex: %+v; want one reader with a lease", st)
	}
	if st := got["semaphore"]; st == nil || st.State != "held" || st.Size != 4 || st.Used != 3 || len(st.Holders) != 1 || st.Holders[0].Count != 3 || st.Holders[0].Fence == 0 {
		t.Errorf("semaphore: %+v; want 3 of 4 permits held by one", st)
	}
	if st := got["once"]; st == nil || st.State != "done" || !st.Done || st.DoneTTLMillis <= 0 {
		t.Errorf("once: %+v; want done with a period", st)
	}
	if len(sts) != 4 {
		t.Errorf("got %d primitives, want 4", len(sts))
	}
	for _, st := range sts {
		t.Logf("%+v", *st)
	}
}

// TestInspectReadsWaiters queues a waiter on a Mutex and on a Semaphore and
// reads them back: owner, permits asked, place; never the secret that a
// queued call gave the script.
func TestInspectReadsWaiters(t *testing.T) {
	ctx, rdb, c, name := heldName(t)
	const mutexWaiter, semWaiter = "mutex-waiter", "semaphore-waiter"
	wctx, wcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = c.Mutex(name).Lock(dsync.WithOwnerToken(wctx, mutexWaiter))
	}()
	go func() {
		defer wg.Done()
		_ = c.Semaphore(name, 4).Acquire(dsync.WithOwnerToken(wctx, semWaiter), 2)
	}()
	defer wg.Wait()
	defer wcancel()

	got := map[string]*lockState{}
	deadline := time.Now().Add(10 * time.Second)
	for got["mutex"] == nil || got["mutex"].WaitersTotal != 1 || got["semaphore"] == nil || got["semaphore"].WaitersTotal != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("waiters not queued: mutex %+v, semaphore %+v", got["mutex"], got["semaphore"])
		}
		time.Sleep(10 * time.Millisecond)
		sts, err := inspect(ctx, rdb, dsync.DefaultPrefix, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range sts {
			got[st.Mode] = st
		}
	}
	if w := got["mutex"].Waiters; len(w) != 1 || w[0].Owner != mutexWaiter || w[0].PlaceMillis <= 0 || w[0].WaitedMillis < 0 {
		t.Errorf("mutex waiters = %+v; want %q with a place", w, mutexWaiter)
	}
	if w := got["semaphore"].Waiters; len(w) != 1 || w[0].Owner != semWaiter || w[0].N != 2 || w[0].PlaceMillis <= 0 {
		t.Errorf("semaphore waiters = %+v; want %q asking 2 permits, with a place", w, semWaiter)
	}

	var out bytes.Buffer
	for _, st := range got {
		writeState(&out, st)
		if err := writeJSON(&out, st); err != nil {
			t.Fatal(err)
		}
	}
	mk, sk := keys.ForMutex(dsync.DefaultPrefix, name), keys.ForSemaphore(dsync.DefaultPrefix, name)
	for _, k := range []string{mk.QueueData, sk.QueueData} {
		data, err := rdb.HGetAll(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range data {
			// Mutex "<deadline> <ttl> <call id> <secret>", Semaphore
			// "<deadline> <ttl> <n> <secret> <token>".
			if f := strings.Fields(d); len(f) < 4 || strings.Contains(out.String(), f[3]) {
				t.Errorf("queue data %q: no secret, or the output shows it:\n%s", d, out.String())
			}
		}
	}
}

// braceNames contain or begin with a brace, or look like how another name
// is stored ("=fXg" is the stored form of "}x").
var braceNames = []string{"}x", "{", "}", "{}", "a{b}c", "{x}", "=fXg", "fXg", "x"}

// TestInspectListsBraceNames holds a Mutex under each brace name and finds
// the names again, as they were given, with list's scan and inspect, on a
// real server and the cluster.
func TestInspectListsBraceNames(t *testing.T) {
	var bs []redistest.Backend
	if b, ok := redistest.Real(t); ok {
		bs = append(bs, b)
	}
	if b, ok := redistest.Cluster(t); ok {
		bs = append(bs, b)
	}
	if len(bs) == 0 {
		t.Skip("no redis-server")
	}
	for _, b := range bs {
		t.Run(b.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rdb := b.NewClient(t)
			prefix := redistest.Key(t)
			c := dsync.New(rdb, dsync.Prefix(prefix))
			defer c.Close()
			for _, name := range braceNames {
				m := c.Mutex(name)
				if err := m.Lock(ctx); err != nil {
					t.Fatalf("Lock(%q): %v", name, err)
				}
				defer m.Unlock(ctx)
			}
			for pattern, want := range map[string][]string{
				"*":     {"=fXg", "a{b}c", "fXg", "x", "{", "{x}", "{}", "}", "}x"},
				"}*":    {"}", "}x"},
				"{*":    {"{", "{x}", "{}"},
				"*}":    {"{x}", "{}", "}"},
				"?x":    {"}x"},
				"a{b}c": {"a{b}c"},
				"=*":    {"=fXg"},
				"fX?":   {"fXg"},
			} {
				got, truncated, err := scanNames(ctx, rdb, prefix, pattern, 100)
				if err != nil || truncated || !slices.Equal(got, want) {
					t.Errorf("scanNames(%q) = %q, %v, %v; want %q", pattern, got, truncated, err, want)
				}
			}
			for _, name := range braceNames {
				sts, err := inspect(ctx, rdb, prefix, name)
				if err != nil {
					t.Fatal(err)
				}
				if len(sts) != 1 || sts[0].Name != name || sts[0].Mode != "mutex" || sts[0].State != "held" {
					t.Errorf("inspect(%q) = %+v; want one held mutex of that name", name, sts)
				}
			}
		})
	}
}

// TestInspectGlobMatchesRedis checks globMatch against the patterns of a
// real server's SCAN MATCH.
func TestInspectGlobMatchesRedis(t *testing.T) {
	names := []string{"", "a", "ab", "abc", "b", "}x", "{", "}", "{}", "a{b}c", "[", "]", "^", "-", "*", "?", "\\",
		"a*", "a-c", "x]y", "日本"}
	patterns := []string{"*", "a*", "*c", "a?", "?", "[ab]", "[^a]*", "[a-b]*", "[b-a]", "[]]", "[", "[a", "\\*",
		"\\[", "a\\", "*\\}*", "[\\]]*", "**b*", "*{*}*", "?*?", "[*]", "a[-]c", "[!a]", "日*"}
	static := map[[2]string]bool{
		{"*", "ab"}: true, {"a?", "ab"}: true, {"a?", "a"}: false, {"[^a]*", "b"}: true, {"[^a]*", "ab"}: false,
		{"[a-b]*", "abc"}: true, {"[b-a]", "a"}: true, {"\\*", "*"}: true, {"\\*", "a"}: false, {"[", "["}: false,
		{"*\\}*", "}x"}: true, {"a[-]c", "a-c"}: true,
	}
	for k, want := range static {
		if got := globMatch(k[0], k[1]); got != want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", k[0], k[1], got, want)
		}
	}
	b, ok := redistest.Real(t)
	if !ok {
		t.Skip("no redis-server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := b.NewClient(t)
	prefix := redistest.Key(t) + ":"
	for _, n := range names {
		if err := rdb.Set(ctx, prefix+n, 1, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range patterns {
		var fromRedis []string
		iter := rdb.Scan(ctx, 0, prefix+p, 1000).Iterator()
		for iter.Next(ctx) {
			fromRedis = append(fromRedis, strings.TrimPrefix(iter.Val(), prefix))
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		var local []string
		for _, n := range names {
			if globMatch(p, n) {
				local = append(local, n)
			}
		}
		slices.Sort(fromRedis)
		slices.Sort(local)
		if !slices.Equal(local, fromRedis) {
			t.Errorf("pattern %q: globMatch matches %q, Redis %q", p, local, fromRedis)
		}
	}
}

// TestListSkipsForeignData: a name whose keys hold data dsync did not
// write (here a string where the lock hash belongs) is reported on stderr
// and the other names are still listed, with exit status 1.
//
// Before: list stopped at the first such name and printed nothing else
// (exit 1, stdout empty), so one foreign key hid every lock. After: the
// held lock is listed, stderr names the bad one.
func TestListSkipsForeignData(t *testing.T) {
	b, ok := redistest.Real(t)
	if !ok {
		t.Skip("no redis-server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := b.NewClient(t)
	prefix := redistest.Key(t)
	c := dsync.New(rdb, dsync.Prefix(prefix))
	defer c.Close()
	m := c.Mutex("b-held")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Unlock(ctx)
	bad := keys.ForMutex(prefix, "a-foreign").Lock
	if err := rdb.Set(ctx, bad, "not a hash", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"list"}, {"list", "-json"}} {
		var stdout, stderr bytes.Buffer
		code := Main(append(args, "-redis", "redis://"+b.Addrs[0], "-prefix", prefix), &stdout, &stderr)
		if code != exitError || !strings.Contains(stdout.String(), "b-held") ||
			strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "a-foreign") {
			t.Errorf("dsync %q: code %d, stdout %q, stderr %q; want %d, b-held listed, one line on a-foreign",
				args, code, stdout.String(), stderr.String(), exitError)
		}
	}
}

// TestInspectReportsForeignTypes: a key of a name that holds the wrong
// type is reported (exit 1), also when a key read before it in the same
// pipeline does not exist.
//
// Before: the pipeline's first failure, redis.Nil of the missing fence
// hash or runner field, was taken for the only one: a list where the Mutex
// queue belongs read as "free, 0 queued" and a string where a Once's done
// mark belongs as "idle", exit 0. After: both are errors naming the type.
func TestInspectReportsForeignTypes(t *testing.T) {
	b, ok := redistest.Real(t)
	if !ok {
		t.Skip("no redis-server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := b.NewClient(t)
	prefix := redistest.Key(t)
	if err := rdb.RPush(ctx, keys.ForMutex(prefix, "q").Queue, "x").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, keys.ForOnce(prefix, "o").Done, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rdb.Del(context.Background(), keys.ForMutex(prefix, "q").Queue, keys.ForOnce(prefix, "o").Done)
	})
	for _, name := range []string{"q", "o"} {
		var stdout, stderr bytes.Buffer
		code := Main([]string{"inspect", "-redis", "redis://" + b.Addrs[0], "-prefix", prefix, name}, &stdout, &stderr)
		if code != exitError || !strings.Contains(stderr.String(), "WRONGTYPE") {
			t.Errorf("inspect %q: code %d, stdout %q, stderr %q; want %d and WRONGTYPE", name, code, stdout.String(), stderr.String(), exitError)
		}
	}
}
