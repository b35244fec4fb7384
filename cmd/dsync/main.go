// Command dsync uses dsync locks from the shell.
//
//	dsync demo     [flags]                       the noon lottery and a contention run
//	dsync run      [flags] NAME -- CMD [ARGS...] run CMD while holding the Mutex NAME
//	dsync inspect  [flags] NAME                  show the state of one lock
//	dsync list     [flags] [PATTERN]             show the locks whose names match PATTERN
//
// Every subcommand connects to the Redis given by -redis URL or, without it,
// by the REDIS_URL environment variable, in go-redis URL form
// (redis://[user:password@]host:port/db, rediss:// for TLS). demo without
// either runs on an embedded Redis (miniredis); the others default to
// redis://localhost:6379. See "dsync CMD -h" for each subcommand's flags.
//
// Exit status: 0 on success; 1 on an error (one line on stderr); 2 on bad
// usage. run exits with CMD's status (128+n if CMD died of signal n, 126 if
// it could not be started, 127 if it was not found), 73 if the lock stayed
// held by another owner for the whole -wait, 75 if the lease was lost while
// CMD ran, and 128+n if dsync got signal n before CMD started.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
)

// Exit codes.
const (
	exitOK      = 0
	exitError   = 1
	exitUsage   = 2
	exitHeld    = 73  // run: the lock stayed held for the whole -wait
	exitLost    = 75  // run: the lease was lost while CMD ran
	exitCannot  = 126 // run: CMD could not be started
	exitMissing = 127 // run: CMD was not found
	exitSignal  = 128 // + signal number
)

const (
	envURL       = "REDIS_URL"
	defaultURL   = "redis://localhost:6379"
	pingTimeout  = 5 * time.Second
	clusterState = time.Second // ClusterStateReloadInterval of -cluster clients
)

const usage = `dsync: distributed locks on Redis, from the shell

Usage:
  dsync demo    [flags]                        the noon lottery, then a contention run
  dsync run     [flags] NAME -- CMD [ARGS...]  run CMD while holding the Mutex NAME (like flock(1))
  dsync inspect [flags] NAME                   show holders, owners, TTL, fencing token, waiters
  dsync list    [flags] [PATTERN]              the same for every lock whose name matches PATTERN

Redis is chosen by -redis URL, else $REDIS_URL, in go-redis URL form:
  redis://[[user]:password@]host[:port][/db]   rediss://... for TLS
demo without either runs on an embedded Redis; the others default to
redis://localhost:6379.

Run "dsync COMMAND -h" for a command's flags and exit codes.
`

func main() {
	// go-redis logs dial failures on its own; dsync reports errors once.
	redis.SetLogger(quietLogger{})
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// Main runs the command line args and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "demo":
		return cmdDemo(rest, stdout, stderr)
	case "run":
		return cmdRun(rest, stdout, stderr)
	case "inspect":
		return cmdInspect(rest, stdout, stderr)
	case "list":
		return cmdList(rest, stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "dsync: unknown command %q (want demo, run, inspect or list; dsync -h for help)\n", cmd)
		return exitUsage
	}
}

// fail prints one error line for command cmd and returns code.
func fail(stderr io.Writer, cmd string, code int, err error) int {
	msg := strings.ReplaceAll(err.Error(), "\n", " ")
	fmt.Fprintf(stderr, "dsync %s: %s\n", cmd, msg)
	return code
}

// conn holds the connection flags every subcommand shares.
type conn struct {
	url     string
	cluster bool
	prefix  string
}

func (c *conn) register(fs *flag.FlagSet, what string) {
	fs.StringVar(&c.url, "redis", "", "Redis `URL` (redis://[[user]:password@]host[:port][/db], rediss:// for TLS); default $"+envURL+", else "+what)
	fs.BoolVar(&c.cluster, "cluster", false, "treat the URL as a Redis Cluster seed (extra seeds as ?addr=host:port)")
	c.prefix = dsync.DefaultPrefix
	fs.Var((*prefixFlag)(&c.prefix), "prefix", "key `prefix` of the locks (dsync.Prefix)")
}

// A prefixFlag is the -prefix flag: not empty, as dsync.Prefix wants (a
// bad usage, before anything is sent).
type prefixFlag string

func (p *prefixFlag) String() string { return string(*p) }

func (p *prefixFlag) Set(s string) error {
	if s == "" {
		return errors.New("empty prefix")
	}
	*p = prefixFlag(s)
	return nil
}

// resolved returns the URL to use: the flag, else $REDIS_URL, else def.
func (c *conn) resolved(def string) string {
	if c.url != "" {
		return c.url
	}
	if u := os.Getenv(envURL); u != "" {
		return u
	}
	return def
}

// dial connects to url and checks the connection with a PING. The returned
// description of the server never includes a password.
func (c *conn) dial(ctx context.Context, url string) (redis.UniversalClient, string, error) {
	var (
		rdb  redis.UniversalClient
		addr string
	)
	if c.cluster {
		opts, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, "", fmt.Errorf("bad Redis Cluster URL: %v", redact(err, url))
		}
		opts.ClusterStateReloadInterval = clusterState
		rdb = redis.NewClusterClient(opts)
		addr = strings.Join(opts.Addrs, ",")
	} else {
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, "", fmt.Errorf("bad Redis URL: %v", redact(err, url))
		}
		rdb = redis.NewClient(opts)
		addr = opts.Addr
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	// go-redis notices a cancelled ctx only between reads: the PING that
	// a server holds is left to run out, and the client closed.
	ping := make(chan error, 1)
	go func() { ping <- rdb.Ping(pctx).Err() }()
	var err error
	select {
	case err = <-ping:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		_ = rdb.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %v", pingTimeout)
		}
		return nil, "", fmt.Errorf("cannot reach Redis at %s: %v", addr, err)
	}
	return rdb, addr, nil
}

// open connects to the Redis the flags name (see resolved) for command
// cmd. On failure it reports the error and returns nil and the exit code.
func (c *conn) open(ctx context.Context, cmd string, stderr io.Writer) (redis.UniversalClient, int) {
	rdb, _, err := c.dial(ctx, c.resolved(defaultURL))
	if err != nil {
		return nil, fail(stderr, cmd, exitError, err)
	}
	return rdb, exitOK
}

// redact removes the URL (which may carry a password) from a parse error.
func redact(err error, url string) string {
	s := err.Error()
	if url != "" {
		s = strings.ReplaceAll(s, url, "<url>")
	}
	return s
}

// newFlagSet returns a flag set for a subcommand whose -h prints head, the
// flags and tail.
func newFlagSet(name, head, tail string, stdout io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("dsync "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fs.SetOutput(stdout)
		fmt.Fprint(stdout, head)
		fmt.Fprintln(stdout, "\nFlags:")
		fs.PrintDefaults()
		if tail != "" {
			fmt.Fprint(stdout, "\n"+tail)
		}
	}
	return fs
}

// parse parses args into fs. It reports a code to exit with when parsing
// ends the command: 0 after -h, exitUsage on a bad flag.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) (int, bool) {
	// Parse calls fs.Usage itself, on -h and on a bad flag: the help is
	// printed here instead, once, and for -h only.
	help := fs.Usage
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.Usage = help
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		help()
		return exitOK, true
	default:
		fmt.Fprintf(stderr, "%s: %v (%s -h for help)\n", fs.Name(), err, fs.Name())
		return exitUsage, true
	}
}

// usageErr reports a usage error of command cmd.
func usageErr(stderr io.Writer, cmd, format string, args ...any) int {
	fmt.Fprintf(stderr, "dsync %s: %s (dsync %s -h for help)\n", cmd, fmt.Sprintf(format, args...), cmd)
	return exitUsage
}
