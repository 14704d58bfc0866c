//go:build !linux

package pgcluster

import "syscall"

// setParentDeathSignal does nothing where there is no parent death signal.
func setParentDeathSignal(*syscall.SysProcAttr) {}
