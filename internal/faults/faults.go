// Package faults holds fault-injection hooks for tests. Production code calls
// them at fixed points; they are nil, and cost one atomic load, unless a test
// sets them. Nothing outside tests may set them.
package faults

import "sync/atomic"

// RenewStall, when set, is called by every renew.Renewer just before it sends
// each pipelined batch of renewals, on the renewer's goroutine. A test makes
// it block to simulate a renewer stalled past its leases' TTL (a GC pause, a
// frozen VM). It is global: a test that sets it must not run in parallel with
// other tests that renew leases, and must reset it (Store(nil)) when done.
//
// Test-only.
var RenewStall atomic.Pointer[func()]
