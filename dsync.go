package dsync

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/renew"
)

// Defaults.
const (
	// DefaultTTL is the lease of a hold unless [TTL] says otherwise.
	DefaultTTL = 30 * time.Second
	// DefaultPrefix begins every key dsync writes unless [Prefix] says otherwise.
	DefaultPrefix = "dsync"

	// fenceIdle is how long the per-name bookkeeping (the fencing counter)
	// lives after its last use, at least half of it: the scripts rewrite the
	// expiry only once half has passed. Tokens stay monotonic past it
	// because the next token is at least the server time in µs.
	fenceIdle = 24 * time.Hour
	// releaseTimeout bounds an unlock or cleanup that runs detached from
	// the caller's ctx.
	releaseTimeout = 5 * time.Second
	// starvation is how long an RWMutex writer waits before it takes a
	// place in the writers' queue, as in sync.Mutex's starvation mode. (A
	// Mutex waiter queues from its first refused attempt.)
	starvation = time.Millisecond
)

// A Client makes dsync primitives on one Redis deployment. Its background
// work, one lease renewer and one pub/sub connection shared by all waiters,
// starts on first use and stops on Close. A Client is safe for concurrent use.
type Client struct {
	base // defaults, bad input, closed state, owners' holds (see base.go)

	rdb   redis.UniversalClient
	renew *renew.Renewer
	// quorum, if not nil, is the Quorum whose member master this Client
	// is, the member-th (see Quorum.memberEnded).
	quorum *Quorum
	member int
	notify *notifier
	// cohorts of the Mutex and RWMutex write Lock calls waiting in this
	// process (cohort.go)
	cohorts cohorts
	once    sync.Once

	// Clean-up that outlives the call that needed it (see cleanup), and
	// commands whose caller's ctx ended first (see within).
	bg       tasks
	calls    tasks
	active   *inflight // calls in progress that may start clean-up
	batch    batcher   // script calls waiting for those in flight (see maxFlight)
	bgCtx    context.Context
	bgCancel context.CancelFunc

	// resentAfter: a script call that took at least this long may have
	// been sent again by go-redis after a read timeout, and its first copy
	// may still reach the server later (see lateCopiesAfter).
	resentAfter time.Duration

	// clock estimates the server's time, for the bound of each acquiring
	// attempt (see clock.go).
	clock serverClock

	// semTook, set by tests before the Client's first call, is told the
	// fencing token of the holding each Semaphore Acquire's permits went
	// into, before the call returns.
	semTook func(ctx context.Context, fence uint64)
}

// lateCopiesAfter returns how long a command of rdb must take before
// go-redis may have sent it again (its read timeout, after which it retries
// on a new connection while the first copy may still be on its way): 0 for
// a client whose settings are unknown here, and never for one that does not
// time reads out or does not retry.
func lateCopiesAfter(rdb redis.UniversalClient) time.Duration {
	const never = time.Duration(math.MaxInt64)
	var rt time.Duration
	switch r := rdb.(type) {
	case *redis.Client:
		o := r.Options()
		if o.MaxRetries == 0 {
			return never
		}
		rt = o.ReadTimeout
	case *redis.ClusterClient:
		rt = r.Options().ReadTimeout
	default:
		return 0
	}
	if rt <= 0 {
		return never
	}
	return rt
}

// New returns a Client over rdb, which may be a single-node, cluster or
// sentinel client. Options set defaults for every primitive made by the
// Client. Close stops the Client's background work; it does not close rdb. A
// nil rdb, a ring client or a bad option makes every call fail with
// [ErrInvalid]. A ring's shards are independent servers: a release is
// published on its name's shard, and the Client's one pub/sub connection
// would reach one shard only, so waiters for names on the others would wait
// out the lease (go-redis's Ring also refuses a pub/sub without a channel,
// with a panic). Over several independent masters, use [NewQuorum].
//
// Calls return about when their ctx ends, by deadline or cancel, also with
// Redis unreachable and whatever rdb's settings: a command sent to a server
// that holds it goes on in the background, owned by the Client, until
// go-redis gives up on it (its ReadTimeout, or the ctx deadline with
// ContextTimeoutEnabled), and its outcome is settled as after a lost reply.
//
// Script calls made while another call of the Client is in flight go out
// together, as one pipeline, when it returns (or after 1 ms): rdb's hooks
// see them as a pipeline, on a ctx of none of their callers.
func New(rdb redis.UniversalClient, opts ...Option) *Client {
	c := &Client{rdb: rdb, active: newInflight()}
	c.batch.max, c.batch.wait = maxFlight, maxQueueWait
	c.init(opts)
	c.bgCtx, c.bgCancel = context.WithCancel(context.Background())
	if rdb == nil {
		c.err = fmt.Errorf("%w: nil redis client", ErrInvalid)
	} else if _, ring := rdb.(*redis.Ring); ring {
		c.err = fmt.Errorf("%w: a ring client (use a single-node, cluster or sentinel client)", ErrInvalid)
	}
	if c.err != nil {
		return c
	}
	c.resentAfter = lateCopiesAfter(rdb)
	c.renew = renew.New(rdb, renew.LostError(ErrLeaseLost))
	c.notify = newNotifier(rdb)
	return c
}

// Close stops renewing every lease of the Client (their Done channels
// close) and its notifications; calls in progress and later calls return
// [ErrClosed], and leave nothing behind, as a failed call does: what such a
// call had taken or queued for (a grant whose reply came after Close, a
// waiting place) is undone. Holds taken before are not released: they
// expire at their TTL. Close does not close the Redis client. It is safe
// to call more than once.
// Close of a nil Client, or of one not made by New, stops nothing and
// returns an error for which errors.Is(err, [ErrInvalid]) holds, as its
// calls do.
//
// Close waits for the calls in progress that it ends to return, with the
// undo of what they had taken or queued for, for the clean-ups that failed
// calls left to the background (undoing a cancelled attempt, say), for
// releases left there, and for commands whose callers gave up on them, 5 s
// at most in all for those sent to a server that does not answer; then it
// cancels the clean-ups left. A command still in flight ends when go-redis
// gives up on it (its ReadTimeout, 3 s by default, or the ctx deadline
// with ContextTimeoutEnabled). A call in progress whose command the server
// holds returns when that command does or its ctx ends, whichever is
// first, not at Close; its clean-up then runs on its own, 5 s at most.
// So does a release (Unlock, RUnlock, Release, the end of a Once run)
// that began before Close and reaches Redis after it: it runs on its own,
// 5 s at most, and its caller returns by its ctx deadline.
func (c *Client) Close() error {
	if b := c.shared(); b == nil || b.closed == nil {
		// Nothing to stop: a nil or zero Client, as every call reports.
		return b.check()
	}
	c.once.Do(func() {
		close(c.closed)
		end := time.Now().Add(releaseTimeout)
		left := func() time.Duration { return max(time.Until(end), time.Nanosecond) }
		// Calls in progress see c closed and return; the clean-up they
		// start on the way runs in the background, which is closed after.
		c.active.close(left())
		c.bg.close(left())
		c.bgCancel()
		c.calls.close(left())
		c.releases.close(left())
		if c.renew != nil {
			c.renew.CloseWithin(left())
		}
		if c.notify != nil {
			// A moment at least, for its goroutines to see it, also when
			// the budget is spent.
			c.notify.closeWithin(max(left(), cleanupGrace))
		}
	})
	return nil
}

func (c *Client) check() error {
	return c.shared().check()
}

// shared returns what c shares with the handles it makes, nil for a nil c.
func (c *Client) shared() *base {
	if c == nil {
		return nil
	}
	return &c.base
}

// An Option configures a Client (as the default of all its primitives) or
// one primitive.
type Option func(*config)

type config struct {
	ttl      time.Duration
	interval time.Duration // 0: TTL/3; < 0: no renewal
	maxHold  time.Duration
	period   time.Duration // Once: life of the done mark; 0 forever
	prefix   string
	local    bool // client reentrancy: re-entries counted in the process
	err      error

	replicas    int           // WaitReplicas: acknowledgements each acquire waits for
	replicaWait time.Duration // WaitReplicas: the most time WAIT may take
}

func defaultConfig() config {
	return config{ttl: DefaultTTL, prefix: DefaultPrefix}
}

func (cfg *config) apply(opts []Option) {
	for _, o := range opts {
		if o != nil {
			o(cfg)
		}
	}
}

func (cfg *config) fail(format string, args ...any) {
	if cfg.err == nil {
		cfg.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
	}
}

// TTL sets the lease of every hold (default [DefaultTTL], 30 s). While a hold
// lives it is renewed every TTL/3, so the TTL is how long a hold survives its
// holder's death. It must be at least 1 ms and at most [MaxTTL].
func TTL(d time.Duration) Option {
	if d > MaxTTL {
		return func(cfg *config) { cfg.fail("TTL %v, want at most %v", d, MaxTTL) }
	}
	return durationOption("TTL", d, func(cfg *config) *time.Duration { return &cfg.ttl })
}

// MaxTTL is the longest lease [TTL] accepts, 24 h. The scripts take a
// waiting call's place with a longer TTL for data dsync did not write, and
// drop it, so that no foreign entry can be handed a hold that outlives
// the keys it came from.
const MaxTTL = 24 * time.Hour

// durationOption returns the Option called name that sets the duration
// field(cfg) to d, which must be at least 1 ms.
func durationOption(name string, d time.Duration, field func(*config) *time.Duration) Option {
	return func(cfg *config) {
		if d < time.Millisecond {
			cfg.fail("%s %v, want at least 1ms", name, d)
			return
		}
		*field(cfg) = d
	}
}

// FixedLease turns renewal off: a hold of a Mutex or RWMutex lasts exactly
// its TTL from the Lock that took it, unless released earlier (re-entries
// do not extend it, with either reentrancy, also when another Client of
// the same owner re-enters: its Lease ends with the hold), and its [Lease]
// reports [ErrLeaseLost] when the TTL runs out. A holding of a [Semaphore]
// lasts its TTL from the Acquire that began it: Acquires that add permits
// to it do not extend it. On a [Quorum] a re-entry extends the hold on the
// masters to its own TTL, as without FixedLease: the Lease still ends at
// the first Lock's TTL, and the masters free the name by the last
// re-entry's.
// For holders that prefer expiry to an unbounded hold.
func FixedLease() Option {
	return func(cfg *config) { cfg.interval = -1 }
}

// MaxHold bounds how long renewal may keep one hold alive: no renewal
// extends a hold past d after it was taken, so a live but stuck holder
// loses it (its [Lease] reports [ErrLeaseLost]) within d. Re-entries, and
// Acquires that add permits to a [Semaphore] holding, do not extend it
// either (but on a [Quorum], see [FixedLease]). The default, 0, is no
// bound.
func MaxHold(d time.Duration) Option {
	return func(cfg *config) {
		if d < 0 {
			cfg.fail("MaxHold %v, want ≥ 0", d)
			return
		}
		cfg.maxHold = d
	}
}

// ClientReentrancy makes an owner's re-entries count in this Client rather
// than in Redis: Redis sees only an owner's first Lock and last Unlock, so a
// re-entry or an inner Unlock costs no round trip. An [RWMutex] counts its
// read and write holds apart: Redis sees the first RLock and the last
// RUnlock, and the first Lock and the last Unlock; a downgrade (RLock while
// writing) is a first RLock, and an upgrade is refused with [ErrUpgrade] as
// without this option. An owner used by several goroutines at once never
// re-enters a hold its last Unlock is ending: a Lock while that Unlock is
// under way waits for it, then takes the lock afresh. The price: re-entry
// is per Client — a token carried to another process (see
// [WithOwnerToken]), or used with another Client in this one, does not
// re-enter there: it waits like any other owner. The default is script
// reentrancy, where the count lives in Redis and works across processes. It
// changes nothing for calls without an owner in ctx, which never re-enter,
// nor for a [Semaphore], whose owner's permits add up in Redis across
// Clients.
// A re-entry trusts the Client's record of the hold: a hold lost in Redis
// before the Client knows it (its keys deleted, say) is re-entered until a
// renewal finds the loss (within TTL/3); its [Lease] then reports
// [ErrLeaseLost], as for any loss.
//
// The two modes hold under different tokens in Redis and count in
// different places, so an owner does not mix them on one name in one
// Client: while it holds the name through a handle of one mode, its calls
// through a handle of the other mode fail with an error matching
// [ErrInvalid] and change nothing (a write Lock while it reads gets
// [ErrUpgrade], as through one handle).
func ClientReentrancy() Option {
	return func(cfg *config) { cfg.local = true }
}

// Prefix sets the first part of every key and channel name (default
// [DefaultPrefix], "dsync"). Clients that share names must share the prefix.
// On Redis Cluster a prefix should contain no braces: one with a hash tag
// ("{app}") puts every name in that tag's slot, and one with an empty tag
// ("x{}") spreads the keys of one primitive over several slots, where its
// scripts fail.
func Prefix(p string) Option {
	return func(cfg *config) {
		if p == "" {
			cfg.fail("empty prefix")
			return
		}
		cfg.prefix = p
	}
}

func ms(d time.Duration) int64 {
	v := d.Milliseconds()
	if v < 1 {
		v = 1
	}
	return v
}

// newCallID returns an id for one call: scripts that see the same id twice
// (a retry after a lost reply) answer as before and change nothing. An id
// is 64 random bits in base 36, zero-padded to callIDLen digits, cut from a
// string of callIDsPerChunk ids made at once: a call costs no allocation
// for its id.
func newCallID() string {
	callIDs.mu.Lock()
	if callIDs.left == "" {
		callIDs.left = newCallIDChunk()
	}
	id := callIDs.left[:callIDLen]
	callIDs.left = callIDs.left[callIDLen:]
	callIDs.mu.Unlock()
	return id
}

const (
	callIDLen       = 13 // base-36 digits of the largest uint64
	callIDsPerChunk = 64
)

// callIDs holds the ids of the current chunk not handed out yet.
var callIDs struct {
	mu   sync.Mutex
	left string
}

func newCallIDChunk() string {
	var b strings.Builder
	b.Grow(callIDLen * callIDsPerChunk)
	var digits [callIDLen]byte
	for range callIDsPerChunk {
		d := strconv.AppendUint(digits[:0], rand.Uint64(), 36)
		for range callIDLen - len(d) {
			b.WriteByte('0')
		}
		b.Write(d)
	}
	return b.String()
}

// detached returns a context for cleanup that must run although ctx ended.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
}
