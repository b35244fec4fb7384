package main

import (
	"context"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// TestInspectReadsEveryLayout holds each primitive under one name and reads
// them back with inspect, in process.
func TestInspectReadsEveryLayout(t *testing.T) {
	b, ok := redistest.Real(t)
	if !ok {
		t.Skip("no redis-server")
	}
	rdb := b.NewClient(t)
	c := dsync.New(rdb)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := redistest.Key(t)

	m := c.Mutex(name)
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Unlock(ctx)
	rw := c.RWMutex(name)
	if err := rw.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	defer rw.RUnlock(ctx)
	s := c.Semaphore(name, 4)
	if err := s.Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx, 3)
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
