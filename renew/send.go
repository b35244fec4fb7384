package renew

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/internal/renewhook"
)

const (
	// maxRoundTrip bounds each round trip; it is also bounded by the
	// smallest interval in the batch and by the batch's earliest
	// conservative deadline.
	maxRoundTrip = 5 * time.Second
	// maxInFlight bounds the round trips the sender has in flight at once.
	maxInFlight = 4
	// minBackoff is the least wait before retrying a failed renewal; the
	// usual wait is a tenth of the interval.
	minBackoff = 10 * time.Millisecond
)

// errMaxHold is the outcome of a renewal not sent because it would have
// extended its hold past MaxHold.
var errMaxHold = errors.New("renew: MaxHold reached")

func init() {
	renewhook.SetStall = func(r any, f func()) { r.(*Renewer).setStall(f) }
}

// setStall makes r call f just before it sends each batch of renewals
// (before the batch's holds are checked against their deadlines), on the
// goroutine that sends the batch; f == nil removes the hook. Tests make f
// block to stall this Renewer past its leases' TTL, as a GC pause or a
// frozen VM would. It is reached from tests only: renew's export_test.go,
// and renewhook.SetStall for tests outside the package.
func (r *Renewer) setStall(f func()) {
	if f == nil {
		r.stall.Store(nil)
		return
	}
	r.stall.Store(&f)
}

// A batch is the holds of one round trip, or a marker whose done channel
// the sender closes when it reaches it.
type batch struct {
	hs   []*Hold
	done chan struct{}
}

// sender sends the queued batches, one round trip at a time, until Close.
func (r *Renewer) sender() {
	defer close(r.sent)
	for {
		select {
		case <-r.work:
		case <-r.ctx.Done():
			r.mu.Lock()
			for _, b := range r.queue {
				if b.done != nil {
					close(b.done)
				}
			}
			r.queue = nil
			r.mu.Unlock()
			return
		}
		for {
			// Up to maxInFlight round trips at once, each on its own
			// connection, so that encoding one overlaps the server's work
			// on another. A marker waits for the batches before it.
			r.mu.Lock()
			var bs []batch
			for len(r.queue) > 0 && len(bs) < maxInFlight {
				b := r.queue[0]
				if b.done != nil && len(bs) > 0 {
					break
				}
				r.queue[0] = batch{}
				r.queue = r.queue[1:]
				bs = append(bs, b)
				if b.done != nil {
					break
				}
			}
			r.mu.Unlock()
			if len(bs) == 0 {
				break
			}
			if bs[0].done != nil {
				close(bs[0].done)
				continue
			}
			if len(bs) == 1 {
				r.send(bs[0].hs)
				continue
			}
			var wg sync.WaitGroup
			for _, b := range bs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r.send(b.hs)
				}()
			}
			wg.Wait()
		}
	}
}

// result is the outcome of one renewal command.
type result struct {
	sent int64 // local time just before its pipeline was sent
	err  error
	val  int64
}

// send renews hs (at most BatchSize holds, none in the heap) in one pipelined
// round trip, plus one more if the server lacked a script, and files each
// hold back into the heap or ends it.
func (r *Renewer) send(hs []*Hold) {
	if f := r.stall.Load(); f != nil {
		(*f)()
	}

	// Re-check after a possible stall: a hold whose conservative deadline
	// passed meanwhile is lost, even if a renewal would still find the key.
	r.mu.Lock()
	now := r.now()
	if r.ctx.Err() != nil {
		r.mu.Unlock()
		return // the holds are in the heap; shutdown ends them
	}
	timeout := int64(maxRoundTrip)
	keep := hs[:0]
	for _, h := range hs {
		switch {
		case h.state != live:
		case now >= h.lostAt():
			h.endLocked(lost)
		case !h.mayRenew(now):
			// MaxHold was reached while waiting: let it run out (it is in
			// the heap already, keyed by its deadline).
			h.fixed = true
			h.inflight = false
		default:
			// No reply after the conservative deadline can save the hold,
			// so waiting longer than that for it is pointless.
			timeout = min(timeout, h.interval, h.lostAt()-now)
			keep = append(keep, h)
		}
	}
	hs = keep
	r.mu.Unlock()
	if len(hs) == 0 {
		return
	}

	ctx, cancel := context.WithTimeout(r.ctx, time.Duration(max(timeout, int64(time.Millisecond))))
	defer cancel()
	res := make([]result, len(hs))
	if err := r.load(ctx, hs, nil); err != nil {
		for i := range res {
			res[i].err = err
		}
	} else {
		all := make([]int, len(hs))
		for i := range all {
			all[i] = i
		}
		r.exec(ctx, hs, all, res)
		// A pipeline gets no EVAL fallback: load what the server lacked and
		// redo those commands once.
		var redo []int
		for i := range res {
			if redis.HasErrorPrefix(res[i].err, "NOSCRIPT") {
				redo = append(redo, i)
			}
		}
		if len(redo) > 0 {
			if err := r.load(ctx, hs, redo); err != nil {
				for _, i := range redo {
					res[i].err = err
				}
			} else {
				r.exec(ctx, hs, redo, res)
			}
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	now = r.now()
	closing := r.ctx.Err() != nil
	early := false
	defer func() {
		if early {
			r.poke()
		}
	}()
	for i, h := range hs {
		if h.state != live {
			continue // released, marked lost or run out while in flight
		}
		rs := res[i]
		switch {
		case rs.err == nil && rs.val == 0 && h.releasing > 0:
			// Gone, perhaps by the release under way: its outcome
			// tells (see Releasing).
			h.gone, h.fixed = true, true
		case rs.err == nil && rs.val == 0:
			h.endLocked(lost)
			continue
		case closing:
			// The failure is ours, not Redis's; shutdown ends the hold.
			continue
		case now >= h.lostAt():
			// Whatever the reply, it came after the conservative deadline,
			// when the holder may already have been given up on.
			h.endLocked(lost)
			continue
		case rs.err == errMaxHold:
			// MaxHold was reached while its script loaded: let it run out.
			h.fixed = true
			h.when = h.lostAt()
		case rs.err == nil && rs.val == 1:
			h.deadline = rs.sent + h.ttl
			h.when = min(rs.sent+h.interval, h.lostAt())
		default:
			// Network error, timeout, or a reply the script should not
			// give: retry soon while the hold may still be alive.
			h.when = min(now+max(h.interval/10, int64(minBackoff)), h.lostAt())
		}
		h.inflight = false
		heap.Fix(&r.holds, int(h.index))
		early = early || h.when < r.armed
	}
}

// load loads the scripts of hs[idx] (of all hs if idx is nil) that are not
// known to be loaded — or, when idx is given, all of them, since the server
// just said it lacks them.
func (r *Renewer) load(ctx context.Context, hs []*Hold, idx []int) error {
	r.loadMu.Lock()
	defer r.loadMu.Unlock()
	var scripts []*redis.Script
	add := func(s *redis.Script) {
		if (idx == nil && r.loaded[s]) || contains(scripts, s) {
			return
		}
		scripts = append(scripts, s)
	}
	addHold := func(h *Hold) {
		if h.batch != nil {
			add(h.batch)
		} else {
			add(h.script)
		}
	}
	if idx == nil {
		for _, h := range hs {
			addHold(h)
		}
	} else {
		for _, i := range idx {
			addHold(hs[i])
		}
	}
	for _, s := range scripts {
		delete(r.loaded, s)
		if err := s.Load(ctx, r.c).Err(); err != nil {
			return err
		}
		r.loaded[s] = true
	}
	return nil
}

func contains(ss []*redis.Script, s *redis.Script) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// exec sends the renewals of hs[idx] in one pipeline and stores their
// outcomes in res[idx]. Holds with a Batch script share one command per
// script (and, on a cluster, per hash slot).
func (r *Renewer) exec(ctx context.Context, hs []*Hold, idx []int, res []result) {
	// Checked against MaxHold as sent, not before the script loads that
	// may have taken a round trip since send checked it: the server
	// extends the hold from when the renewal gets there.
	sent := r.now()
	r.mu.Lock()
	send := make([]int, 0, len(idx))
	for _, i := range idx {
		if hs[i].mayRenew(sent) {
			send = append(send, i)
		} else {
			res[i] = result{sent: sent, err: errMaxHold}
		}
	}
	r.mu.Unlock()
	if idx = send; len(idx) == 0 {
		return
	}
	pipe := r.c.Pipeline()
	type group struct {
		cmd  *redis.Cmd
		idx  []int // into hs, in the order of the batch's replies
		args []any
	}
	type groupKey struct {
		s    *redis.Script
		slot int
	}
	var groups map[groupKey]*group
	var order []*group
	cmds := make([]*redis.Cmd, len(idx))
	for j, i := range idx {
		h := hs[i]
		if h.batch != nil {
			k := groupKey{h.batch, -1}
			if r.cluster {
				k.slot = slot(h.keys[0])
			}
			if groups == nil {
				groups = make(map[groupKey]*group)
			}
			g := groups[k]
			if g == nil {
				g = &group{}
				groups[k] = g
				order = append(order, g)
			}
			g.idx = append(g.idx, i)
			continue
		}
		if h.cmd == nil {
			// Built once, at the first renewal: most holds end before it.
			h.cmd = make([]any, 0, 3+len(h.keys)+len(h.args))
			h.cmd = append(h.cmd, "evalsha", h.script.Hash(), len(h.keys))
			for _, k := range h.keys {
				h.cmd = append(h.cmd, k)
			}
			h.cmd = append(h.cmd, h.args...)
		}
		cmds[j] = redis.NewCmd(ctx, h.cmd...)
		_ = pipe.Process(ctx, cmds[j])
	}
	for _, g := range order {
		first := hs[g.idx[0]]
		nk, na := len(first.keys), len(first.args)
		a := make([]any, 0, 3+len(g.idx)*(nk+na))
		a = append(a, "evalsha", first.batch.Hash(), len(g.idx)*nk)
		for _, i := range g.idx {
			for _, k := range hs[i].keys {
				a = append(a, k)
			}
		}
		for _, i := range g.idx {
			a = append(a, hs[i].args...)
		}
		g.cmd = redis.NewCmd(ctx, a...)
		_ = pipe.Process(ctx, g.cmd)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for j, i := range idx {
		if cmds[j] == nil {
			continue
		}
		v, err := cmds[j].Int64()
		res[i] = result{sent: sent, err: err, val: v}
	}
	for _, g := range order {
		vs, err := g.cmd.Int64Slice()
		if err == nil && len(vs) != len(g.idx) {
			err = fmt.Errorf("renew: batch replied %d values for %d holds", len(vs), len(g.idx))
		}
		for n, i := range g.idx {
			if err != nil {
				res[i] = result{sent: sent, err: err}
				continue
			}
			res[i] = result{sent: sent, val: vs[n]}
		}
	}
}
