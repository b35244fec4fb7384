package dsync

import (
	"testing"

	"github.com/google/uuid"
)

// TestNewTokenIsUUIDv4 checks that holder tokens keep the form
// uuid.NewString gives them: random, version 4, RFC 4122 variant.
func TestNewTokenIsUUIDv4(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tok := newToken()
		u, err := uuid.Parse(tok)
		if err != nil {
			t.Fatalf("uuid.Parse(%q): %v", tok, err)
		}
		if u.Version() != 4 || u.Variant() != uuid.RFC4122 || u.String() != tok {
			t.Fatalf("token %q: version %d, variant %v; want a version 4 RFC 4122 UUID", tok, u.Version(), u.Variant())
		}
		if seen[tok] {
			t.Fatalf("token %q made twice", tok)
		}
		seen[tok] = true
	}
}
