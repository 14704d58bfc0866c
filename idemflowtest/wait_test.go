package idemflowtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// A transfer holds an amount of an account, waits for the customer's
// confirmation (a signal, with a deadline: without it in time, the hold is
// released), waits a moment more, and books the amount.

type transferIn struct{ Amount int64 }

type transferState struct{ ConfirmedBy string }

const transferSchema = `CREATE TABLE account (id text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
CREATE TABLE confirmation (by_whom text NOT NULL);
CREATE TABLE booked (amount bigint NOT NULL);
INSERT INTO account VALUES ('a1', 100);`

// transferOp is the transfer, whose confirmation's deadline is deadline after
// it is reached. With outsideTx, the confirmation is recorded on the pool, not
// in the step's transaction: it commits without its checkpoint.
func transferOp(pool *pgxpool.Pool, deadline time.Duration, outsideTx bool) (*engine.Operation[transferIn, transferState, transferState], error) {
	hold := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in transferIn, _ *transferState) error {
		_, err := tx.Exec(ctx, "UPDATE account SET balance = balance - $1 WHERE id = 'a1'", in.Amount)
		return err
	}
	release := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in transferIn, _ *transferState) error {
		_, err := tx.Exec(ctx, "UPDATE account SET balance = balance + $1 WHERE id = 'a1'", in.Amount)
		return err
	}
	confirm := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ transferIn, s *transferState, sig engine.Signal) error {
		var body struct{ By string }
		if err := json.Unmarshal(sig.Payload, &body); err != nil {
			return engine.Fail("bad_confirmation", err.Error())
		}
		s.ConfirmedBy = body.By
		var db engine.Tx = tx
		if outsideTx {
			db = pool
		}
		_, err := db.Exec(ctx, "INSERT INTO confirmation VALUES ($1)", body.By)
		return err
	}
	book := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in transferIn, _ *transferState) error {
		_, err := tx.Exec(ctx, "INSERT INTO booked VALUES ($1)", in.Amount)
		return err
	}
	return engine.NewOperation("transfer", []engine.Step[transferIn, transferState]{
		engine.TxStep("hold", hold).Compensate(release),
		engine.SignalStep("confirm", "confirmed", confirm).Deadline(func(transferIn, *transferState) engine.Deadline {
			return engine.Deadline{After: deadline}
		}, nil),
		engine.TimerStep("pause", func(transferIn, *transferState) engine.Deadline {
			return engine.Deadline{After: 500 * time.Millisecond}
		}),
		engine.TxStep("book", book),
	}, func(_ transferIn, s *transferState) (transferState, error) { return *s, nil }, nil)
}

// confirmTransfer is the transfers' WaitFunc: the customer confirms.
func confirmTransfer(ctx context.Context, e *engine.Engine, info *engine.Info, step engine.StepInfo) error {
	if step.Wait.Reason != engine.WaitSignal {
		return idemflowtest.SatisfyWait(ctx, e, info, step)
	}
	_, err := e.Signal(ctx, nil, engine.SignalTo{OperationID: info.ID},
		engine.Signal{ID: "confirmation-1", Name: "confirmed", Payload: json.RawMessage(`{"By": "ann"}`)})
	return err
}

func transferMatrix(deadline time.Duration, outsideTx bool) idemflowtest.Matrix[transferIn, transferState, transferState] {
	return idemflowtest.Matrix[transferIn, transferState, transferState]{
		Setup: func(t *testing.T, pool *pgxpool.Pool) *idemflowtest.Run {
			_, err := pool.Exec(t.Context(), transferSchema)
			require.NoError(t, err)
			return &idemflowtest.Run{Check: func(ctx context.Context, info *engine.Info) error {
				var balance int64
				var confirmations, booked int
				if err := pool.QueryRow(ctx, `SELECT balance, (SELECT count(*) FROM confirmation), (SELECT count(*) FROM booked)
					FROM account WHERE id = 'a1'`).Scan(&balance, &confirmations, &booked); err != nil {
					return err
				}
				// Confirmed in time: held, confirmed and booked once. Else
				// (a resume that came after the deadline): released.
				want := [3]int64{70, 1, 1}
				if info.Status == engine.StatusFailed && info.Error != nil && info.Error.Code == engine.CodeSignalTimeout {
					want = [3]int64{100, 0, 0}
				} else if info.Status != engine.StatusSucceeded {
					return fmt.Errorf("the transfer is %s (error %+v)", info.Status, info.Error)
				}
				if got := [3]int64{balance, int64(confirmations), int64(booked)}; got != want {
					return fmt.Errorf("balance, confirmations, bookings %v, want %v", got, want)
				}
				return nil
			}}
		},
		Operation: func(pool *pgxpool.Pool, _ map[string]string) (*engine.Operation[transferIn, transferState, transferState], error) {
			return transferOp(pool, deadline, outsideTx)
		},
		Input:    transferIn{Amount: 30},
		WaitFunc: confirmTransfer,
	}
}

// TestCrashMatrixWaits: the crash matrix kills the process while the
// transfer waits for its signal and for its moment, with the signal accepted
// and not applied, and with each wait decided and not checkpointed; the
// resumed process decides each once, and the books are right.
func TestCrashMatrixWaits(t *testing.T) {
	t.Parallel()
	results := transferMatrix(5*time.Second, false).CrashResults(t)
	if results == nil {
		return // the child
	}
	var names []string
	for _, r := range results {
		names = append(names, r.Point)
	}
	require.Equal(t, []string{"baseline", "hold/before", "hold/after-effect", "confirm/waiting", "confirm/before", "confirm/after-effect",
		"pause/waiting", "pause/after-effect", "book/before", "book/after-effect"}, names)
	require.Empty(t, brokenAt(t, results))
}

// TestCrashMatrixWaitsFindsFlaw: a signal applied outside its step's
// transaction is applied again by the process that resumes after a crash
// before its checkpoint.
func TestCrashMatrixWaitsFindsFlaw(t *testing.T) {
	t.Parallel()
	results := transferMatrix(5*time.Second, true).CrashResults(t)
	if results == nil {
		return
	}
	require.Equal(t, []string{"confirm/after-effect"}, brokenAt(t, results))
}

// TestExpiryRacesSignal: a confirmation sent at its deadline, from another
// engine than the one whose timer carries the deadline out, is applied when
// it was accepted, and the transfer released once when it was refused.
func TestExpiryRacesSignal(t *testing.T) {
	t.Parallel()
	transferMatrix(time.Second, false).ExpiryRaces(t)
}

func TestSatisfyWait(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	require.NoError(t, idemflowtest.SatisfyWait(ctx, nil, &engine.Info{}, engine.StepInfo{Name: "pause",
		Wait: &engine.WaitInfo{Reason: engine.WaitTimer}}), "a timer passes by itself")
	require.NoError(t, idemflowtest.SatisfyWait(ctx, nil, &engine.Info{}, engine.StepInfo{Name: "approval",
		Wait: &engine.WaitInfo{Reason: engine.WaitApproval, Need: 2, ApprovedBy: []string{"ann", "bob"}}}), "approved already")
	err := idemflowtest.SatisfyWait(ctx, nil, &engine.Info{}, engine.StepInfo{Name: "confirm",
		Wait: &engine.WaitInfo{Reason: engine.WaitSignal, Signal: "confirmed"}})
	require.ErrorContains(t, err, `waits for the signal "confirmed"`)
	require.False(t, errors.Is(err, engine.ErrWaitOver))
}
