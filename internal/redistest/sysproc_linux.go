package redistest

import "syscall"

// sysProcAttr makes the kernel kill a server when the test binary dies
// without running Main's cleanup (a panic, a test timeout, SIGKILL).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
