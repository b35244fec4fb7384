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
