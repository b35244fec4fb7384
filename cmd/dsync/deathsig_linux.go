package main

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill cmd's process when dsync dies, also
// of SIGKILL: a CMD that outlived dsync would run on without the lock once
// the lease ran out. The signal comes when the thread that started cmd
// ends: the caller keeps that thread (runtime.LockOSThread) until cmd has
// exited.
func setDeathSignal(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
