//go:build !linux

package main

import (
	"errors"
	"os"
	"os/exec"
)

// setDeathSignal does nothing where the kernel cannot kill a child with its parent.
func setDeathSignal(*exec.Cmd) {}

// freezeProcess is not supported here: the tests that need it skip.
func freezeProcess(*os.Process) error { return errors.ErrUnsupported }
