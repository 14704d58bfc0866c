package pgcluster

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
)

// procState is what processState finds of a process.
type procState int

const (
	processGone   procState = iota // no such process
	processZombie                  // exited, but not reaped by its parent
	processAlive                   // running, or of another user (kill returns EPERM)
)

// processState reports whether the process pid runs. A zombie counts as dead: when a
// server's parent exits, the server is reparented to PID 1, and a container's PID 1 may
// reap orphans late or never. Zombies are told apart on Linux only (/proc).
func processState(pid int) procState {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return processGone
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return processAlive
	}
	// "pid (comm) state ...": comm may hold spaces and parentheses.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'Z' {
		return processZombie
	}
	return processAlive
}
