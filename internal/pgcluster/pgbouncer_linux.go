package pgcluster

import "syscall"

// setParentDeathSignal has PgBouncer killed when this process dies, so that a
// killed test leaves none running.
func setParentDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
