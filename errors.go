package dsync

import "errors"

// Errors returned by dsync. Compare with errors.Is: an error from a call
// whose ctx ended matches both the ctx error and, where one applies, the
// sentinel below.
var (
	// ErrNotHeld is returned by an unlock or release of something the
	// caller's owner (or, without an owner, the handle) does not hold.
	ErrNotHeld = errors.New("dsync: not held")

	// ErrLeaseLost reports that a hold ended without being released: its
	// lease expired, its keys were deleted, or Redis lost it. The holder must
	// assume another process may now hold it.
	ErrLeaseLost = errors.New("dsync: lease lost")

	// ErrClosed is returned by calls on a primitive whose Client was closed.
	ErrClosed = errors.New("dsync: client closed")

	// ErrInvalid reports bad input: an empty name, a TTL ≤ 0, a nil client,
	// an unusable owner token, a count out of range. Nothing was sent to
	// Redis. The error text says which argument.
	ErrInvalid = errors.New("dsync: invalid argument")

	// ErrUpgrade is returned by RWMutex.Lock and TryLock when the caller's
	// owner holds a read lock on the same RWMutex: waiting for the write
	// lock would wait for itself. Release the read lock first.
	ErrUpgrade = errors.New("dsync: write lock requested while holding a read lock")

	// ErrSizeMismatch is returned by Semaphore calls whose size differs from
	// the size of the semaphore in force under the same name.
	ErrSizeMismatch = errors.New("dsync: semaphore size differs from the one in force")

	// ErrNotReplicated is returned by an acquire made with WaitReplicas when
	// fewer replicas than asked acknowledged the hold in time. The hold was
	// released again: a failover could have lost it.
	ErrNotReplicated = errors.New("dsync: too few replicas acknowledged the hold")

	// ErrCorrupt reports data in a primitive's keys that dsync did not
	// write: a key of another type, garbage in a field, a hold without an
	// expiry, a fencing counter at or past 2^53. A call that returns it
	// took no hold; the name works again once the bad key expires or is
	// removed.
	ErrCorrupt = errors.New("dsync: unexpected data in Redis")

	// ErrNoQuorum is returned by a handle of a [Quorum] when fewer
	// than a majority of its masters answered: nothing can be granted (or
	// released) safely. The error also wraps the first member's error.
	ErrNoQuorum = errors.New("dsync: no quorum of masters answered")
)
