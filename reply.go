package dsync

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Script replies: how the engine and the primitives read what a script
// returned, and which errors of a script call mean foreign data.

// maxFence bounds fencing tokens: Lua numbers count by one only below
// 2^53 (2^53 + 1 is 2^53 again), so the scripts issue tokens below it, and
// one at or above it can only come from foreign data.
const maxFence = 1 << 53

// checkFence turns a token read from a reply into a grant's fence.
func checkFence(v int64) (uint64, error) {
	if v <= 0 || v >= maxFence {
		return 0, fmt.Errorf("%w: fencing token %d", ErrCorrupt, v)
	}
	return uint64(v), nil
}

// decodeGrant turns the reply codes every lock script shares into a grant:
// 0 refused (v: the ms to wait at most), 1 taken by this attempt and 2 this
// call's already (v: the fencing token, checked when fenced), 3 foreign data
// in the keys of what, 5 the call is over (see over). ok is false for other
// codes: the primitive's own.
func decodeGrant(r pairReply, fenced bool, what string) (g grant, ok bool, err error) {
	code, v := r.code, r.v
	switch code {
	case 0:
		return grant{kind: refused, wait: time.Duration(v) * time.Millisecond, at: r.at}, true, nil
	case 1, 2:
		g.kind = taken
		if code == 2 {
			g.kind = handed
		}
		if fenced {
			if g.fence, err = checkFence(v); err != nil {
				return grant{}, true, err
			}
			g.fenceArg = r.arg
		}
		g.left = time.Duration(r.at) * time.Millisecond
		return g, true, nil
	case 3:
		return grant{kind: final, err: fmt.Errorf("%w: in the keys of %s", ErrCorrupt, what)}, true, nil
	case 5:
		return grant{kind: over}, true, nil
	}
	return grant{}, false, nil
}

// replyError turns an error of a script call into what a caller sees: a
// reply of the wrong shape is ErrCorrupt.
func replyError(what string, r any) error {
	return fmt.Errorf("%w: %s replied %v", ErrCorrupt, what, r)
}

// A pairReply is a script's reply {code, value}, or a refusal's {0, ms,
// server time µs} (lib.lua's refusal). arg is the value as the reply
// carried it, already boxed: a hold keeps its fencing token so for the
// unlocks that name it (nil if the value came as a string). at is a
// refusal's server time, or a grant's ms left, 0 if the reply had none.
type pairReply struct {
	code, v int64
	arg     any
	at      int64
}

// pair decodes the reply of cmd, a script call replying {code, value} or,
// refused, {0, ms, server time µs}, or, granted a hold whose expiry the
// call left as it was, {1 or 2, fencing token, ms the hold has left}.
func pair(what string, cmd *redis.Cmd) (pairReply, error) {
	var v [3]int64
	n := 2
	if r, ok := cmd.Val().([]any); ok && len(r) == 3 {
		n = 3
	}
	r, err := replyInts(what, cmd, v[:n])
	if err != nil {
		return pairReply{}, err
	}
	if n == 3 && (v[0] < 0 || v[0] > 2 || v[2] <= 0) {
		return pairReply{}, replyError(what, r)
	}
	p := pairReply{code: v[0], v: v[1], at: v[2]}
	if _, ok := r[1].(int64); ok {
		p.arg = r[1]
	}
	return p, nil
}

// replyInts reads the reply of cmd, a script call replying with an array
// of len(dst) integers (or strings of integers, as [redis.Cmd.Int64Slice]
// reads them), into dst, and returns the reply as it came. A reply of
// another length is ErrCorrupt. Unlike Int64Slice it makes no slice.
func replyInts(what string, cmd *redis.Cmd, dst []int64) ([]any, error) {
	r, err := cmd.Slice()
	if err != nil {
		return nil, scriptError(err)
	}
	for _, e := range r {
		if _, err := replyInt(e); err != nil {
			return nil, err
		}
	}
	if len(r) != len(dst) {
		return nil, replyError(what, r)
	}
	for i, e := range r {
		dst[i], _ = replyInt(e)
	}
	return r, nil
}

// replyInt reads an integer of a reply as [redis.Cmd.Int64Slice] does.
func replyInt(v any) (int64, error) {
	switch v := v.(type) {
	case int64:
		return v, nil
	case string:
		return strconv.ParseInt(v, 10, 64)
	}
	return 0, fmt.Errorf("redis: unexpected type=%T for Int64", v)
}

// scriptError marks the errors Redis raises while a script runs on data
// that dsync did not write as ErrCorrupt, keeping the cause: a key of
// another type (WRONGTYPE), and errors of commands or of Lua on values of
// the wrong shape, which Redis reports as "ERR ..." naming the script (and
// miniredis as "ERR Error compiling script ..."). Other errors (the
// connection's, NOSCRIPT, OOM, READONLY, BUSY, cluster redirections) are
// returned unchanged, and so is an error marked already.
func scriptError(err error) error {
	var re redis.Error
	if err == nil || errors.Is(err, ErrCorrupt) || !errors.As(err, &re) {
		return err
	}
	msg := re.Error()
	if strings.HasPrefix(msg, "WRONGTYPE") || (strings.HasPrefix(msg, "ERR") && strings.Contains(strings.ToLower(msg), "script")) {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return err
}
