package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
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
