// Package renewhook lets tests outside package renew reach the test hooks of
// a renew.Renewer without adding them to renew's exported API. Package renew
// fills in the functions when it is initialized; only tests call them, and
// every hook belongs to one Renewer, so tests that set hooks may run in
// parallel.
package renewhook

// SetStall makes r, which must be a *renew.Renewer, call f just before it
// sends each pipelined batch of renewals, on the goroutine that sends the
// batch; f == nil removes the hook. A test makes f block to simulate a
// renewer stalled past its leases' TTL (a GC pause, a frozen VM).
var SetStall func(r any, f func())
