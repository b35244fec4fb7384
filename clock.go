package dsync

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Late copies of an acquiring attempt. go-redis may send an attempt again
// after a read timeout while its first copy is still on its way, and a
// network may hold a copy back for longer still. The scripts remember a
// call's id for the replay window (60 s, lib.lua's REPLAY_MS) from the
// call's effect or abandon; a copy that arrived after that would act as a
// new call and take a hold that nobody renews or releases. So every
// attempt of a lock, acquire, Do or Reset script carries a bound, in
// server time, after which it takes nothing: the server time at which it
// was sent, as the Client estimates it, plus attemptValid. The script
// answers an attempt that arrives after its bound, or whose bound lies
// further ahead than lib.lua's VALID_MS (40 s) allows (the estimate is
// off), with codeStale and its own time, and changes nothing; the Client
// then corrects its estimate and sends the attempt again, under the same
// call id. Every attempt of a call is sent before the call's effect or
// abandon, and with an estimate less than 20 s off its bound is less than
// 40 s after its sending: a copy that arrives after the window is past
// its bound and changes nothing, however late. (Not covered: the first
// attempts of a Client whose clock is more than 40 s ahead of the
// server's, made before it learned so; see README.)

// attemptValid is how long after it was sent an attempt may take effect.
// A Client whose clock is off the server's by up to VALID_MS −
// attemptValid (20 s) needs no correction.
const attemptValid = 20 * time.Second

// codeStale is the reply code of an attempt that arrived after its bound.
const codeStale = 6

// staleTries bounds the attempts made in a row for one call when each
// comes back stale (the server's clock stepping while they travel).
const staleTries = 3

// serverClock is a Client's estimate of the server's clock: the offset of
// the server's time from this machine's wall clock, learned from the
// replies of stale attempts (0 until one comes).
type serverClock struct {
	off   atomic.Int64 // ms
	valid time.Duration
}

// bound returns the bound of an attempt sent now, as a script argument
// (an int64, which go-redis writes without making a string).
func (s *serverClock) bound() any {
	valid := s.valid
	if valid == 0 {
		valid = attemptValid
	}
	return time.Now().UnixMilli() + s.off.Load() + valid.Milliseconds()
}

// learn takes the server time (ms) a stale attempt's reply carried.
func (s *serverClock) learn(serverMs int64) {
	s.off.Store(serverMs - time.Now().UnixMilli())
}

// errStale reports an attempt that came back stale staleTries times in a
// row: its outcome is known (nothing changed), but the call did not get
// through.
func errStale(what string) error {
	return fmt.Errorf("dsync: %s: %w", what, errStaleAttempts)
}

var errStaleAttempts = fmt.Errorf("%d attempts in a row reached the server after their bound (is its clock stepping?)", staleTries)

// bounded makes an attempt of a call that carries a bound (see above),
// and makes it again while its reply says it arrived after its bound,
// staleTries times at most: attempt sends one with bound as its last
// argument and returns its outcome and, for a stale reply, stale and the
// server's time (ms) the reply carried, from which c learns the offset
// for the next. (The one loop of every script that carries a bound:
// acquirePair's, Once.attempt's and Once.Reset's.)
func bounded[R any](c *serverClock, what string, attempt func(bound any) (r R, serverMs int64, stale bool, err error)) (R, error) {
	for try := 1; ; try++ {
		r, ms, stale, err := attempt(c.bound())
		if err != nil || !stale {
			return r, err
		}
		if try == staleTries {
			var none R
			return none, errStale(what)
		}
		c.learn(ms)
	}
}

// boundedRelease runs a release of a Mutex or RWMutex hold. One that names
// no hold (a release of an owner with nothing on record in the Client, or
// more releases than takes there) ends a level of whatever hold of the
// owner it finds, so a copy of it delivered after the owner took the name
// afresh, once the release's id is forgotten, would end a level of the
// new hold; one that names its hold and lowered its count would lower it
// again. It carries a bound as acquiring attempts do (its last argument,
// from send): past it a copy changes nothing and replies {codeStale,
// server ms}. The reply otherwise is the release script's code and, for a
// release that ended a write hold, that hold's fencing token (ended; 0
// for a release whose reply does not say: one of a read hold).
func boundedRelease(c *serverClock, what string, send func(bound any) *redis.Cmd) (code int64, ended uint64, err error) {
	r, err := bounded(c, what, func(bound any) ([2]int64, int64, bool, error) {
		v, err := send(bound).Result()
		if err != nil {
			return [2]int64{}, 0, false, err
		}
		if ms, stale := staleReply(v); stale {
			return [2]int64{}, ms, true, nil
		}
		if r, ok := v.(int64); ok {
			return [2]int64{r, 0}, 0, false, nil
		}
		// {1, fencing token}: released, and which hold.
		if r, ok := v.([]any); ok && len(r) == 2 && r[0] == int64(1) {
			if f, err := replyInt(r[1]); err == nil && f > 0 && f < maxFence {
				return [2]int64{1, f}, 0, false, nil
			}
		}
		return [2]int64{}, 0, false, replyError(what, v)
	})
	return r[0], uint64(r[1]), err
}

// staleReply reads the reply of a script that is not read as a pair (see
// pair): {codeStale, server ms} for an attempt past its bound.
func staleReply(v any) (ms int64, ok bool) {
	r, _ := v.([]any)
	if len(r) != 2 {
		return 0, false
	}
	code, _ := r[0].(int64)
	ms, ok = r[1].(int64)
	return ms, ok && code == codeStale
}
