package main

// The inspect and list commands: they read what dsync keeps in Redis
// (state.go, read.go; list finds the names with scan.go) and print it
// (format.go), changing nothing.

import (
	"context"
	"fmt"
	"io"
)

// defaultLimit is how many names list shows at most, by default.
const defaultLimit = 1000

const inspectHead = `Usage: dsync inspect [flags] NAME

Shows, without changing anything, every primitive found under NAME (a
Mutex, RWMutex, Semaphore and Once of one name are independent): its mode
(mutex, rwmutex, semaphore, once), state (held; running, done or idle for a
Once; free when only bookkeeping is left: a fencing counter, ids of recent
calls; absent), holders (owner token with reentry count, read/write kind, or
permits; the token of the running call for a Once), lease TTL left, fencing
token of the hold and the last one given out, and waiters (owner, time
queued, how long the place lasts). Tokens of holders started by "dsync run"
read HOST/PID/RANDOM; under client reentrancy a Mutex or RWMutex holder
reads TOKEN@CLIENT, the owner token and the id of the Client that counts its
re-entries.

Mutex waiters appear from their first refused attempt, when they join the
lock's queue; RWMutex writers once they have waited past 1 ms; waiters of a
Once are not recorded.
`

const inspectTail = `Exit status: 0 (also for a name that is free or absent), 1 on an error,
2 on bad usage.

-json prints an array with one object per primitive (one object with mode ""
when there is none): name, key, mode, state, holders [{owner, count, kind,
ttl_ms, fence}], ttl_ms (-1: none), fence, last_fence, contended, size, used,
done, value_bytes, done_ttl_ms, waiters [{owner, kind, n, waited_ms (-1:
unknown), place_ttl_ms}], waiters_total. Fields that do not apply are left
out.
`

func cmdInspect(args []string, stdout, stderr io.Writer) int {
	var c conn
	fs := newFlagSet("inspect", inspectHead, inspectTail, stdout)
	c.register(fs, defaultURL)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if code, done := parse(fs, args, stderr); done {
		return code
	}
	if fs.NArg() != 1 {
		return usageErr(stderr, "inspect", "want exactly one NAME, got %d arguments", fs.NArg())
	}
	name := fs.Arg(0)
	if name == "" {
		return usageErr(stderr, "inspect", "empty NAME")
	}
	ctx := context.Background()
	rdb, code := c.open(ctx, "inspect", stderr)
	if rdb == nil {
		return code
	}
	defer rdb.Close()
	sts, err := inspect(ctx, rdb, c.prefix, name)
	if err != nil {
		return fail(stderr, "inspect", exitError, err)
	}
	if *asJSON {
		if err := writeJSON(stdout, sts); err != nil {
			return fail(stderr, "inspect", exitError, err)
		}
		return exitOK
	}
	for i, st := range sts {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		writeState(stdout, st)
	}
	return exitOK
}

const listHead = `Usage: dsync list [flags] [PATTERN]

Lists the primitives whose names match the glob PATTERN (default *, Redis
MATCH syntax), one line each: name, mode, state, first holder, its reentry
count (permits for a semaphore), lease TTL left, fencing token (of the hold,
else the last one given out) and waiters. Without -all only primitives in
use are listed (held, running, waited for); -all adds idle ones: a Once that
is done or idle, a name that only keeps bookkeeping (its fencing counter,
ids of recent calls).

Keys are found with SCAN (on every master of a cluster), never KEYS: at most
-limit names, and at most 10000 SCAN calls per node.
`

const listTail = `Exit status: 0, 1 on an error, 2 on bad usage; a note on stderr says when
the list was cut short. A name whose keys cannot be read (data dsync did not
write, such as a key of the wrong type) is reported on stderr, one line
each, and the others are listed; the exit status is then 1. -json prints
an array of the objects "dsync inspect -json" prints.
`

func cmdList(args []string, stdout, stderr io.Writer) int {
	var c conn
	fs := newFlagSet("list", listHead, listTail, stdout)
	c.register(fs, defaultURL)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	all := fs.Bool("all", false, "also list idle primitives (free, done) and names that only keep bookkeeping")
	limit := fs.Int("limit", defaultLimit, "list at most `n` names")
	if code, done := parse(fs, args, stderr); done {
		return code
	}
	if fs.NArg() > 1 {
		return usageErr(stderr, "list", "want at most one PATTERN, got %d arguments", fs.NArg())
	}
	if *limit < 1 {
		return usageErr(stderr, "list", "-limit %d, want at least 1", *limit)
	}
	pattern := "*"
	if fs.NArg() == 1 && fs.Arg(0) != "" {
		pattern = fs.Arg(0)
	}
	ctx := context.Background()
	rdb, code := c.open(ctx, "list", stderr)
	if rdb == nil {
		return code
	}
	defer rdb.Close()
	names, truncated, err := scanNames(ctx, rdb, c.prefix, pattern, *limit)
	if err != nil {
		return fail(stderr, "list", exitError, err)
	}
	sts := []*lockState{}
	code = exitOK
	for _, n := range names {
		got, err := inspect(ctx, rdb, c.prefix, n)
		if err != nil {
			// Foreign data under one name (a wrong type, ...) hides
			// none of the others.
			code = fail(stderr, "list", exitError, fmt.Errorf("%q: %w", n, err))
			continue
		}
		for _, st := range got {
			busy := st.State == "held" || st.State == "running" || st.WaitersTotal > 0
			if st.State == "absent" || (!*all && !busy) {
				continue
			}
			sts = append(sts, st)
		}
	}
	if truncated {
		fmt.Fprintf(stderr, "dsync list: stopped after %d names; narrow PATTERN or raise -limit\n", len(names))
	}
	if *asJSON {
		if err := writeJSON(stdout, sts); err != nil {
			return fail(stderr, "list", exitError, err)
		}
		return code
	}
	writeTable(stdout, sts)
	return code
}
