package dsync

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/lua"
)

// The scripts dsync runs, built once from lua/. Those on a hot path are
// wrapped (see script) so that a call boxes only its own arguments.
var (
	mutexLock   = newScript(lua.Script("mutex_lock"))
	mutexUnlock = newScript(lua.Script("mutex_unlock"))
	// Renewals (one script per hold kind) take one hold or many; see
	// renewSpec.
	mutexRenew = lua.Script("mutex_renew")

	rwLock   = newScript(lua.Script("rwmutex_lock"))
	rwUnlock = newScript(lua.Script("rwmutex_unlock"))
	// The write hold's renewal is mutex_renew (a field of the writer hash).
	rwRRenew = lua.Script("rwmutex_rrenew")

	semAcquire = newScript(lua.Script("semaphore_acquire"))
	semRelease = newScript(lua.Script("semaphore_release"))
	semAbandon = newScript(lua.Script("semaphore_abandon"))
	semRenew   = lua.Script("semaphore_renew")

	onceDo      = newScript(lua.Script("once_do"))
	onceRelease = newScript(lua.Script("once_release"))
	onceReset   = newScript(lua.Script("once_reset"))
	onceRenew   = lua.Script("once_renew")
)

// A script is a Lua script with its SHA boxed once, run by EVALSHA and
// loaded on NOSCRIPT. It builds the command itself rather than through
// redis.Script.Run so that a call boxes only its own arguments.
type script struct {
	s   *redis.Script
	sha any
}

func newScript(s *redis.Script) *script { return &script{s: s, sha: s.Hash()} }

// boxKeys returns the key count and keys of a script call as arguments,
// boxed once for a handle's lifetime.
func boxKeys(keys []string) []any {
	out := make([]any, 0, len(keys)+1)
	out = append(out, len(keys))
	for _, k := range keys {
		out = append(out, k)
	}
	return out
}

// eval runs sc with the pre-boxed keys (see boxKeys) and args in one round
// trip, loading the script first when the server does not know it. An
// error the script raised on foreign data matches ErrCorrupt (see
// scriptError).
func (c *Client) eval(ctx context.Context, sc *script, keys []any, args ...any) *redis.Cmd {
	return c.evalCall(ctx, sc, scriptCall(sc, keys, args...))
}

// scriptCall returns the command that runs sc with the pre-boxed keys (see
// boxKeys) and args. A call that may be sent more than once (the attempts
// of one acquisition) builds it once; it is never changed once sent.
func scriptCall(sc *script, keys []any, args ...any) []any {
	a := make([]any, 0, 2+len(keys)+len(args))
	a = append(a, "evalsha", sc.sha)
	a = append(a, keys...)
	return append(a, args...)
}

// evalCall is eval for a command built by scriptCall. It returns when ctx
// ends, also while the server holds the command (see within). It goes out
// at once, or with other calls of c in one pipeline while earlier calls are
// in flight (see maxFlight).
func (c *Client) evalCall(ctx context.Context, sc *script, a []any) *redis.Cmd {
	if !c.enter(nil) {
		return c.evalQueued(ctx, sc, a)
	}
	return c.evalAlone(ctx, sc, a)
}

// evalAlone is evalCall for a call counted in flight (see batcher.enter),
// sent alone; its flight ends when its reply comes.
func (c *Client) evalAlone(ctx context.Context, sc *script, a []any) *redis.Cmd {
	if ctx.Done() == nil || ctx.Err() != nil || !c.calls.add() {
		// Nothing can end ctx, or it has ended (go-redis returns at
		// once), or c is closed.
		defer c.leave()
		return c.evalNow(ctx, sc, a)
	}
	e := evalCalls.Get().(*evalCall)
	e.c, e.ctx, e.sc, e.a = c, ctx, sc, a
	go e.run()
	if !awaitCall(ctx, e.done) {
		// The call goes on without its caller; e is not used again.
		cmd := redis.NewCmd(ctx, a...)
		cmd.SetErr(ctx.Err())
		return cmd
	}
	return e.reuse()
}

// evalNow is evalCall, returning when go-redis does.
func (c *Client) evalNow(ctx context.Context, sc *script, a []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, a...)
	if err := c.rdb.Process(ctx, cmd); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err := sc.s.Load(ctx, c.rdb).Err(); err != nil {
			// The script did not run: the caller learns why loading it
			// failed (its ctx ended, the server went away), not the
			// NOSCRIPT that asked for the load.
			cmd.SetErr(err)
			return cmd
		}
		cmd = redis.NewCmd(ctx, a...)
		_ = c.rdb.Process(ctx, cmd)
	}
	if err := cmd.Err(); err != nil {
		// Foreign data in the keys made the script fail: ErrCorrupt, for
		// every script and every caller.
		cmd.SetErr(scriptError(err))
	}
	return cmd
}
