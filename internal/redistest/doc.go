// Package redistest gives tests and benchmarks the Redis deployments they run
// on: an embedded miniredis per test, a real standalone redis-server shared
// by the test binary, and a real three-master Redis Cluster, plus go-redis
// hooks that count round trips and inject faults.
//
// Real servers are started lazily, at most once per test binary, on free
// loopback ports, from the redis-server found on PATH. A package that uses
// them must run its tests through [Main]:
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
//
// Main stops every server the binary started and then fails the binary if
// goroutines leaked. When redis-server is not on PATH the real backends are
// skipped, unless the CI environment variable is set: then their absence is
// a test failure.
//
// Tests share the real servers, so they must use their own keys ([Key]) and
// must not flush, reconfigure or restart them; a test that needs to kill or
// restart Redis starts a private server with [StartStandalone].
package redistest
