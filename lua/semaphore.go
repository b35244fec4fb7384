package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
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
