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
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
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
