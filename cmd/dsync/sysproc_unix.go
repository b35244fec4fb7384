//go:build unix

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// setGroup makes cmd start in a process group of its own and reports
// whether it did.
func setGroup(cmd *exec.Cmd) bool {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	return true
}

// signalChild sends sig to p, or to p's process group when group is set.
func signalChild(p *os.Process, sig os.Signal, group bool) error {
	s, ok := sig.(syscall.Signal)
	if !group || !ok {
		return p.Signal(sig)
	}
	return syscall.Kill(-p.Pid, s)
}

// jobSignals are the job-control signals that run handles while CMD runs
// (see jobControl).
var jobSignals = []os.Signal{syscall.SIGTSTP, syscall.SIGCONT}

// jobControl handles s if it is one of jobSignals, for CMD running as p
// (in a group of its own when group is set), and reports whether it was.
// SIGTSTP stops CMD and then dsync, as the default action would stop dsync
// alone: a CMD left running while dsync, stopped, renews nothing would
// outlive its lease. In its own group CMD is stopped with SIGSTOP, which it
// cannot ignore (it is not on the terminal, so it has no terminal state to
// restore); in dsync's group it gets SIGTSTP, as from the terminal.
// SIGCONT continues CMD.
func jobControl(p *os.Process, s os.Signal, group bool) bool {
	switch s {
	case syscall.SIGTSTP:
		stop := syscall.SIGTSTP
		if group {
			stop = syscall.SIGSTOP
		}
		_ = signalChild(p, stop, group)
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	case syscall.SIGCONT:
		_ = signalChild(p, syscall.SIGCONT, group)
	default:
		return false
	}
	return true
}
