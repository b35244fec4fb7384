package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dsync-go/dsync/internal/redistest"
)

// A subcommand's -h prints its help once, on stdout; a bad flag is one
// line on stderr and nothing on stdout, with the usage exit code (as for
// every other usage error: a script that reads stdout gets no help text).
func TestSubcommandHelpOnceBadFlagOneLine(t *testing.T) {
	for _, sub := range []string{"demo", "run", "inspect", "list"} {
		var stdout, stderr bytes.Buffer
		if code := Main([]string{sub, "-h"}, &stdout, &stderr); code != exitOK {
			t.Errorf("dsync %s -h: code %d, want %d", sub, code, exitOK)
		}
		if n := strings.Count(stdout.String(), "Usage: dsync "+sub); n != 1 || stderr.Len() != 0 {
			t.Errorf("dsync %s -h: the help %d times on stdout, stderr %q; want once, nothing", sub, n, stderr.String())
		}
		stdout.Reset()
		stderr.Reset()
		if code := Main([]string{sub, "-no-such-flag"}, &stdout, &stderr); code != exitUsage {
			t.Errorf("dsync %s -no-such-flag: code %d, want %d", sub, code, exitUsage)
		}
		if stdout.Len() != 0 || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("dsync %s -no-such-flag: stdout %q, stderr %q; want nothing and one line", sub, stdout.String(), stderr.String())
		}
	}
}

// An empty -prefix, which dsync.Prefix rejects, is a bad usage of every
// subcommand (exit 2, one line on stderr), found before anything is sent:
// not a Redis error after connecting (run, demo), nor an inspection of
// keys no Client writes (inspect, list).
func TestEmptyPrefixIsBadUsage(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "-prefix", "", "-for", "0"},
		{"run", "-prefix", "", "-redis", "redis://127.0.0.1:1", "x", "--", "true"},
		{"inspect", "-prefix", "", "-redis", "redis://127.0.0.1:1", "x"},
		{"list", "-prefix", "", "-redis", "redis://127.0.0.1:1"},
	} {
		var stdout, stderr bytes.Buffer
		code := Main(args, &stdout, &stderr)
		if code != exitUsage || stdout.Len() != 0 || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("dsync %q: code %d, stdout %q, stderr %q; want %d, nothing, one line", args, code, stdout.String(), stderr.String(), exitUsage)
		}
	}
}

// A -ttl outside what dsync.TTL accepts (1 ms to dsync.MaxTTL) is a bad
// usage of run, found before anything is sent.
//
// Before: -ttl 25h connected, and the lock attempt failed with
// ErrInvalid: exit 1 ("cannot reach Redis" on a closed port). After:
// exit 2 with the bounds.
func TestRunTTLOutOfRangeIsBadUsage(t *testing.T) {
	for _, ttl := range []string{"0", "25h"} {
		var stdout, stderr bytes.Buffer
		code := Main([]string{"run", "-ttl", ttl, "-redis", "redis://127.0.0.1:1", "x", "--", "true"}, &stdout, &stderr)
		if code != exitUsage || stdout.Len() != 0 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "-ttl") {
			t.Errorf("dsync run -ttl %s: code %d, stdout %q, stderr %q; want %d, nothing, one line on -ttl", ttl, code, stdout.String(), stderr.String(), exitUsage)
		}
	}
}

// TestDemoKeysExpireWithinAnHour: "dsync demo -h" promises that the
// demo's keys expire within an hour.
//
// Before: the contention Mutex's fencing counter was left with dsync's idle
// expiry of 12 to 24 hours. After: the demo deletes it when the run ends;
// every key left expires within demoKeyLife.
func TestDemoKeysExpireWithinAnHour(t *testing.T) {
	b, ok := redistest.Real(t)
	if !ok {
		t.Skip("no redis-server")
	}
	prefix := redistest.Key(t)
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"demo", "-redis", "redis://" + b.Addrs[0], "-prefix", prefix, "-replicas", "2", "-for", "300ms"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("demo: code %d, stderr %q", code, stderr.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := b.NewClient(t)
	ks, err := rdb.Keys(ctx, prefix+":*").Result()
	if err != nil || len(ks) == 0 {
		t.Fatalf("keys of the demo: %q, %v; want some", ks, err)
	}
	for _, k := range ks {
		if d, err := rdb.PTTL(ctx, k).Result(); err != nil || d < 0 || d > demoKeyLife {
			t.Errorf("key %q: PTTL %v, %v; want at most %v", k, d, err, demoKeyLife)
		}
	}
}
