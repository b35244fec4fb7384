package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
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
