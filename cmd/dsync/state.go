package main

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/internal/keys"
)

// What inspect and list report about a name (lockState), and how inspect
// finds the primitives a name carries. read.go reads each primitive's
// keys; scan.go finds the names for list.

// lockState is what inspect and list report about one primitive.
type lockState struct {
	Name string `json:"name"`
	Key  string `json:"key"` // the primitive's main key
	// Mode is the primitive: "mutex", "rwmutex", "semaphore" or "once";
	// "" when only bookkeeping (a fencing counter, recent call ids) is
	// left, or no key exists at all.
	Mode string `json:"mode"`
	// State is "held" (mutex, rwmutex, semaphore), "running", "done" or
	// "idle" (once), "free" (nothing held; bookkeeping may be left) or
	// "absent" (no key of the name exists).
	State   string   `json:"state"`
	Holders []holder `json:"holders"`
	// TTLMillis is the lease left of the current hold (a Mutex, the writer
	// of an RWMutex, the run of a Once), -1 when none.
	TTLMillis int64 `json:"ttl_ms"`
	// Fence is the fencing token of the current hold; LastFence the last
	// token given out under the name (it survives the hold).
	Fence     uint64 `json:"fence,omitempty"`
	LastFence uint64 `json:"last_fence,omitempty"`
	// Contended reports that the release of the current Mutex hold will
	// wake waiters: an attempt was refused during the hold, or the hold was
	// taken from the queue, where others may wait behind it.
	Contended bool `json:"contended,omitempty"`
	// Size and Used: a Semaphore's size and permits held in all.
	Size int64 `json:"size,omitempty"`
	Used int64 `json:"used,omitempty"`
	// Done, ValueBytes and DoneTTLMillis: a Once's done mark, the size of
	// its value and how long the mark lasts (-1: until reset).
	Done          bool  `json:"done,omitempty"`
	ValueBytes    int   `json:"value_bytes,omitempty"`
	DoneTTLMillis int64 `json:"done_ttl_ms,omitempty"`
	// Waiters lists the first waiters; WaitersTotal counts all of them.
	// Mutex waiters appear from their first refused attempt (they queue
	// then), RWMutex writers once they waited past 1 ms; Once waiters are
	// not recorded.
	Waiters      []waiter `json:"waiters"`
	WaitersTotal int64    `json:"waiters_total"`
}

type holder struct {
	// Owner is the holder's token: an owner token ("<token>@<client id>"
	// under client reentrancy) or a handle's token; for a Once, the token
	// of the running call.
	Owner string `json:"owner"`
	// Count is the owner's reentry count, or a Semaphore holder's permits.
	Count int64 `json:"count"`
	// Kind is "read" or "write" for an RWMutex.
	Kind string `json:"kind,omitempty"`
	// TTLMillis is the holder's own lease left, where each holder has one
	// (RWMutex readers, Semaphore holders).
	TTLMillis int64  `json:"ttl_ms,omitempty"`
	Fence     uint64 `json:"fence,omitempty"`
}

type waiter struct {
	Owner string `json:"owner"`
	Kind  string `json:"kind,omitempty"` // "read" or "write" for an RWMutex
	N     int64  `json:"n,omitempty"`    // permits asked of a Semaphore
	// WaitedMillis is how long the waiter has been queued (server time),
	// -1 when the layout does not record it.
	WaitedMillis int64 `json:"waited_ms"`
	// PlaceMillis is how long its place lasts unless it retries.
	PlaceMillis int64 `json:"place_ttl_ms"`
}

// A primitive is how inspect finds and reads one kind of primitive of a name.
type primitive struct {
	mode string
	key  string   // the main key, reported as lockState.Key
	in   []string // the name carries the primitive when one of these exists
	read func(ctx context.Context, rdb redis.UniversalClient, st *lockState) error
}

// primitives lists every kind of primitive that name under prefix may
// carry, and the bookkeeping that may be left when nothing is held: its
// fence hashes, which hold the last fencing token, and its call ids.
func primitives(prefix, name string) (prims []primitive, fences, calls []string) {
	mk := keys.ForMutex(prefix, name)
	rk := keys.ForRWMutex(prefix, name)
	sk := keys.ForSemaphore(prefix, name)
	ok := keys.ForOnce(prefix, name)
	return []primitive{
		{mode: "mutex", key: mk.Lock, in: []string{mk.Lock, mk.Queue},
			read: func(ctx context.Context, rdb redis.UniversalClient, st *lockState) error {
				return readMutex(ctx, rdb, mk, st)
			}},
		{mode: "rwmutex", key: rk.Writer, in: []string{rk.Writer, rk.Readers, rk.WaitingWriters, rk.WaitingReaders},
			read: func(ctx context.Context, rdb redis.UniversalClient, st *lockState) error {
				return readRWMutex(ctx, rdb, rk, st)
			}},
		{mode: "semaphore", key: sk.State, in: []string{sk.State, sk.Holders, sk.Queue},
			read: func(ctx context.Context, rdb redis.UniversalClient, st *lockState) error {
				return readSemaphore(ctx, rdb, sk, st)
			}},
		{mode: "once", key: ok.Run, in: []string{ok.Run, ok.Done},
			read: func(ctx context.Context, rdb redis.UniversalClient, st *lockState) error {
				return readOnce(ctx, rdb, ok, st)
			}},
	}, []string{mk.Fence, rk.Fence}, []string{mk.Calls, rk.Calls, sk.Calls, ok.Calls} // sk.Fence is mk.Fence
}

// inspect reads the state of every primitive under name; with none, one
// state says "free" (bookkeeping is left) or "absent". It changes nothing.
func inspect(ctx context.Context, rdb redis.UniversalClient, prefix, name string) ([]*lockState, error) {
	prims, fences, calls := primitives(prefix, name)
	var probe []string
	for _, p := range prims {
		probe = append(probe, p.in...)
	}
	probe = append(append(probe, fences...), calls...)
	pipe := rdb.Pipeline()
	exists := make(map[string]*redis.IntCmd, len(probe))
	for _, k := range probe {
		exists[k] = pipe.Exists(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	present := func(k string) bool { return exists[k].Val() > 0 }
	newState := func(mode, key string) *lockState {
		return &lockState{Name: name, Key: key, Mode: mode, State: "free", TTLMillis: -1,
			Holders: []holder{}, Waiters: []waiter{}}
	}
	var out []*lockState
	for _, p := range prims {
		if !slices.ContainsFunc(p.in, present) {
			continue
		}
		st := newState(p.mode, p.key)
		if err := p.read(ctx, rdb, st); err != nil {
			return nil, fmt.Errorf("%s %s: %w", p.mode, name, err)
		}
		out = append(out, st)
	}
	if len(out) > 0 {
		return out, nil
	}
	st := newState("", keys.Base(prefix, name))
	st.State = "absent"
	if slices.ContainsFunc(calls, present) {
		st.State = "free"
	}
	for _, k := range fences {
		if present(k) {
			st.State = "free"
			n, err := rdb.HGet(ctx, k, "n").Uint64()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, err
			}
			st.LastFence = max(st.LastFence, n)
		}
	}
	return []*lockState{st}, nil
}
