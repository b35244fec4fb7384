package main

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/internal/keys"
)

// Reading: what is in Redis for a name, read without changing anything. The
// names of the keys come from internal/keys, whose docs say what each key
// holds (after the headers of lua/*.lua); this file turns their fields into
// a lockState. One name may carry several primitives at once (a Mutex and a
// Once called "x" are independent); inspect reads each one it finds. What it
// reads of each:
//
//	Mutex      lock hash: <holder> -> reentry count, ':f' fencing token of
//	           the hold, ':w' someone waited (a refused attempt, or a hold
//	           taken from the queue); PTTL = lease. Queue zset: waiter ->
//	           arrival; queue data: "<place deadline ms> <ttl ms> <call id>
//	           <secret>". Fence hash 'n'.
//	RWMutex    writer hash as the lock hash above. Readers zset: reader ->
//	           lease deadline; readers hash: reader -> "<reentry count> <hold
//	           id> <call ids>". Waiting writers zset: writer -> place deadline, and
//	           arrival in the writers' queue once queued. Waiting readers
//	           hash: reader -> "<place deadline ms> <ttl ms> <call id>".
//	           Fence hash 'n'.
//	Semaphore  state hash ':size', ':used', <holder> -> permits, ':f:'<holder>
//	           -> fencing token. Holders zset: holder -> lease deadline.
//	           Queue zset: call id -> arrival; queue data: "<place deadline
//	           ms> <ttl ms> <n> <secret> <holder>". Fence hash 'n' (the
//	           Mutex's).
//	Once       run hash 't' token of the running call (a call token, not an
//	           owner token); PTTL = run lease. Done hash 'v' the value; PTTL =
//	           period left (none: kept until reset).
//
// A holder is an owner token, under client reentrancy followed by "@<client
// id>" (Mutex, RWMutex), or a handle's token. The ids of calls (':c', the
// readers hash after the count and hold id, the call ids zsets of Mutex,
// RWMutex, Semaphore and Once) serve the scripts' answer to repeated and
// abandoned calls, and the secrets of queued calls
// prove a hand-over to them; neither is shown.

// maxShown bounds the holders and waiters read per primitive.
const maxShown = 100

// pttl converts a PTTL reply: -1 for none.
func pttl(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}

// placeLeft returns how long a place with the queue data d ("<deadline ms>
// ...") lasts at server time nowMS, or -1.
func placeLeft(d string, nowMS int64) int64 {
	f := strings.Fields(d)
	if len(f) == 0 {
		return -1
	}
	dl, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return -1
	}
	return max(dl-nowMS, 0)
}

// ownerCounts turns a lock hash into holders, skipping the ':' fields.
func ownerCounts(fields map[string]string, kind string) []holder {
	var hs []holder
	for f, v := range fields {
		if strings.HasPrefix(f, ":") {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		hs = append(hs, holder{Owner: f, Count: n, Kind: kind})
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].Owner < hs[j].Owner })
	return hs
}

// members returns the members of a sorted set as a ZRANGE reply lists them.
func members(zs []redis.Z) []string {
	m := make([]string, len(zs))
	for i, z := range zs {
		m[i], _ = z.Member.(string)
	}
	return m
}

// memberData returns the members of zs and, one round trip, the fields of
// the hash key named after them (nil where a field is missing).
func memberData(ctx context.Context, rdb redis.UniversalClient, key string, zs []redis.Z) ([]string, []any, error) {
	m := members(zs)
	data, err := rdb.HMGet(ctx, key, m...).Result()
	return m, data, err
}

// queued returns the waiters of a queue: zs, the queue zset (member ->
// arrival, server µs), whose members are ids, and data, their fields in
// the queue data hash ("<place deadline ms> ..."), at server time nowUS.
// more, if set, reads the rest of a waiter's data (its words).
func queued(zs []redis.Z, ids []string, data []any, nowUS int64, more func(w *waiter, f []string)) []waiter {
	ws := make([]waiter, 0, len(zs))
	for i, z := range zs {
		w := waiter{Owner: ids[i], WaitedMillis: (nowUS - int64(z.Score)) / 1000, PlaceMillis: -1}
		if s, ok := data[i].(string); ok {
			w.PlaceMillis = placeLeft(s, nowUS/1000)
			if more != nil {
				more(&w, strings.Fields(s))
			}
		}
		ws = append(ws, w)
	}
	return ws
}

// execRead runs pipe, a pipeline of reads, and returns the server's time
// (µs) as the pipeline ends, read with it: a key that does not exist is no
// error. Every read is checked: Exec reports only the first failure, and a
// missing key's redis.Nil must not hide a wrong type after it.
func execRead(ctx context.Context, pipe redis.Pipeliner) (nowUS int64, err error) {
	now := pipe.Time(ctx)
	cmds, err := pipe.Exec(ctx)
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, err
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return 0, err
		}
	}
	return now.Val().UnixMicro(), nil
}

// A lockHash is what a pipeline reads of an exclusive hold: a lock hash
// (a Mutex's, or an RWMutex's writer hash, laid out alike) and its fence
// hash.
type lockHash struct {
	fields *redis.MapStringStringCmd
	ttl    *redis.DurationCmd
	last   *redis.StringCmd
}

// readLockHash adds the reads of lock hash key and fence hash fence to pipe.
func readLockHash(ctx context.Context, pipe redis.Pipeliner, key, fence string) lockHash {
	return lockHash{fields: pipe.HGetAll(ctx, key), ttl: pipe.PTTL(ctx, key), last: pipe.HGet(ctx, fence, "n")}
}

// report adds what l read to st: the holders, of kind, with the hold's
// lease and fencing token, and the last token given out.
func (l lockHash) report(st *lockState, kind string) {
	st.Holders = append(st.Holders, ownerCounts(l.fields.Val(), kind)...)
	if len(st.Holders) > 0 {
		st.TTLMillis = pttl(l.ttl.Val())
		st.Fence, _ = strconv.ParseUint(l.fields.Val()[":f"], 10, 64)
	}
	st.LastFence, _ = strconv.ParseUint(l.last.Val(), 10, 64)
}

// readMutex reads a Mutex: two round trips, the second only for waiters.
func readMutex(ctx context.Context, rdb redis.UniversalClient, k keys.Mutex, st *lockState) error {
	pipe := rdb.Pipeline()
	lock := readLockHash(ctx, pipe, k.Lock, k.Fence)
	total := pipe.ZCard(ctx, k.Queue)
	queue := pipe.ZRangeWithScores(ctx, k.Queue, 0, maxShown-1)
	nowUS, err := execRead(ctx, pipe)
	if err != nil {
		return err
	}
	lock.report(st, "")
	_, st.Contended = lock.fields.Val()[":w"]
	if len(st.Holders) > 0 {
		st.State = "held"
	}
	st.WaitersTotal = total.Val()
	zs := queue.Val()
	if len(zs) == 0 {
		return nil
	}
	toks, data, err := memberData(ctx, rdb, k.QueueData, zs)
	if err != nil {
		return err
	}
	st.Waiters = append(st.Waiters, queued(zs, toks, data, nowUS, nil)...)
	return nil
}

// readRWMutex reads an RWMutex: two round trips, the second only for readers.
func readRWMutex(ctx context.Context, rdb redis.UniversalClient, k keys.RWMutex, st *lockState) error {
	pipe := rdb.Pipeline()
	writer := readLockHash(ctx, pipe, k.Writer, k.Fence)
	readers := pipe.ZRangeWithScores(ctx, k.Readers, 0, maxShown-1)
	writers := pipe.ZRangeWithScores(ctx, k.WaitingWriters, 0, maxShown-1)
	nWriters := pipe.ZCard(ctx, k.WaitingWriters)
	queued := pipe.ZRangeWithScores(ctx, k.WriterQueue, 0, maxShown-1)
	nReaders := pipe.HLen(ctx, k.WaitingReaders)
	waitingReaders := pipe.HScan(ctx, k.WaitingReaders, 0, "", maxShown)
	nowUS, err := execRead(ctx, pipe)
	if err != nil {
		return err
	}
	nowMS := nowUS / 1000
	writer.report(st, "write")
	if zs := readers.Val(); len(zs) > 0 {
		toks, counts, err := memberData(ctx, rdb, k.ReaderData, zs)
		if err != nil {
			return err
		}
		for i, z := range zs {
			h := holder{Owner: toks[i], Count: 1, Kind: "read", TTLMillis: max(int64(z.Score)-nowMS, 0)}
			if s, ok := counts[i].(string); ok {
				if f := strings.Fields(s); len(f) > 0 {
					h.Count, _ = strconv.ParseInt(f[0], 10, 64)
				}
			}
			st.Holders = append(st.Holders, h)
		}
	}
	if len(st.Holders) > 0 {
		st.State = "held"
	}
	// A writer that waited past the starvation threshold is queued, with
	// its arrival time.
	arrived := map[string]int64{}
	for _, z := range queued.Val() {
		tok, _ := z.Member.(string)
		arrived[tok] = int64(z.Score)
	}
	for _, z := range writers.Val() {
		tok, _ := z.Member.(string)
		w := waiter{Owner: tok, Kind: "write", WaitedMillis: -1, PlaceMillis: max(int64(z.Score)-nowMS, 0)}
		if a, ok := arrived[tok]; ok {
			w.WaitedMillis = (nowUS - a) / 1000
		}
		st.Waiters = append(st.Waiters, w)
	}
	kv, _ := waitingReaders.Val()
	for i := 0; i+1 < len(kv) && len(st.Waiters) < 2*maxShown; i += 2 {
		st.Waiters = append(st.Waiters, waiter{Owner: kv[i], Kind: "read", WaitedMillis: -1, PlaceMillis: placeLeft(kv[i+1], nowMS)})
	}
	st.WaitersTotal = nWriters.Val() + nReaders.Val()
	return nil
}

// readSemaphore reads a Semaphore: two round trips, the second only for
// waiters.
func readSemaphore(ctx context.Context, rdb redis.UniversalClient, k keys.Semaphore, st *lockState) error {
	pipe := rdb.Pipeline()
	holders := pipe.ZRangeWithScores(ctx, k.Holders, 0, maxShown-1)
	size := pipe.HGet(ctx, k.State, ":size")
	used := pipe.HGet(ctx, k.State, ":used")
	last := pipe.HGet(ctx, k.Fence, "n")
	total := pipe.ZCard(ctx, k.Queue)
	queue := pipe.ZRangeWithScores(ctx, k.Queue, 0, maxShown-1)
	nowUS, err := execRead(ctx, pipe)
	if err != nil {
		return err
	}
	nowMS := nowUS / 1000
	st.Size, _ = strconv.ParseInt(size.Val(), 10, 64)
	st.Used, _ = strconv.ParseInt(used.Val(), 10, 64)
	st.LastFence, _ = strconv.ParseUint(last.Val(), 10, 64)
	st.WaitersTotal = total.Val()
	hs := holders.Val()
	var fields []string
	for _, z := range hs {
		tok, _ := z.Member.(string)
		fields = append(fields, tok, ":f:"+tok)
	}
	qs := queue.Val()
	ids := members(qs)
	pipe = rdb.Pipeline()
	var vals *redis.SliceCmd
	var data *redis.SliceCmd
	if len(fields) > 0 {
		vals = pipe.HMGet(ctx, k.State, fields...)
	}
	if len(ids) > 0 {
		data = pipe.HMGet(ctx, k.QueueData, ids...)
	}
	if len(fields)+len(ids) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	for i, z := range hs {
		h := holder{Owner: fields[2*i], TTLMillis: max(int64(z.Score)-nowMS, 0)}
		v := vals.Val()
		if s, ok := v[2*i].(string); ok {
			h.Count, _ = strconv.ParseInt(s, 10, 64)
		}
		if s, ok := v[2*i+1].(string); ok {
			h.Fence, _ = strconv.ParseUint(s, 10, 64)
		}
		st.Holders = append(st.Holders, h)
	}
	if len(st.Holders) > 0 {
		st.State = "held"
	}
	if len(ids) == 0 {
		return nil
	}
	st.Waiters = append(st.Waiters, queued(qs, ids, data.Val(), nowUS, func(w *waiter, f []string) {
		// "<place deadline ms> <ttl ms> <n> <secret> <token>"
		if len(f) == 5 {
			w.N, _ = strconv.ParseInt(f[2], 10, 64)
			w.Owner = f[4]
		}
	})...)
	return nil
}

// readOnce reads a Once: one round trip.
func readOnce(ctx context.Context, rdb redis.UniversalClient, k keys.Once, st *lockState) error {
	pipe := rdb.Pipeline()
	runner := pipe.HGet(ctx, k.Run, "t")
	ttl := pipe.PTTL(ctx, k.Run)
	value := pipe.HGet(ctx, k.Done, "v")
	doneTTL := pipe.PTTL(ctx, k.Done)
	if _, err := execRead(ctx, pipe); err != nil {
		return err
	}
	st.State = "idle"
	if value.Err() == nil {
		st.State, st.Done = "done", true
		st.ValueBytes = len(value.Val())
		st.DoneTTLMillis = pttl(doneTTL.Val())
	}
	if runner.Err() == nil && runner.Val() != "" {
		st.State = "running"
		st.Holders = append(st.Holders, holder{Owner: runner.Val(), Count: 1})
		st.TTLMillis = pttl(ttl.Val())
	}
	return nil
}
