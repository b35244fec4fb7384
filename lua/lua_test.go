package lua_test

import (
	"strings"
	"testing"

	"github.com/dsync-go/dsync/lua"
)

func TestEveryScriptHasAHeaderAndACopyIsFresh(t *testing.T) {
	names := lua.Names()
	if len(names) < 10 {
		t.Fatalf("Names() = %v, want every script", names)
	}
	for _, n := range names {
		src := lua.Source(n)
		if !strings.HasPrefix(src, "-- ") {
			t.Errorf("%s: no header comment", n)
		}
		if !strings.Contains(src, "KEYS[") {
			t.Errorf("%s: header names no KEYS", n)
		}
	}
	if lua.Script("mutex_lock") == lua.Script("mutex_lock") {
		t.Error("Script returned the same value twice: callers could change dsync's scripts")
	}
}
