//go:build !linux

package main

import "os/exec"

// setDeathSignal does nothing: only Linux kills a child when its parent dies.
func setDeathSignal(*exec.Cmd) {}
