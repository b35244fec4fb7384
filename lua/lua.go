// Package lua holds dsync's Redis scripts. Every state change of a primitive
// is one of these scripts; each file's header lists its KEYS, ARGV and reply.
package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed mutex_lock.lua
	mutexLock string
	//go:embed mutex_unlock.lua
	mutexUnlock string
	//go:embed mutex_renew.lua
	mutexRenew string
)

// Mutex scripts.
var (
	MutexLock   = redis.NewScript(mutexLock)
	MutexUnlock = redis.NewScript(mutexUnlock)
	MutexRenew  = redis.NewScript(mutexRenew)
)

var (
	//go:embed rwmutex_lock.lua
	rwmutexLock string
	//go:embed rwmutex_unlock.lua
	rwmutexUnlock string
	//go:embed rwmutex_renew.lua
	rwmutexRenew string
	//go:embed rwmutex_rrenew.lua
	rwmutexRRenew string
)

// RWMutex scripts.
var (
	RWMutexLock   = redis.NewScript(rwmutexLock)
	RWMutexUnlock = redis.NewScript(rwmutexUnlock)
	RWMutexRenew  = redis.NewScript(rwmutexRenew)
	RWMutexRRenew = redis.NewScript(rwmutexRRenew)
)

var (
	//go:embed semaphore_lib.lua
	semaphoreLib string
	//go:embed semaphore_acquire.lua
	semaphoreAcquire string
	//go:embed semaphore_release.lua
	semaphoreRelease string
	//go:embed semaphore_abandon.lua
	semaphoreAbandon string
	//go:embed semaphore_renew.lua
	semaphoreRenew string
)

// Semaphore scripts. Acquire, release and abandon begin with the shared
// definitions of semaphore_lib.lua.
var (
	SemaphoreAcquire = redis.NewScript(semaphoreLib + semaphoreAcquire)
	SemaphoreRelease = redis.NewScript(semaphoreLib + semaphoreRelease)
	SemaphoreAbandon = redis.NewScript(semaphoreLib + semaphoreAbandon)
	SemaphoreRenew   = redis.NewScript(semaphoreRenew)
)

var (
	//go:embed once_do.lua
	onceDo string
	//go:embed once_release.lua
	onceRelease string
	//go:embed once_renew.lua
	onceRenew string
)

// Once scripts.
var (
	OnceDo      = redis.NewScript(onceDo)
	OnceRelease = redis.NewScript(onceRelease)
	OnceRenew   = redis.NewScript(onceRenew)
)
