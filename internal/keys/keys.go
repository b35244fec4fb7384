// Package keys is dsync's Redis key layout: the name of every key and
// notification channel of every primitive is built here and nowhere else.
//
// Every key of a name begins with the name's base key (see [Base]) and goes
// on with a suffix without braces, so that the base key's hash tag is the
// hash tag of every key of the name: all keys of one primitive live in one
// Redis Cluster slot, as its scripts require. Any name works, braces
// included: a name that cannot serve as its own hash tag is encoded. A Mutex, RWMutex, Semaphore
// and Once of one name are independent; their keys differ except for the
// fence hash that a Mutex and a Semaphore share (see [Mutex.Fence]).
//
// The field meanings below are those of the lua/*.lua scripts, whose
// headers are the reference. The layout and the formats stored in it belong
// to a module version: two versions that lay out or encode keys differently
// do not see each other's holds.
package keys

import (
	"encoding/base64"
	"strings"
)

// Key suffixes after the base key. None contains a brace.
const (
	mutexFence     = ":f"
	mutexQueue     = ":q"
	mutexQueueData = ":qd"
	mutexCalls     = ":x"

	rw                = ":rw"
	rwFence           = rw + ":f"
	rwReaders         = rw + ":r"
	rwReaderData      = rw + ":rc"
	rwWaitingWriters  = rw + ":ww"
	rwWaitingReaders  = rw + ":rq"
	rwCalls           = rw + ":x"
	rwWriterQueue     = rw + ":wq"
	rwWriterQueueData = rw + ":wd"

	semState     = ":s"
	semFence     = mutexFence // shared with the Mutex of the name
	semHolders   = ":sh"
	semQueue     = ":sq"
	semQueueData = ":sqd"
	semCalls     = ":sx"

	onceRun   = ":once"
	onceDone  = onceRun + ":done"
	onceCalls = onceRun + ":x"
)

// suffixes is every suffix of every primitive, the base key's "" included.
var suffixes = []string{
	"", mutexFence, mutexQueue, mutexQueueData, mutexCalls,
	rw, rwFence, rwReaders, rwReaderData, rwWaitingWriters, rwWaitingReaders, rwCalls, rwWriterQueue, rwWriterQueueData,
	semState, semHolders, semQueue, semQueueData, semCalls,
	onceRun, onceDone, onceCalls,
}

// Base returns the base key of the primitives called name under prefix,
// "<prefix>:{<tag>}", which begins every key of the name. The tag is the
// name itself, or, for an empty name or one that begins with '}' or '=',
// '=' followed by the name in unpadded base64url.
//
// Redis Cluster hashes a key by the text between its first '{' and the
// first '}' after it, unless that text is empty. A name that begins with
// '}' would give an empty tag, and each key of the name would hash in full,
// to slots of its own; the encoding contains no '}'. Names that begin with
// '=' are encoded too, so that no name's tag looks like another's encoding
// and two names never share keys. Any other name, braces included, is its
// own tag: its keys are those of earlier versions. Such a name's slot is
// chosen by its text up to its first '}' ("a}1" and "a}2" share the slot
// of "a"), and all its keys stay in that slot. All this holds for a prefix
// without braces; one with braces sets the hash tag itself ("{app}" puts
// every name in one slot, and "x{}" would split a primitive's keys).
func Base(prefix, name string) string {
	return prefix + ":{" + tag(name) + "}"
}

// marker begins the tag of an encoded name.
const marker = '='

var enc = base64.RawURLEncoding.Strict()

// tag returns what Base puts between the braces for name.
func tag(name string) string {
	if name == "" || name[0] == '}' || name[0] == marker {
		return string(marker) + enc.EncodeToString([]byte(name))
	}
	return name
}

// untag returns the name for which Base puts t between the braces, or
// false if there is none.
func untag(t string) (string, bool) {
	if t == "" || t[0] == '}' {
		return "", false
	}
	if t[0] != marker {
		return t, true
	}
	b, err := enc.DecodeString(t[1:])
	// The tag of an ordinary name is the name: its encoding is no tag.
	if err != nil || tag(string(b)) != t {
		return "", false
	}
	return string(b), true
}

// Name returns the name of the primitive that key belongs to, or false if
// key is no key of the layout under prefix.
func Name(prefix, key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, prefix+":{")
	if !ok {
		return "", false
	}
	// No suffix contains '}', so the last one closes the tag.
	i := strings.LastIndexByte(rest, '}')
	if i < 0 || !isSuffix(rest[i+1:]) {
		return "", false
	}
	return untag(rest[:i])
}

// Match returns a SCAN MATCH pattern for the keys under prefix of the
// names that match the glob pattern (Redis's syntax: * ? [...] \). The
// prefix is taken literally. Its matches may include keys of other names:
// take the name of each with [Name] and check it against pattern.
func Match(prefix, pattern string) string {
	if mayMatchEncoded(pattern) {
		// Encoded tags are not the names: every key has to be looked at.
		return globEscape(prefix) + ":{*"
	}
	return globEscape(prefix) + ":{" + pattern + "}*"
}

// mayMatchEncoded reports whether pattern may match a name that is
// encoded: whether its first character is not a literal one that no
// encoded name begins with.
func mayMatchEncoded(pattern string) bool {
	if pattern == "" {
		return true
	}
	c := pattern[0]
	switch c {
	case '*', '?', '[':
		return true
	case '\\':
		if len(pattern) < 2 {
			return true
		}
		c = pattern[1]
	}
	return c == '}' || c == marker
}

// globEscape quotes the glob characters of s for SCAN MATCH.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isSuffix(s string) bool {
	for _, x := range suffixes {
		if s == x {
			return true
		}
	}
	return false
}

// Mutex names the keys of a Mutex (lua/mutex_lock.lua).
type Mutex struct {
	// Lock is the lock hash, alive while the lock is held (its PTTL is the
	// hold's lease): <holder token> -> reentry count, ':f' fencing token of
	// the hold, ':c' ids of the last calls applied to the hold (so an
	// abandoned call undoes only its own effect), ':w' set once someone
	// waits (the release then publishes), ':p' the call ids' prune marker
	// as the hold's first call left it, ':d' set once an Unlock lowered
	// the count (lua/mutex_unlock.lua), ':k' how many releases in a row
	// passed the lock to a call waiting in the releaser's process (set on
	// a hold so given; dsync's cohort.go). The holder token is the owner
	// token, under client reentrancy qualified by the Client
	// ("<owner token>@<client id>").
	Lock string
	// Fence is the fence hash, which outlives holds with an idle expiry:
	// 'n' last fencing token, 'e' when the hash expires (server ms, as the
	// scripts last set it: lua/lib.lua's set_fence). The Semaphore of the same name uses the same
	// hash on purpose (its field is 'n' too): one sequence of fencing
	// tokens per name, and one key left per released name rather than two.
	Fence string
	// Queue is the queue zset: waiter token -> arrival (server µs).
	Queue string
	// QueueData is the queue data hash: waiter token -> "<place deadline
	// ms> <ttl ms> <call id> <secret>", the secret being the proof of a
	// hand-over to that call (lua/lib.lua).
	QueueData string
	// Calls is the call ids zset (lua/lib.lua): call id -> (forget-after ms)
	// * 4 + what the call did (Lock: 1 took or re-entered, 2 abandoned;
	// Unlock: 1 released, 2 lowered the count), and the member ':p' ->
	// (when old ids are pruned next, ms) * 4. It expires with the replay
	// window and may outlive a hold by that much.
	Calls string
}

// ForMutex returns the keys of the Mutex called name under prefix.
func ForMutex(prefix, name string) Mutex {
	b := Base(prefix, name)
	return Mutex{Lock: b, Fence: b + mutexFence, Queue: b + mutexQueue, QueueData: b + mutexQueueData,
		Calls: b + mutexCalls}
}

// Keys returns the keys in the order of the scripts' KEYS: lock hash, fence
// hash, queue, queue data, call ids.
func (k Mutex) Keys() []string { return []string{k.Lock, k.Fence, k.Queue, k.QueueData, k.Calls} }

// Channel returns the channel on which releases and hand-overs are
// published: the name of the lock hash.
func (k Mutex) Channel() string { return k.Lock }

// RWMutex names the keys of an RWMutex (lua/rwmutex_lock.lua). They are
// distinct from the keys of the Mutex of the same name, its fence hash
// included.
type RWMutex struct {
	// Writer is the writer hash, alive while a writer holds the lock (its
	// PTTL is the write lease): <holder token> (as for [Mutex.Lock]) ->
	// reentry count, ':f' fencing token of the write hold, ':c' ids of the
	// last calls applied to it (at most 16, space-separated, latest last;
	// what an abandon may undo), ':p', ':d' and ':k' as for [Mutex.Lock].
	Writer string
	// Fence is the fence hash, which outlives holds with an idle expiry:
	// 'n' last fencing token, 'e' when the hash expires (as for
	// [Mutex.Fence]).
	Fence string
	// Readers is the readers zset: reader token -> lease deadline (server
	// ms). Each reader's share expires alone.
	Readers string
	// ReaderData is the readers hash: reader token -> "<reentry count>
	// <hold id> <ids of the last calls applied>"; the hold id, drawn from
	// the id of the call that began the read hold, is what an RUnlock
	// names.
	ReaderData string
	// WaitingWriters is the waiting writers zset: writer token -> place
	// deadline (ms); while one lives, new readers wait.
	WaitingWriters string
	// WaitingReaders is the waiting readers hash: reader token -> "<place
	// deadline ms> <ttl ms> <call id>".
	WaitingReaders string
	// Calls is the call ids zset (lua/lib.lua), as for [Mutex.Calls]:
	// lock calls 1 took, re-entered or were granted the hold, 2 abandoned
	// or refused for good; unlocks 1 released, 2 lowered the count, 0 did
	// not hold.
	Calls string
	// WriterQueue is the writers' queue zset: queued writer token ->
	// arrival (server µs). A writer queues once it has waited past the
	// starvation threshold, or when others are queued; the head gets the
	// lock first.
	WriterQueue string
	// WriterQueueData is the queued writers hash: queued writer token ->
	// "<ttl ms> <call id> <secret>", the secret being the proof of a
	// hand-over to that call (lua/lib.lua); a place lives as long as the
	// writer's place in WaitingWriters.
	WriterQueueData string
}

// ForRWMutex returns the keys of the RWMutex called name under prefix.
func ForRWMutex(prefix, name string) RWMutex {
	b := Base(prefix, name)
	return RWMutex{
		Writer:          b + rw,
		Fence:           b + rwFence,
		Readers:         b + rwReaders,
		ReaderData:      b + rwReaderData,
		WaitingWriters:  b + rwWaitingWriters,
		WaitingReaders:  b + rwWaitingReaders,
		Calls:           b + rwCalls,
		WriterQueue:     b + rwWriterQueue,
		WriterQueueData: b + rwWriterQueueData,
	}
}

// Keys returns the keys in the order of the lock and unlock scripts' KEYS:
// writer hash, fence hash, readers zset, readers hash, waiting writers
// zset, waiting readers hash, call ids zset, writers' queue zset, queued
// writers hash.
func (k RWMutex) Keys() []string {
	return []string{k.Writer, k.Fence, k.Readers, k.ReaderData, k.WaitingWriters,
		k.WaitingReaders, k.Calls, k.WriterQueue, k.WriterQueueData}
}

// Channel returns the channel on which releases and hand-overs are
// published: the name of the writer hash.
func (k RWMutex) Channel() string { return k.Writer }

// Semaphore names the keys of a Semaphore (lua/semaphore_lib.lua).
type Semaphore struct {
	// State is the state hash: ':size' the size in force, ':used' permits
	// held in all, <token> -> permits held by that holder, ':f:'<token> ->
	// fencing token of that holding, ':c:'<token> -> ids of the latest
	// Acquire calls applied to that holding (what an abandon may undo).
	State string
	// Fence is the fence hash, the Mutex's of the same name (see
	// [Mutex.Fence]): 'n' last fencing token.
	Fence string
	// Holders is the holders zset: holder token -> lease deadline (server
	// ms).
	Holders string
	// Queue is the queue zset: Acquire call id -> arrival (server µs).
	Queue string
	// QueueData is the queue data hash: call id -> "<place deadline ms>
	// <ttl ms> <n> <secret> <token>", the secret being the proof of a
	// hand-over to that call (lua/lib.lua).
	QueueData string
	// Calls is the call ids zset (lua/lib.lua), as for [Mutex.Calls]:
	// Acquire calls 1 took or were granted permits, 2 abandoned or refused
	// for good; releases 1 ended the holding, 2 lowered it, 0 found nothing
	// held, 3 refused.
	Calls string
}

// ForSemaphore returns the keys of the Semaphore called name under prefix.
func ForSemaphore(prefix, name string) Semaphore {
	b := Base(prefix, name)
	return Semaphore{State: b + semState, Fence: b + semFence, Holders: b + semHolders,
		Queue: b + semQueue, QueueData: b + semQueueData, Calls: b + semCalls}
}

// Keys returns the keys in the order of the scripts' KEYS: state hash,
// fence hash, holders zset, queue zset, queue data hash, call ids zset.
func (k Semaphore) Keys() []string {
	return []string{k.State, k.Fence, k.Holders, k.Queue, k.QueueData, k.Calls}
}

// Channel returns the channel on which releases and hand-overs are
// published: the name of the state hash.
func (k Semaphore) Channel() string { return k.State }

// Once names the keys of a Once (lua/once_do.lua).
type Once struct {
	// Run is the run hash, alive while a call runs f (its PTTL is the run
	// lease): 't' token of the runner's call, 'w' set once someone waits
	// (the end of the run then publishes).
	Run string
	// Done is the done hash, the done mark: 'v' the value stored by the run
	// that succeeded, 't' its call token. It persists, or expires after the
	// Once's period.
	Done string
	// Calls is the call ids zset (lua/lib.lua, lua/once_lib.lua): the calls
	// that took a run, waited for one or gave up, remembered for the replay
	// window so that a late copy of their script takes no run.
	Calls string
}

// ForOnce returns the keys of the Once called name under prefix.
func ForOnce(prefix, name string) Once {
	b := Base(prefix, name)
	return Once{Run: b + onceRun, Done: b + onceDone, Calls: b + onceCalls}
}

// Keys returns the keys in the order of the scripts' KEYS: run hash, done
// hash, call ids.
func (k Once) Keys() []string { return []string{k.Run, k.Done, k.Calls} }

// Channel returns the channel on which the end of a run is published: the
// name of the run hash.
func (k Once) Channel() string { return k.Run }
