package peers

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/internal/lockbench"
)

// Leases as the peers document them: redsync's default expiry is 8 s;
// redislock has no default, and dsync's default lease is 30 s.
const redislockTTL = 30 * time.Second

// Redsync is redsync's Mutex on one pool (one Redis, quorum 1). With no
// options it uses its defaults: 32 tries, a random 50–250 ms delay between
// tries, 8 s expiry.
func Redsync(name string, opts ...redsync.Option) lockbench.Lib {
	return lockbench.Lib{Name: name, Open: func(rdb redis.UniversalClient) (func(string) lockbench.Locker, func()) {
		rs := redsync.New(goredis.NewPool(rdb))
		return func(key string) lockbench.Locker {
			return redsyncLock{rs.NewMutex(key, opts...)}
		}, func() {}
	}}
}

type redsyncLock struct{ m *redsync.Mutex }

func (l redsyncLock) Lock(ctx context.Context) error { return l.m.LockContext(ctx) }

func (l redsyncLock) Unlock(ctx context.Context) error {
	ok, err := l.m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock failed")
	}
	return err
}

// Redislock is redislock's Obtain/Release with a fresh retry strategy per
// Obtain (strategies such as LimitRetry keep state).
func Redislock(name string, retry func() redislock.RetryStrategy) lockbench.Lib {
	return lockbench.Lib{Name: name, Open: func(rdb redis.UniversalClient) (func(string) lockbench.Locker, func()) {
		c := redislock.New(rdb)
		return func(key string) lockbench.Locker {
			return &redislockLock{c: c, key: key, retry: retry}
		}, func() {}
	}}
}

type redislockLock struct {
	c     *redislock.Client
	key   string
	retry func() redislock.RetryStrategy
	l     *redislock.Lock
}

func (l *redislockLock) Lock(ctx context.Context) error {
	lock, err := l.c.Obtain(ctx, l.key, redislockTTL, &redislock.Options{RetryStrategy: l.retry()})
	if err != nil {
		return err
	}
	l.l = lock
	return nil
}

func (l *redislockLock) Unlock(ctx context.Context) error { return l.l.Release(ctx) }

// Retry settings. redislock's default is NoRetry, which cannot wait; its
// README's example retries every 100 ms, which is taken as its documented
// default for a blocking lock (without the example's limit of 3 tries, so
// that a Lock waits until it gets the lock). The aggressive variants poll
// every millisecond with tries for far longer than any wait here.
var (
	redsyncDefault   = Redsync("redsync")
	redsyncFast      = Redsync("redsync-1ms", redsync.WithRetryDelay(time.Millisecond), redsync.WithTries(1_000_000))
	redislockDefault = Redislock("redislock", func() redislock.RetryStrategy { return redislock.LinearBackoff(100 * time.Millisecond) })
	redislockFast    = Redislock("redislock-1ms", func() redislock.RetryStrategy { return redislock.LinearBackoff(time.Millisecond) })
	uncontendedLibs  = []lockbench.Lib{lockbench.Raw(), lockbench.Dsync(), redsyncDefault, redislockDefault}
	contendedLibs    = []lockbench.Lib{lockbench.Dsync(), redsyncDefault, redsyncFast, redislockDefault, redislockFast}
	distinctNames    = 1000
	distinctWorkers  = 16
	contendedClients = 4
	contendedWorkers = []int{8, 32}
)

func dial(b *testing.B) lockbench.Dial {
	d, ok := lockbench.EnvDial()
	if !ok {
		b.Skipf("needs a redis-server at $%s or a cluster at $%s; bench/run.sh starts them", lockbench.AddrEnv, lockbench.ClusterEnv)
	}
	return d
}

var keySeq int

func key(b *testing.B) string {
	keySeq++
	return fmt.Sprintf("peers:%s:%d:%d", b.Name(), time.Now().UnixNano(), keySeq)
}

// BenchmarkUncontended is one Lock+Unlock pair with nobody else around.
func BenchmarkUncontended(b *testing.B) {
	for _, lib := range uncontendedLibs {
		b.Run("lib="+lib.Name, func(b *testing.B) {
			lockbench.Uncontended(b, lib, dial(b), key(b))
		})
	}
}

// BenchmarkDistinct is Lock+Unlock pairs over 1000 distinct names from 16
// goroutines on one go-redis client.
func BenchmarkDistinct(b *testing.B) {
	for _, lib := range uncontendedLibs {
		b.Run("lib="+lib.Name, func(b *testing.B) {
			lockbench.Distinct(b, lib, dial(b), key(b), distinctNames, distinctWorkers)
		})
	}
}

// BenchmarkContended is one name fought over by G goroutines spread over 4
// go-redis clients, for a fixed window per iteration (run with
// -benchtime=1x).
func BenchmarkContended(b *testing.B) {
	for _, lib := range contendedLibs {
		for _, g := range contendedWorkers {
			b.Run(fmt.Sprintf("lib=%s/G=%d", lib.Name, g), func(b *testing.B) {
				lockbench.Contended(b, lib, dial(b), key(b), contendedClients, g)
			})
		}
	}
}
