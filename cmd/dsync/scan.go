package main

import (
	"context"
	"sort"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/internal/keys"
)

// Finding names: list scans the keys under a prefix for the names that
// match a pattern, on every master of a cluster.

const (
	scanCount    = 1000   // COUNT hint of each SCAN call
	maxScanCalls = 10_000 // SCAN calls per node before list gives up
)

// scanNames returns the names under prefix that match the glob pattern,
// at most limit of them, scanning every master of a cluster. It reports
// whether it stopped early. SCAN's MATCH narrows the keys the server sends
// where it can (see keys.Match); the names are then matched here, since an
// encoded name's keys do not contain the name.
func scanNames(ctx context.Context, rdb redis.UniversalClient, prefix, pattern string, limit int) ([]string, bool, error) {
	match := keys.Match(prefix, pattern)
	seen := map[string]bool{}
	var names []string
	truncated := false
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for range maxScanCalls {
			ks, next, err := c.Scan(ctx, cursor, match, scanCount).Result()
			if err != nil {
				return err
			}
			for _, k := range ks {
				n, ok := keys.Name(prefix, k)
				if !ok || seen[n] || !globMatch(pattern, n) {
					continue
				}
				if len(names) >= limit {
					truncated = true
					return nil
				}
				seen[n] = true
				names = append(names, n)
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
		truncated = true
		return nil
	}
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		// Masters are scanned one after the other, so names needs no lock;
		// ForEachMaster calls its function on all of them at once.
		var mu sync.Mutex
		var masters []*redis.Client
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			masters = append(masters, c)
			return nil
		})
		for _, c := range masters {
			if err == nil {
				err = scan(ctx, c)
			}
		}
	} else {
		err = scan(ctx, rdb)
	}
	sort.Strings(names)
	return names, truncated, err
}

// globMatch reports whether s matches the glob pattern p as Redis's MATCH
// does, byte by byte: '*' any bytes, '?' one byte, "[abc]", "[^a-z]" one
// byte of a set (or not of it), '\' quotes the next byte.
func globMatch(p, s string) bool {
	for len(p) > 0 && len(s) > 0 {
		switch p[0] {
		case '*':
			for len(p) > 1 && p[1] == '*' {
				p = p[1:]
			}
			if len(p) == 1 {
				return true
			}
			for i := range len(s) {
				if globMatch(p[1:], s[i:]) {
					return true
				}
			}
			return false
		case '?':
			p, s = p[1:], s[1:]
		case '[':
			p = p[1:]
			not := len(p) > 0 && p[0] == '^'
			if not {
				p = p[1:]
			}
			match := false
			for len(p) > 0 && p[0] != ']' {
				switch {
				case p[0] == '\\' && len(p) >= 2:
					p = p[1:]
					match = match || p[0] == s[0]
				case len(p) >= 3 && p[1] == '-':
					lo, hi := min(p[0], p[2]), max(p[0], p[2])
					match = match || (lo <= s[0] && s[0] <= hi)
					p = p[2:]
				default:
					match = match || p[0] == s[0]
				}
				p = p[1:]
			}
			if match == not {
				return false
			}
			if len(p) > 0 {
				p = p[1:] // the closing ']'; without one the set ends the pattern
			}
			s = s[1:]
		case '\\':
			if len(p) >= 2 {
				p = p[1:]
			}
			fallthrough
		default:
			if p[0] != s[0] {
				return false
			}
			p, s = p[1:], s[1:]
		}
	}
	for len(s) == 0 && len(p) > 0 && p[0] == '*' {
		p = p[1:]
	}
	return len(p) == 0 && len(s) == 0
}
