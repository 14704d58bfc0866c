package main

import (
	"os"
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill the demo when the test process dies (a
// panic, a -timeout), so that no demo outlives its test.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// freezeProcess stops the process (SIGSTOP): it does nothing more until it is
// continued or killed.
func freezeProcess(p *os.Process) error {
	return p.Signal(syscall.SIGSTOP)
}
