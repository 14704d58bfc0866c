package engine_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/testdb"
)

// lockGate holds the first statement that locks a row (FOR UPDATE) of a
// context that carries it until open is closed: a transaction that began
// before a moment and takes its lock after it, as a process that is slow
// between its BEGIN and its next statement does.
type lockGate struct {
	open <-chan struct{}
	once sync.Once
}

type lockGateKey struct{}

// gateTracer is the pgx tracer that applies the lockGate of a statement's
// context.
type gateTracer struct{}

func (gateTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if g, ok := ctx.Value(lockGateKey{}).(*lockGate); ok && strings.Contains(data.SQL, "FOR UPDATE") {
		g.once.Do(func() {
			select {
			case <-g.open:
			case <-time.After(10 * time.Second):
			}
		})
	}
	return ctx
}

func (gateTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// An approval (or a signal) whose transaction began before the wait's
// deadline, and which locks the operation only after a run decided that the
// deadline passed (the run's decision rolled back, as a wait reached before
// does, and its failure not recorded yet), must be refused with ErrWaitOver:
// one outcome, the deadline's. The deadline is judged by the clock once the
// operation's row is locked (clock_timestamp), not by the transaction's
// start (now()), which would accept it while the operation fails all the
// same with CodeApprovalExpired (or keep the signal while the step fails
// with CodeSignalTimeout).
func TestWaitAfterDeadlineDecided(t *testing.T) {
	t.Parallel()
	deadline := func(waitIn, *waitState) engine.Deadline { return engine.Deadline{After: 500 * time.Millisecond} }
	for _, tc := range []struct {
		name string
		step engine.Step[waitIn, waitState]
		// give gives the approval or sends the signal.
		give func(ctx context.Context, e *engine.Engine, id uuid.UUID) error
		// code is the failure of the deadline.
		code string
	}{
		{
			name: "Approval",
			step: engine.ApprovalStep("wait", func(in waitIn, s *waitState) engine.ApprovalPolicy {
				return engine.ApprovalPolicy{Need: 1, Expires: deadline(in, s)}
			}),
			give: func(ctx context.Context, e *engine.Engine, id uuid.UUID) error {
				_, err := e.Approve(engine.WithActor(ctx, "ann"), id, "just in time")
				return err
			},
			code: string(engine.CodeApprovalExpired),
		},
		{
			name: "Signal",
			step: engine.SignalStep("wait", "confirmed", func(_ context.Context, _ engine.Tx, _ engine.Attempt, _ waitIn, s *waitState, sig engine.Signal) error {
				s.Signal = sig.ID
				return nil
			}).Deadline(deadline, nil),
			give: func(ctx context.Context, e *engine.Engine, id uuid.UUID) error {
				_, err := e.Signal(ctx, nil, engine.SignalTo{OperationID: id}, engine.Signal{ID: "s1", Name: "confirmed"})
				return err
			},
			code: string(engine.CodeSignalTimeout),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(testdb.URL(t))
			require.NoError(t, err)
			cfg.ConnConfig.Tracer = gateTracer{}
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			_, err = pool.Exec(ctx, waitSchema)
			require.NoError(t, err)

			// The run that decides the deadline tells of it
			// (Observer.Waited, once its decision's transaction ended), and
			// waits for the approval or the signal.
			decided, given := make(chan struct{}), make(chan struct{})
			var once sync.Once
			obs := &engine.Observer{Waited: func(context.Context, engine.StepEvent, engine.WaitReason, time.Duration) {
				once.Do(func() {
					close(decided)
					select {
					case <-given:
					case <-time.After(10 * time.Second):
					}
				})
			}}
			op := waitOp(t, "deadline-decided", tc.step)
			e := idemflowtest.Engine(t, pool, &engine.Config{Observer: obs}, op)
			id := startWait(t, e, op, "k", "wait")
			info, err := e.Get(ctx, id)
			require.NoError(t, err)
			until := *stepOf(info, "wait").Wait.Until
			time.Sleep(time.Until(until) - 100*time.Millisecond)

			gerr := tc.give(context.WithValue(ctx, lockGateKey{}, &lockGate{open: decided}), e, id)
			close(given)
			info = finished(t, e, id)
			if gerr == nil {
				require.Equal(t, engine.StatusSucceeded, info.Status, "accepted, and the operation ended with %+v", info.Error)
			} else {
				require.ErrorIs(t, gerr, engine.ErrWaitOver)
				require.EqualValues(t, tc.code, info.Error.Code)
			}
			holds, books := waitCounts(t, pool)
			require.Equal(t, holds, books)
		})
	}
}
