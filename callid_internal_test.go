package dsync

import (
	"strings"
	"sync"
	"testing"
)

// TestCallIDs checks the ids cut from chunks: fixed width, base 36, all
// distinct across chunks and goroutines, and no allocation of their own.
func TestCallIDs(t *testing.T) {
	const goroutines, each = 8, 3 * callIDsPerChunk
	ids := make([][]string, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for range each {
				ids[g] = append(ids[g], newCallID())
			}
		})
	}
	wg.Wait()
	seen := make(map[string]bool, goroutines*each)
	for _, list := range ids {
		for _, id := range list {
			if len(id) != callIDLen || strings.Trim(id, "0123456789abcdefghijklmnopqrstuvwxyz") != "" {
				t.Fatalf("call id %q: want %d base-36 digits", id, callIDLen)
			}
			if seen[id] {
				t.Fatalf("call id %q handed out twice", id)
			}
			seen[id] = true
		}
	}
	if n := testing.AllocsPerRun(10*callIDsPerChunk, func() { _ = newCallID() }); n > 0.1 {
		t.Fatalf("%.2f allocations per call id, want at most 2 per chunk of %d", n, callIDsPerChunk)
	}
}
