package dsync_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
)

func ExampleRWMutex() {
	srv, _ := miniredis.Run() // any Redis: single node, cluster or sentinel
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	c := dsync.New(rdb)
	defer c.Close()
	ctx := context.Background()

	rw := c.RWMutex("config")

	// Any number of readers, each with its own lease.
	_ = rw.RLock(ctx)
	_ = rw.RLock(ctx)
	ok, _ := c.RWMutex("config").TryLock(ctx)
	fmt.Println("writer gets it while two read:", ok)
	_ = rw.RUnlock(ctx)
	_ = rw.RUnlock(ctx)

	// One writer; its hold carries a fencing token.
	if err := rw.Lock(ctx); err != nil {
		fmt.Println("lock:", err)
		return
	}
	lease, _ := rw.Lease(ctx)
	fmt.Println("writing with a fencing token:", lease.Token() > 0)
	ok, _ = c.RWMutex("config").TryRLock(ctx)
	fmt.Println("reader gets it while one writes:", ok)
	_ = rw.Unlock(ctx)
	// Output:
	// writer gets it while two read: false
	// writing with a fencing token: true
	// reader gets it while one writes: false
}

// An owner that writes may read too and then stop writing, keeping the read
// (a downgrade); asking to write while reading is refused at once.
func ExampleRWMutex_RLock_downgrade() {
	srv, _ := miniredis.Run()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	c := dsync.New(rdb)
	defer c.Close()

	ctx := dsync.WithOwner(context.Background())
	rw := c.RWMutex("config")
	_ = rw.Lock(ctx)   // write the new config...
	_ = rw.RLock(ctx)  // ...take a read hold while still writing...
	_ = rw.Unlock(ctx) // ...and let other readers in, still reading.

	ok, _ := c.RWMutex("config").TryRLock(context.Background())
	fmt.Println("another reader gets in:", ok)
	err := rw.Lock(ctx)
	fmt.Println("write while reading:", errors.Is(err, dsync.ErrUpgrade))
	_ = rw.RUnlock(ctx)
	// Output:
	// another reader gets in: true
	// write while reading: true
}
