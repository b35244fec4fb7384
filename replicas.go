package dsync

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// WaitReplicas makes every acquire wait until n replicas have acknowledged
// it, for at most timeout. Mutex sends Redis's WAIT n timeout on the same
// connection right after its lock script (one pipelined round trip; a hold
// handed over to a waiter costs one more). RWMutex, Semaphore and Once
// (before f runs) confirm a grant with one more round trip: a renewal and
// WAIT in one pipeline, whose acknowledgement covers the grant too. An
// acquire that fewer replicas acknowledged releases what it took and fails
// with [ErrNotReplicated].
//
// Without it, a hold taken on a master just before a failover may be
// missing on the promoted replica, and another process may then take it
// while the first still believes it holds it (its [Lease] reports
// [ErrLeaseLost] at its next renewal). With it, a failover to an
// acknowledging replica keeps every hold that Lock reported; WAIT does not
// make Redis strongly consistent (a replica that acknowledged may not be the
// one promoted, and a hold renewed or released later is not waited for).
// n = 0 (the default) waits for nothing; n must not be negative and timeout
// must be at least 1 ms. On Redis Cluster, WAIT goes to the master of the
// primitive's slot.
func WaitReplicas(n int, timeout time.Duration) Option {
	return func(cfg *config) {
		switch {
		case n < 0:
			cfg.fail("WaitReplicas n %d, want ≥ 0", n)
		case n > 0 && timeout < time.Millisecond:
			cfg.fail("WaitReplicas timeout %v, want at least 1ms", timeout)
		default:
			cfg.replicas, cfg.replicaWait = n, timeout
		}
	}
}

// acquirePair runs a call of an acquire script built by scriptCall, whose
// reply is {code, value}, code 1 or 2 for a grant, and decodes the reply
// (see pair; what names the script in errors). With WaitReplicas, WAIT
// follows in the same pipeline, and a grant fewer replicas acknowledged is
// reported as ErrNotReplicated, so that the caller releases it as after
// any failed call.
//
// The last argument of a is the attempt's bound (see clock.go), set here
// for every attempt; an attempt that arrives after it is sent again, after
// the Client's estimate of the server's clock is corrected.
func (c *Client) acquirePair(ctx context.Context, cfg *config, sc *script, what string, a []any) (pairReply, error) {
	return bounded(&c.clock, what, func(bound any) (pairReply, int64, bool, error) {
		a[len(a)-1] = bound
		r, err := c.acquirePairOnce(ctx, cfg, sc, what, a)
		return r, r.v, err == nil && r.code == codeStale, err
	})
}

// acquirePairOnce is one attempt of acquirePair.
func (c *Client) acquirePairOnce(ctx context.Context, cfg *config, sc *script, what string, a []any) (pairReply, error) {
	if cfg.replicas == 0 {
		return pair(what, c.evalCall(ctx, sc, a))
	}
	key := a[3].(string) // the first key, after EVALSHA, the SHA and the key count
	cmd, acked, err := c.evalWait(ctx, cfg, key, sc, a)
	if err != nil {
		return pairReply{}, scriptError(err)
	}
	r, err := pair(what, cmd)
	if err != nil {
		return pairReply{}, err
	}
	if (r.code == 1 || r.code == 2) && acked < int64(cfg.replicas) {
		return r, notReplicated(acked, cfg.replicas)
	}
	return r, nil
}

// replicated makes sure a hold obtained without an acquire round trip of
// this caller (handed over by another process's release) reached enough
// replicas: it renews the hold, a write, and waits for it with WAIT, whose
// acknowledgement covers every earlier write to the master. It returns
// ErrNotReplicated, or ErrLeaseLost if the renewal found the hold gone.
func (c *Client) replicated(ctx context.Context, cfg *config, renew *redis.Script, keys []string, args ...any) error {
	if cfg.replicas == 0 {
		return nil
	}
	sc := newScript(renew)
	cmd, acked, err := c.evalWait(ctx, cfg, keys[0], sc, scriptCall(sc, boxKeys(keys), args...))
	if err != nil {
		return err
	}
	// A renew script takes many holds; this is a batch of one.
	vs, err := cmd.Int64Slice()
	switch {
	case err != nil:
		return err
	case len(vs) != 1 || vs[0] != 1:
		return ErrLeaseLost
	case acked < int64(cfg.replicas):
		return notReplicated(acked, cfg.replicas)
	}
	return nil
}

func notReplicated(acked int64, want int) error {
	return fmt.Errorf("%w: %d of %d", ErrNotReplicated, acked, want)
}

// evalWait sends EVALSHA and WAIT in one pipeline on one connection to the
// master of key. Pipelines get no NOSCRIPT fallback: on NOSCRIPT it loads the
// script and sends the pipeline again.
func (c *Client) evalWait(ctx context.Context, cfg *config, key string, sc *script, a []any) (cmd *redis.Cmd, acked int64, err error) {
	if !c.within(ctx, func() { cmd, acked, err = c.evalWaitNow(ctx, cfg, key, sc, a) }) {
		return nil, 0, ctx.Err()
	}
	return cmd, acked, err
}

// evalWaitNow is evalWait, returning when go-redis does.
func (c *Client) evalWaitNow(ctx context.Context, cfg *config, key string, sc *script, a []any) (*redis.Cmd, int64, error) {
	var rdb redis.Cmdable = c.rdb
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		// WAIT has no key: send both to the slot's master on one connection.
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return nil, 0, err
		}
		rdb = m
	}
	start := time.Now()
	for i := range 2 {
		// After NOSCRIPT, the WAIT behind the failed EVALSHA has waited
		// already: the second one gets what is left of the timeout (ms
		// makes it at least 1 ms; WAIT 0 would wait forever), so that the
		// acquire waits for at most the timeout, as WaitReplicas says.
		timeout := cfg.replicaWait
		if i > 0 {
			timeout -= time.Since(start)
		}
		pipe := rdb.Pipeline()
		cmd := redis.NewCmd(ctx, a...)
		_ = pipe.Process(ctx, cmd)
		wait := redis.NewIntCmd(ctx, "wait", cfg.replicas, ms(timeout))
		_ = pipe.Process(ctx, wait)
		_, _ = pipe.Exec(ctx)
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if err := sc.s.Load(ctx, rdb).Err(); err != nil {
				return nil, 0, err
			}
			continue
		}
		if err := cmd.Err(); err != nil {
			return nil, 0, scriptError(err)
		}
		acked, err := wait.Result()
		if err != nil {
			// The script ran; its effect is unknown to replicas.
			return cmd, 0, err
		}
		return cmd, acked, nil
	}
	return nil, 0, fmt.Errorf("dsync: script not loaded on %s", key)
}
