//go:build !unix

package main

import (
	"os"
	"os/exec"
)

// setGroup reports that process groups are not available.
func setGroup(*exec.Cmd) bool { return false }

// signalChild sends sig to p; SIGKILL and signals the system cannot send
// kill it.
func signalChild(p *os.Process, sig os.Signal, _ bool) error {
	if err := p.Signal(sig); err != nil {
		return p.Kill()
	}
	return nil
}

// jobSignals: no job control.
var jobSignals []os.Signal

func jobControl(*os.Process, os.Signal, bool) bool { return false }
