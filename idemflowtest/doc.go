// Package idemflowtest tests operations built on idemflow: a migrated database
// per test, an engine for a test, and the crash and fault matrices that show
// whether an operation keeps its books right when its process dies, or its
// calls fail, at any point.
//
// # Databases and engines
//
//	func TestRefund(t *testing.T) {
//		pool := idemflowtest.Pool(t, nil)
//		e := idemflowtest.Engine(t, pool, nil, refund)
//		s, err := engine.Start(t.Context(), e, refund, "shop", "order-1", in, nil)
//		require.NoError(t, err)
//		require.Equal(t, engine.StatusSucceeded, idemflowtest.Wait(t, e, s).Status)
//	}
//
// DatabaseURL and Pool give each test a database of its own with idemflow's
// and River's tables, cloned in milliseconds from a template that is migrated
// once. They live on the server named by TEST_DATABASE_URL, else DATABASE_URL
// (a postgres:// URL whose user may create databases), else on a private
// PostgreSQL cluster that the first test process starts from the local server
// binaries (initdb and postgres on PATH, or in /usr/lib/postgresql/*/bin), as
// an unprivileged user when the tests run as root, in
// $TMPDIR/idemflow-test-pg, and leaves running for the next test process. A
// test's database is dropped when the test passes and kept, its URL logged,
// when it fails.
//
// Engine returns an engine with its workers started and short timings
// (TestLease), stopped when the test ends; NewEngine one without workers.
// A test that injects faults of its own sets the engine's fault hooks
// (engine.Config.Faults) with HookEvent and the Point constants.
//
// # The crash matrix
//
//	m := idemflowtest.Matrix[payout.Input, payout.State, payout.Result]{
//		Setup:     func(t *testing.T, pool *pgxpool.Pool) *idemflowtest.Run { ... }, // fakes, rows, Check
//		Operation: func(pool *pgxpool.Pool, env map[string]string) (*engine.Operation[...], error) { ... },
//		Input:     payout.Input{Wallet: "w1", Amount: 30},
//	}
//	m.Crashes(t)
//
// Matrix.Crashes runs an operation once, recording the points it reaches:
// each step before it runs and after its effect (an external step's call made,
// a transactional step's writes sent but not committed), and each compensation
// before and after it. Then, for each point, it runs the operation in a child
// process (the test binary, run again for that one subtest) and kills it with
// SIGKILL there; a fresh engine in the test process takes the operation over,
// as a client's retry of the same key finds it, and the matrix calls the
// user's Check, which says whether the books are right: one bank request per
// key, the wallet debited once. Each point is a subtest, and a table of all of
// them is logged ("retry": whether the client's retry found the operation, its
// reservation committed, or started it anew):
//
//	point                                retry      status       parked  invariants
//	baseline                             new        succeeded    false   ok
//	ledger/before                        new        succeeded    false   ok
//	ledger/after-effect                  new        succeeded    false   ok
//	provider/before                      found      succeeded    false   ok
//	provider/after-effect                found      succeeded    false   ok
//	finalize/before                      found      succeeded    false   ok
//	...
//
// Outside services must outlive the killed child: start their fakes in Setup,
// in the test process, and pass their URLs to the operation through Run.Env.
// The fakeservice package is such a fake.
//
// # Waits
//
//	m.WaitFunc = func(ctx context.Context, e *engine.Engine, info *engine.Info, step engine.StepInfo) error {
//		if step.Wait.Reason == engine.WaitSignal {
//			_, err := e.Signal(ctx, nil, engine.SignalTo{OperationID: info.ID}, engine.Signal{ID: "c1", Name: "confirmed"})
//			return err
//		}
//		return idemflowtest.SatisfyWait(ctx, e, info, step) // approvals given, timers left to pass
//	}
//	m.Crashes(t)
//	m.ExpiryRaces(t) // approvals and signals given at their deadline, from a second engine
//
// An operation with wait steps (engine.SignalStep, TimerStep, ApprovalStep)
// is driven past them by Matrix.WaitFunc, in every process that runs it:
// the kit reads the operation while it runs and calls WaitFunc once it waits
// at a step. The default, SatisfyWait, gives the approvals and lets timers
// pass; a signal needs a WaitFunc. The crash matrix then kills the child at
// a wait step's points too: while the operation waits there
// ("<step>/waiting", before WaitFunc; for a timer, the fresh engine starts
// after its moment, so that the moment passes while no process is up), a
// signal accepted and not applied ("<step>/before"), and the wait decided
// with its checkpoint not committed ("<step>/after-effect"); at each, the
// process that takes over must decide the wait exactly once, which the kit
// checks besides the books:
//
//	point                                retry      status       parked  invariants
//	approval/waiting                     found      succeeded    false   ok
//	approval/after-effect                found      succeeded    false   ok
//	release/waiting                      found      succeeded    false   ok
//	release/after-effect                 found      succeeded    false   ok
//
// Matrix.ExpiryRaces races each wait with a deadline (an approval that
// expires, a signal with a Deadline) against it: two engines on one
// database, one satisfies the wait at the deadline, give or take a few
// milliseconds, while the other's timer carries the deadline out. Exactly one
// wins: what was accepted is applied, what came too late is refused with
// engine.ErrWaitOver or engine.ErrFinished, and the compensation is made
// once. A moment that depends on the run (a release date in the input) comes
// from Run.Env through Matrix.InputFunc, so that the child makes the same
// input as the test process.
//
// # The fault matrix
//
//	m.Faults(t)
//
// Matrix.Faults does the same in the test process for each Fault of each
// external step (Faults lists them), and runs the check after each.
//
// # Outcome faults, at the transport
//
// A Run that names its outside services (Run.Services: the Env entries that
// hold their base URLs, and how each words a decline and a pending answer)
// gets its faults where a real service's come from: the kit serves a proxy in
// front of each service, in the test process, and hands the operation the
// proxy's URL in Env. The operation's own client, classification, decoding
// and lookup then meet a dropped connection (FaultError, FaultLostResponse),
// the timeout of its own client (FaultTimeout), a decline (FaultDeclined), a
// pending answer whose lookup says "pending" and then succeeded
// (FaultPending) or failed (FaultPendingFailed), and a call that lands late
// (FaultLateLanding):
//
//	return &idemflowtest.Run{
//		Env:      map[string]string{"card": card.URL()},
//		Services: map[string]idemflowtest.Service{"card": {
//			Declined:      func(key string) idemflowtest.Answer { return idemflowtest.Answer{Status: 402, Body: `{"code":"card_declined"}`} },
//			Pending:       func(key string) idemflowtest.Answer { return idemflowtest.Answer{Status: 202, Body: `{"status":"pending"}`} },
//			LookupPending: func(key string) idemflowtest.Answer { return idemflowtest.Answer{Status: 200, Body: `{"status":"pending"}`} },
//			LookupFailed:  func(key string) idemflowtest.Answer { return idemflowtest.Answer{Status: 200, Body: `{"status":"failed"}`} },
//		}},
//		Check: ..., // a top-up that succeeded was charged and credited once; one that failed, neither
//	}
//
// The late landing is placed by the step's own window: the call is held until
// the client gives up, and carried out just inside the settleBy that the
// database fixed once the step ran out of calls, so that its lookup must find
// it. A step whose settle window is shorter than its call's timeout fails the
// point whatever its books say: a service may take as long to carry out a
// request as the step waits for its answer.
//
// With Services, the crash matrix also kills the process after the step's
// first call was answered declined ("<step>/after-declined") and after it was
// answered pending ("<step>/after-pending"): the answer read, its checkpoint
// not committed. The resume must come to the same books.
//
// Without Services, the fault matrix injects at the engine (engine.Config.Faults),
// as it did before: the step's function or lookup is made to return an error
// it never wrote, the call lands LateLanding after it, and FaultDeclined and
// FaultPendingFailed are not tried. It shows that the engine keeps its word;
// only the outcome faults show that the operation reads its service right.
// idemflowtest's own outcome_matrix_test.go plants a top-up that credits on
// "pending", one that credits before its capture, and one whose window (10ms)
// is shorter than its call timeout, and shows the outcome faults catch each.
//
// # Logs
//
// The engines the kit makes log warnings and errors only, to stderr, when
// their configuration gives no Logger, so that a matrix's table and its
// broken invariants stand out. The environment variable IDEMFLOWTEST_LOG
// ("debug", "info", "warn", "error") sets the level, in a crash matrix's
// child too:
//
//	IDEMFLOWTEST_LOG=info go test -run TestTopUpFaults -v
package idemflowtest
