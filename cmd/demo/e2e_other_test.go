//go:build !linux

package main

import "os/exec"

// setDeathSignal does nothing where the kernel cannot kill a child with its parent.
func setDeathSignal(*exec.Cmd) {}
