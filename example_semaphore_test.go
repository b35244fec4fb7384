package dsync_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
)

// At most 4 jobs' worth of GPUs in use across every replica: a training job
// takes 3, an inference job that needs 2 waits until they are released.
func ExampleSemaphore() {
	srv, _ := miniredis.Run()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	c := dsync.New(rdb)
	defer c.Close()
	ctx := context.Background()

	training := c.Semaphore("gpu", 4)  // in one replica
	inference := c.Semaphore("gpu", 4) // in another

	if err := training.Acquire(ctx, 3); err != nil {
		fmt.Println("acquire:", err)
		return
	}
	fmt.Println("training on 3 GPUs")
	ok, _ := inference.TryAcquire(ctx, 2)
	fmt.Println("inference gets 2 GPUs at once:", ok)

	done := make(chan error)
	go func() { done <- inference.Acquire(ctx, 2) }() // waits in line
	_ = training.Release(ctx, 3)
	if err := <-done; err != nil {
		fmt.Println("acquire:", err)
		return
	}
	fmt.Println("inference on 2 GPUs")
	_ = inference.Release(ctx, 2)

	// Asking for more than the pool has is an error, not a wait forever.
	err := inference.Acquire(ctx, 5)
	fmt.Println("5 of 4 GPUs:", err != nil)
	// Output:
	// training on 3 GPUs
	// inference gets 2 GPUs at once: false
	// inference on 2 GPUs
	// 5 of 4 GPUs: true
}

// The lease of a holding tells the holder if its permits are lost, and its
// fencing token lets storage reject a holder that lost them.
func ExampleSemaphore_Lease() {
	srv, _ := miniredis.Run()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	c := dsync.New(rdb)
	defer c.Close()
	ctx := context.Background()

	gpus := c.Semaphore("gpu", 4)
	_ = gpus.Acquire(ctx, 1)
	l, _ := gpus.Lease(ctx)
	fmt.Println("fencing token:", l.Token() > 0)
	_ = gpus.Release(ctx, 1)
	<-l.Done()
	fmt.Println("released, lost:", l.Err() != nil)
	// Output:
	// fencing token: true
	// released, lost: false
}
