// Package dsync gives a fleet of processes what package [sync] gives
// goroutines, shared through Redis, with every call taking a
// [context.Context]:
//
//   - [Mutex] is a distributed [sync.Mutex]: one holder at a time.
//   - [RWMutex] is a distributed [sync.RWMutex]: many readers or one writer,
//     with writer preference.
//   - [Once] is a distributed [sync.Once] whose function may fail: the name is
//     done only when the function returns nil.
//   - [Semaphore] is a distributed [golang.org/x/sync/semaphore.Weighted].
//
// A [Client], made by [New] over a go-redis client (single node, cluster or
// sentinel), hands out the primitives by name: every process that uses the
// same name and key prefix shares the same primitive. A [Quorum], made by
// [NewQuorum] over several independent masters, hands out Mutexes and
// RWMutexes only, each hold granted by a majority of the masters (Redlock);
// its handles are the same types as a Client's.
//
// Rules that hold everywhere:
//
//   - Handles are safe for concurrent use. Without an owner in ctx a handle
//     behaves like its sync twin; with [WithOwner] the owner carried in ctx
//     holds, may re-enter, and alone may release. [WithOwnerToken] and
//     [OwnerToken] carry an owner across processes. The goroutines acting
//     for one owner share its levels, as one holder: the levels of a hold
//     that was lost are gone with it, and once the owner holds again, an
//     unlock by any of them ends a level of the new hold (whose Lease tells
//     them when it ends).
//   - Every hold is bounded by a lease (see [TTL]) that the Client renews
//     while the hold lives; a holder that dies frees what it held when the
//     lease runs out. The Lease methods of Mutex, RWMutex and Semaphore give
//     a hold's [Lease]: Done and Err tell the holder if the hold was lost,
//     Token gives its fencing token. Once cancels the ctx of the running
//     function when its lease is lost.
//   - Waiting is event-driven (Redis pub/sub, one connection per Client), with
//     the remaining lease time as the only fallback. Mutex and Semaphore
//     waiters, and RWMutex writers, queue in Redis so that newcomers wait
//     behind long waiters; RWMutex gives writers preference over new
//     readers.
//   - A call whose ctx ends returns an error matching ctx.Err() and leaves
//     nothing held; releases run even with a done ctx. (What a failed call
//     may have taken on the server is undone in the background, retried
//     for up to 5 s; a server unreachable for longer keeps it until its
//     lease runs out.)
//   - Every state change is one Lua script, and scripts are idempotent
//     under go-redis's automatic retries: a copy of a call's script that
//     reaches the server within the replay window of 60 s after the call
//     changes nothing, however many calls came in between, and an unlock
//     or release never ends a later hold than the one it names. A copy of
//     a lock, acquire, Do or Reset attempt, of an unlock or release
//     (whatever hold it names), or of the release that marks a Once done,
//     that arrives more than 20 s after it was sent (in server
//     time, as the Client estimates it) changes nothing, however late it
//     arrives (for the first attempt of a Client whose clock is more than
//     40 s ahead of the server's, see README).
//   - Bad input is an error wrapping [ErrInvalid], returned before anything
//     is sent; remote state never causes a panic.
package dsync
