package main

import (
	"math/rand/v2"
	"testing"

	"github.com/idemflow/idemflow/internal/pgcluster"
)

// The pooler's chaos: as many demos as a service runs pods, sharing the
// server connections of one PgBouncer.
const (
	chaosPoolerProcesses = 16
	chaosPoolerConns     = 20
)

// TestChaosPooler is TestChaos through PgBouncer in transaction mode: 16 demo
// processes, started with -pooler transaction and no direct connection (so a
// killed one's operations are taken over when their 1 s lease ends), share
// its 20 server connections; the fault proxy stands between the demos and
// PgBouncer, and PostgreSQL restarts behind it. The same faults, traffic and
// checks: every key one operation and one answer, 0 duplicates and 0 lost.
// The long form: go test ./cmd/demo -run TestChaosPooler -chaos.duration=5m -v
//
// Not parallel: its 16 processes would starve the 1 s leases of the
// package's other end-to-end tests on a small machine.
func TestChaosPooler(t *testing.T) {
	if _, err := pgcluster.BinDir(); err != nil {
		pgcluster.SkipMissing(t, "no PostgreSQL server binaries: %v", err)
	}
	if _, err := pgcluster.PgBouncerPath(); err != nil {
		pgcluster.SkipMissing(t, "no PgBouncer: %v", err)
	}
	seed := *chaosSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("chaos seed %d (rerun with -chaos.seed=%d), %s of faults", seed, seed, *chaosDuration)
	run := newChaosRun(t, seed, chaosOpts{processes: chaosPoolerProcesses, pooler: true, poolSize: chaosPoolerConns})
	run.start()
	run.inject(*chaosDuration)
	run.awaitFinalAnswers()
	run.check()
	run.report()
	run.stop()
}
