package dsync

import (
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// lateCopiesAfter reads when go-redis may have sent a command twice from
// the client's own settings: its read timeout, and never when it does not
// time reads out or does not retry; 0 (every slow call counts) for a client
// it does not know. A wrong figure here would silently turn off the record
// of slow Once done checks (see Once.attempt).
func TestLateCopiesAfter(t *testing.T) {
	const never = time.Duration(math.MaxInt64)
	addr := "127.0.0.1:1" // nothing is dialled
	type wrapped struct{ *redis.Client }
	cases := []struct {
		name string
		rdb  redis.UniversalClient
		want time.Duration
	}{
		{"default client", redis.NewClient(&redis.Options{Addr: addr}), 5 * time.Second},
		{"read timeout 200ms", redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 200 * time.Millisecond}), 200 * time.Millisecond},
		{"no retries", redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1}), never},
		{"no read timeout", redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: -1}), never},
		{"no read deadline", redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: -2}), never},
		{"default cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}}), 5 * time.Second},
		{"cluster read timeout 300ms", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ReadTimeout: 300 * time.Millisecond}), 300 * time.Millisecond},
		{"unknown client type", wrapped{redis.NewClient(&redis.Options{Addr: addr})}, 0},
	}
	for _, c := range cases {
		t.Cleanup(func() { c.rdb.Close() })
		if got := lateCopiesAfter(c.rdb); got != c.want {
			t.Errorf("%s: lateCopiesAfter = %v, want %v", c.name, got, c.want)
		}
	}
}
