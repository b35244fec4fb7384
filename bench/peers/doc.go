// Package peers compares dsync's Mutex with github.com/go-redsync/redsync/v4
// and github.com/bsm/redislock, and with the raw floor for a correct Redis
// lock, in one run on one redis-server (and, with CLUSTER=1 bench/run.sh,
// on a 3-master Redis Cluster too). It is its own module so that the peers
// stay out of dsync's go.mod; bench/run.sh runs it and prints the table.
// The benchmark code is dsync's internal/lockbench, the same that dsync's
// own benchmarks use.
package peers
