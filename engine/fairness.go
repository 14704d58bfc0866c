package engine

import (
	"sync"
	"time"
)

// scopeCounts counts the runs of each scope in a process, against
// Config.MaxInFlightPerScope.
type scopeCounts struct {
	mu sync.Mutex
	n  map[string]int
}

// enter counts a run of scope, unless it has max already (max 0: no bound,
// nothing counted), and reports whether it may run.
func (c *scopeCounts) enter(scope string, max int) bool {
	if max <= 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[scope] >= max {
		return false
	}
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[scope]++
	return true
}

// leave ends a run of scope that enter counted.
func (c *scopeCounts) leave(scope string, max int) {
	if max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[scope]--; c.n[scope] <= 0 {
		delete(c.n, scope)
	}
}

// room is the place a run holds in this process's bounds (Config.MaxInFlight,
// Config.MaxInFlightPerScope). The run gives it back in end, before its starter
// and waiters hear that it ended: a client that starts its next operation the
// moment it hears finds its place free, never a refusal for a run that has
// ended. Only the run's goroutine uses it.
type room struct {
	leave func()
}

// giveBack gives the place back, once; a nil room holds none.
func (r *room) giveBack() {
	if r != nil && r.leave != nil {
		r.leave()
		r.leave = nil
	}
}

// scopeSnooze is how long a resume of a scope over its share is put back.
// River makes a snoozed job available again at its next promotion of
// scheduled jobs.
const scopeSnooze = time.Second
