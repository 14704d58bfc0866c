package main

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill the demo when the test process dies (a
// panic, a -timeout), so that no demo outlives its test.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
