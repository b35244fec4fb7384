package dsync_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
)

// At noon every replica of a service wakes up to draw the day's 10 lottery
// winners. Only one may draw; all of them announce the same winners.
func ExampleOnce_DoValue() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	ctx := context.Background()

	const replicas = 5
	winners := make([][]int, replicas)
	var wg sync.WaitGroup
	var mu sync.Mutex
	drawn := 0 // how many replicas drew
	for r := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each replica is its own process with its own Redis client.
			rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			defer rdb.Close()
			c := dsync.New(rdb)
			defer c.Close()

			// One Once per day; the mark outlives the day, then expires.
			lottery := c.Once("lottery:2025-06-01", dsync.Period(48*time.Hour))
			b, err := lottery.DoValue(ctx, func(ctx context.Context) ([]byte, error) {
				mu.Lock()
				drawn++
				mu.Unlock()
				rng := rand.New(rand.NewPCG(2025, 601))
				return json.Marshal(rng.Perm(1000)[:10])
			})
			if err != nil {
				fmt.Println("replica", r, "failed:", err)
				return
			}
			if err := json.Unmarshal(b, &winners[r]); err != nil {
				panic(err)
			}
		}()
	}
	wg.Wait()

	fmt.Println("draws:", drawn)
	for r, w := range winners {
		fmt.Println("replica", r, "announces", w)
	}
	// Output:
	// draws: 1
	// replica 0 announces [259 929 207 158 272 842 821 701 48 400]
	// replica 1 announces [259 929 207 158 272 842 821 701 48 400]
	// replica 2 announces [259 929 207 158 272 842 821 701 48 400]
	// replica 3 announces [259 929 207 158 272 842 821 701 48 400]
	// replica 4 announces [259 929 207 158 272 842 821 701 48 400]
}

// The schema migration runs in one replica; the others wait until it
// succeeded and then go on without running it.
func ExampleOnce_Do() {
	srv, _ := miniredis.Run()
	defer srv.Close()
	ctx := context.Background()

	var wg sync.WaitGroup
	var runs atomic.Int32
	for replica := 0; replica < 3; replica++ {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer rdb.Close()
		c := dsync.New(rdb)
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Once("migrate-v42").Do(ctx, func(ctx context.Context) error {
				runs.Add(1) // ALTER TABLE ...
				return nil
			})
			if err != nil {
				fmt.Println("migration:", err)
			}
		}()
	}
	wg.Wait()
	fmt.Println("migrations run:", runs.Load())
	// Output: migrations run: 1
}
