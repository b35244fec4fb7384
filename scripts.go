package dsync

import "github.com/dsync-go/dsync/lua"

// The scripts dsync runs, built once from lua/. Those on a hot path are
// wrapped (see script) so that a call boxes only its own arguments.
var (
	mutexLock   = newScript(lua.Script("mutex_lock"))
	mutexUnlock = newScript(lua.Script("mutex_unlock"))
	mutexRenew  = lua.Script("mutex_renew")

	rwLock   = lua.Script("rwmutex_lock")
	rwUnlock = lua.Script("rwmutex_unlock")
	rwRenew  = lua.Script("rwmutex_renew")
	rwRRenew = lua.Script("rwmutex_rrenew")

	semAcquire = newScript(lua.Script("semaphore_acquire"))
	semRelease = newScript(lua.Script("semaphore_release"))
	semAbandon = newScript(lua.Script("semaphore_abandon"))
	semRenew   = lua.Script("semaphore_renew")

	onceDo      = lua.Script("once_do")
	onceRelease = lua.Script("once_release")
	onceRenew   = lua.Script("once_renew")
)
