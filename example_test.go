package dsync_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
)

func ExampleMutex_Lock() {
	srv, _ := miniredis.Run() // any Redis: single node, cluster or sentinel
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()

	c := dsync.New(rdb)
	defer c.Close()
	ctx := context.Background()

	m := c.Mutex("orders:42")
	if err := m.Lock(ctx); err != nil {
		fmt.Println("lock:", err)
		return
	}
	// Only one process at a time gets here.
	fmt.Println("writing order 42")
	if err := m.Unlock(ctx); err != nil {
		fmt.Println("unlock:", err)
	}
	// Output: writing order 42
}

func ExampleWithOwner() {
	srv, _ := miniredis.Run()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	c := dsync.New(rdb)
	defer c.Close()

	ctx := dsync.WithOwner(context.Background()) // this ctx is one owner
	m := c.Mutex("orders:42")
	_ = m.Lock(ctx)
	_ = m.Lock(ctx) // the same owner re-enters

	other := dsync.WithOwner(context.Background())
	ok, _ := m.TryLock(other)
	fmt.Println("another owner gets it:", ok)

	_ = m.Unlock(ctx)
	_ = m.Unlock(ctx) // released on the last Unlock
	ok, _ = m.TryLock(other)
	fmt.Println("after two unlocks:", ok)
	_ = m.Unlock(other)
	// Output:
	// another owner gets it: false
	// after two unlocks: true
}

func ExampleMutex_Lease() {
	srv, _ := miniredis.Run()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	c := dsync.New(rdb)
	defer c.Close()
	ctx := context.Background()

	m := c.Mutex("report")
	_ = m.Lock(ctx)
	lease, _ := m.Lease(ctx)
	// Hand lease.Token() to storage that rejects stale writers, and stop
	// working when lease.Done() closes.
	select {
	case <-lease.Done():
		fmt.Println("lost:", lease.Err())
	default:
		fmt.Println("held, token > 0:", lease.Token() > 0)
	}
	_ = m.Unlock(ctx)
	<-lease.Done()
	fmt.Println("after Unlock:", lease.Err())
	// Output:
	// held, token > 0: true
	// after Unlock: <nil>
}

func ExampleMutex_TryLock() {
	srv, _ := miniredis.Run()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	c := dsync.New(rdb)
	defer c.Close()

	// The noon lottery: whichever replica gets the lock draws; the others
	// skip this round instead of waiting for it.
	replicaA, replicaB := dsync.WithOwner(context.Background()), dsync.WithOwner(context.Background())
	m := c.Mutex("lottery:noon")
	for _, r := range []struct {
		name string
		ctx  context.Context
	}{{"A", replicaA}, {"B", replicaB}} {
		ok, err := m.TryLock(r.ctx)
		switch {
		case err != nil:
			fmt.Println(r.name, "could not try:", err)
		case ok:
			fmt.Println(r.name, "draws")
		default:
			fmt.Println(r.name, "skips")
		}
	}
	_ = m.Unlock(replicaA)

	// Unlock by an owner that does not hold it is an error, not a panic.
	err := m.Unlock(replicaB)
	fmt.Println(errors.Is(err, dsync.ErrNotHeld))
	// Output:
	// A draws
	// B skips
	// true
}

func ExampleNewQuorum() {
	// Three independent masters (here in-process servers); a hold needs a
	// majority of them.
	var rdbs []redis.UniversalClient
	for range 3 {
		srv, _ := miniredis.Run()
		defer srv.Close()
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer rdb.Close()
		rdbs = append(rdbs, rdb)
	}
	q := dsync.NewQuorum(rdbs)
	defer q.Close()
	ctx := context.Background()

	m := q.Mutex("migration")
	if err := m.Lock(ctx); err != nil {
		fmt.Println("lock:", err) // errors.Is(err, dsync.ErrNoQuorum) when too few answer
		return
	}
	lease, _ := m.Lease(ctx)
	fmt.Println("held on a majority, token > 0:", lease.Token() > 0)
	if err := m.Unlock(ctx); err != nil {
		fmt.Println("unlock:", err)
	}
	// Output: held on a majority, token > 0: true
}
