package engine

import "time"

// runnerIdle is how long a goroutine that ran a first attempt waits for the
// next one before it ends.
const runnerIdle = 10 * time.Second

// goRun runs fn, a first attempt, on a goroutine that ran one before when one
// is idle, else on a new one. A fresh goroutine's stack grows again through
// the run's deep calls (pgx, net/http), a copy at each doubling; one that ran
// an attempt before has the stack it needs. Idle runners end after
// runnerIdle, or when the engine stops.
func (e *Engine) goRun(fn func()) {
	select {
	case e.idleRunners <- fn:
	default:
		go e.runner(fn)
	}
}

func (e *Engine) runner(fn func()) {
	idle := time.NewTimer(runnerIdle)
	defer idle.Stop()
	for {
		fn()
		fn = nil // not kept alive while idle
		idle.Reset(runnerIdle)
		select {
		case fn = <-e.idleRunners:
		case <-idle.C:
			return
		case <-e.baseCtx.Done():
			return
		}
	}
}
