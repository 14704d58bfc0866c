package payout_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemflowtest/fakeservice"
	"github.com/idemflow/idemflow/workflows/payout"
)

const (
	wallet  = "w1"
	funds   = 100
	amount  = 30
	account = "DE89370400440532013000"
)

var input = payout.Input{Wallet: wallet, Amount: amount, Destination: account}

// quiet keeps the engines' and River's info lines out of the test output.
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// migrateAndFund migrates the payout's tables and funds the wallet w1 with
// balance.
func migrateAndFund(ctx context.Context, pool *pgxpool.Pool, balance int64) error {
	if err := payout.Migrate(ctx, pool); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `INSERT INTO payout_wallet (id, balance) VALUES ($1, $2)`, wallet, balance)
	return err
}

// books is what the database says of the wallet and its payouts.
type books struct {
	balance int64
	// statuses counts the payout rows by status.
	statuses map[string]int
	// bankIDs are the bank payout ids recorded on paid rows.
	bankIDs []string
}

func readBooks(ctx context.Context, pool *pgxpool.Pool) (books, error) {
	b := books{statuses: map[string]int{}}
	if err := pool.QueryRow(ctx, `SELECT balance FROM payout_wallet WHERE id = $1`, wallet).Scan(&b.balance); err != nil {
		return b, fmt.Errorf("read the balance: %w", err)
	}
	rows, err := pool.Query(ctx, `SELECT status, coalesce(bank_payout_id, '') FROM payout WHERE wallet = $1 ORDER BY created_at`, wallet)
	if err != nil {
		return b, fmt.Errorf("read the payouts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var status, bankID string
		if err := rows.Scan(&status, &bankID); err != nil {
			return b, err
		}
		b.statuses[status]++
		if status == "paid" {
			b.bankIDs = append(b.bankIDs, bankID)
		}
	}
	return b, rows.Err()
}

// bankKey returns the derived key of the operation's bank step.
func bankKey(info *engine.Info) string {
	for _, s := range info.Steps {
		if s.Name == "bank" {
			return s.DerivedKey
		}
	}
	return ""
}

func step(t *testing.T, info *engine.Info, name string) engine.StepInfo {
	t.Helper()
	for _, s := range info.Steps {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no step %s", name)
	return engine.StepInfo{}
}

// decline is a bank's AnswerFunc that declines every payout.
func decline(fakeservice.Request) (int, any) {
	return http.StatusUnprocessableEntity, map[string]string{"code": payout.CodeDeclined, "message": "the bank declined the payout"}
}

// bankWords is how the bank words a decline (decline's answer), for the kit's
// proxy to answer in its name, so that the payout's own classify meets it.
// The bank never answers a payout pending: Pending is nil, and the matrices
// do not try the pending faults.
var bankWords = idemflowtest.Service{
	Declined: func(string) idemflowtest.Answer {
		status, body := decline(fakeservice.Request{})
		b, err := json.Marshal(body)
		if err != nil {
			panic(err)
		}
		return idemflowtest.Answer{Status: status, Body: string(b)}
	},
}

// matrixClient is the payout's client in the matrices: it gives up on the
// bank after a second (the kit holds a timed-out call until then), and
// follows no redirect, as httpstep's own client.
var matrixClient = &http.Client{
	Timeout:       time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// checkPaid says whether the books are right after a payout that succeeded:
// one bank payout, under the operation's key, none under another key; the
// wallet debited once; one paid row, with the bank's id.
func checkPaid(ctx context.Context, pool *pgxpool.Pool, bank *fakeservice.Service, info *engine.Info) error {
	var errs []error
	if info.Status != engine.StatusSucceeded {
		errs = append(errs, fmt.Errorf("the payout is %s (parked %t, error %+v), not succeeded", info.Status, info.Parked, info.Error))
	}
	key := bankKey(info)
	if n := bank.EffectsFor(key); n != 1 {
		errs = append(errs, fmt.Errorf("%d bank payouts under the bank step's key, want 1", n))
	}
	if n := bank.Effects(); n != 1 {
		errs = append(errs, fmt.Errorf("%d bank payouts in all, want 1", n))
	}
	if d := bank.Duplicates(); len(d) != 0 {
		errs = append(errs, fmt.Errorf("the same payout made under %d keys", len(d[0].Keys)))
	}
	b, err := readBooks(ctx, pool)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if b.balance != funds-amount {
		errs = append(errs, fmt.Errorf("wallet balance %d, want %d (debited once)", b.balance, funds-amount))
	}
	if b.statuses["paid"] != 1 || len(b.statuses) != 1 {
		errs = append(errs, fmt.Errorf("payout rows by status %v, want one paid", b.statuses))
	}
	if info.Status == engine.StatusSucceeded {
		var out payout.Result
		if err := json.Unmarshal(info.Result, &out); err != nil {
			errs = append(errs, fmt.Errorf("decode the result: %w", err))
		} else if len(b.bankIDs) != 1 || b.bankIDs[0] != out.BankPayoutID || out.BankPayoutID == "" {
			errs = append(errs, fmt.Errorf("paid rows with bank ids %v, the result says %q", b.bankIDs, out.BankPayoutID))
		}
	}
	return errors.Join(errs...)
}

// checkDeclined says whether the books are right after a payout that the bank
// declined: failed with the bank's code, nothing paid, the wallet as funded,
// the payout row reversed.
func checkDeclined(ctx context.Context, pool *pgxpool.Pool, bank *fakeservice.Service, info *engine.Info) error {
	var errs []error
	if info.Status != engine.StatusFailed || info.Error == nil || info.Error.Code != payout.CodeDeclined {
		errs = append(errs, fmt.Errorf("the payout is %s (parked %t, error %+v), not failed with %s", info.Status, info.Parked, info.Error, payout.CodeDeclined))
	}
	if n := bank.Effects(); n != 0 {
		errs = append(errs, fmt.Errorf("%d bank payouts, want none", n))
	}
	b, err := readBooks(ctx, pool)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if b.balance != funds {
		errs = append(errs, fmt.Errorf("wallet balance %d, want %d (debited and credited back once)", b.balance, funds))
	}
	if b.statuses["reversed"] != 1 || len(b.statuses) != 1 {
		errs = append(errs, fmt.Errorf("payout rows by status %v, want one reversed", b.statuses))
	}
	return errors.Join(errs...)
}

// checkOutcome says whether the books are right for the way the payout ended:
// checkPaid when it succeeded, checkDeclined when it failed (a decline that
// the kit's proxy answered in the bank's words, at once or on the resume
// after a crash).
func checkOutcome(ctx context.Context, pool *pgxpool.Pool, bank *fakeservice.Service, info *engine.Info) error {
	if info.Status == engine.StatusFailed {
		return checkDeclined(ctx, pool, bank, info)
	}
	return checkPaid(ctx, pool, bank, info)
}

// matrix is the crash and fault matrix of a payout against a bank with opts,
// whose books check verifies. The kit's proxy stands in front of the bank
// (bankWords): the payout's own client, classify, decode and lookup read
// each fault.
func matrix(opts *fakeservice.Options, check func(context.Context, *pgxpool.Pool, *fakeservice.Service, *engine.Info) error) idemflowtest.Matrix[payout.Input, payout.State, payout.Result] {
	return idemflowtest.Matrix[payout.Input, payout.State, payout.Result]{
		// In the test process: the bank outlives a killed child.
		Setup: func(t *testing.T, pool *pgxpool.Pool) *idemflowtest.Run {
			bank := fakeservice.Start(t, opts)
			require.NoError(t, migrateAndFund(t.Context(), pool, funds))
			return &idemflowtest.Run{
				Env:      map[string]string{"bank": bank.URL()},
				Services: map[string]idemflowtest.Service{"bank": bankWords},
				Check: func(ctx context.Context, info *engine.Info) error {
					return check(ctx, pool, bank, info)
				},
			}
		},
		// In the test process and in the child.
		Operation: func(_ *pgxpool.Pool, env map[string]string) (*engine.Operation[payout.Input, payout.State, payout.Result], error) {
			return payout.New(payout.Config{BankURL: env["bank"], Client: matrixClient})
		},
		Input:  input,
		Config: &engine.Config{Logger: quiet},
	}
}

// TestCrashMatrix kills the process at every point of a payout that succeeds:
// the bank pays once, the wallet is debited once, one row is paid. After the
// bank's call was answered declined, the resume fails the payout and credits
// the wallet back once.
func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	matrix(nil, checkOutcome).Crashes(t)
}

// TestCrashMatrixDeclined kills the process at every point of a payout that
// the bank declines, the compensation's included: the wallet is credited back
// once, and nothing is paid.
func TestCrashMatrixDeclined(t *testing.T) {
	t.Parallel()
	matrix(&fakeservice.Options{AnswerFunc: decline}, checkDeclined).Crashes(t)
}

// TestFaultMatrix drops the bank call's first attempt before it reaches the
// bank, loses its answer after the bank paid, times it out after the bank
// paid, and lands it late: the bank pays once. A decline in the bank's words
// fails the payout and credits the wallet back once.
func TestFaultMatrix(t *testing.T) {
	t.Parallel()
	matrix(nil, checkOutcome).Faults(t)
}

// bundle is what setup hands a test.
type bundle struct {
	pool *pgxpool.Pool
	bank *fakeservice.Service
	e    *engine.Engine
	op   *engine.Operation[payout.Input, payout.State, payout.Result]
}

// setup gives a test a database with the wallet w1 funded with balance, a fake
// bank with opts, and an engine that runs the payout against it.
func setup(t *testing.T, balance int64, opts *fakeservice.Options) *bundle {
	t.Helper()
	bank := fakeservice.Start(t, opts)
	pool := idemflowtest.Pool(t, func(ctx context.Context, pool *pgxpool.Pool) error {
		return migrateAndFund(ctx, pool, balance)
	})
	op, err := payout.New(payout.Config{BankURL: bank.URL()})
	require.NoError(t, err)
	e := idemflowtest.Engine(t, pool, &engine.Config{Logger: quiet}, op)
	return &bundle{pool: pool, bank: bank, e: e, op: op}
}

// run starts a payout of in under a key of the test's and waits for it to
// finish or be parked.
func (b *bundle) run(t *testing.T, in payout.Input) *engine.Info {
	t.Helper()
	started, err := engine.Start(t.Context(), b.e, b.op, "client-1", t.Name(), in, nil)
	require.NoError(t, err)
	return idemflowtest.Wait(t, b.e, started)
}

func (b *bundle) books(t *testing.T) books {
	t.Helper()
	bk, err := readBooks(t.Context(), b.pool)
	require.NoError(t, err)
	return bk
}

func TestPayout(t *testing.T) {
	t.Parallel()

	t.Run("Paid", func(t *testing.T) {
		t.Parallel()
		b := setup(t, funds, nil)
		info := b.run(t, input)
		require.NoError(t, checkPaid(t.Context(), b.pool, b.bank, info))
		out, err := b.op.Result(info)
		require.NoError(t, err)
		require.Equal(t, payout.Result{PayoutID: info.ID.String(), BankPayoutID: "fs_1", Wallet: wallet, Amount: amount, Balance: funds - amount}, out)
		require.Equal(t, 1, b.bank.Requests())
		require.Equal(t, 0, b.bank.Lookups(), "a first attempt does not look up")
	})

	// Refused before the bank: the payout fails at once, nothing moves, and the
	// bank hears nothing.
	for _, tc := range []struct {
		name    string
		balance int64
		in      payout.Input
		code    string
	}{
		{"InsufficientFunds", amount - 1, input, payout.CodeInsufficientFunds},
		{"WalletNotFound", funds, payout.Input{Wallet: "w2", Amount: amount, Destination: account}, payout.CodeWalletNotFound},
		{"ZeroAmount", funds, payout.Input{Wallet: wallet, Destination: account}, payout.CodeInvalidPayout},
		{"NoDestination", funds, payout.Input{Wallet: wallet, Amount: amount}, payout.CodeInvalidPayout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.balance, nil)
			info := b.run(t, tc.in)
			require.Equal(t, engine.StatusFailed, info.Status)
			require.Equal(t, tc.code, info.Error.Code)
			require.False(t, info.Error.ServerFault(), "a business answer")
			require.Equal(t, 1, info.Runs)
			require.Equal(t, engine.StepStatusFailed, step(t, info, "debit").Status)
			require.Equal(t, engine.StepStatusSkipped, step(t, info, "bank").Status)
			require.Equal(t, 0, b.bank.Requests())
			require.Equal(t, 0, b.bank.Lookups())
			bk := b.books(t)
			require.Equal(t, tc.balance, bk.balance)
			require.Empty(t, bk.statuses, "no payout row")
		})
	}

	// A decline fails the payout with the bank's code and credits the wallet
	// back.
	t.Run("Declined", func(t *testing.T) {
		t.Parallel()
		b := setup(t, funds, &fakeservice.Options{AnswerFunc: decline})
		info := b.run(t, input)
		require.NoError(t, checkDeclined(t.Context(), b.pool, b.bank, info))
		require.Equal(t, "the bank declined the payout", info.Error.Message)
		require.False(t, info.Error.ServerFault())
		require.Equal(t, engine.StepStatusCompensated, step(t, info, "debit").Status)
		require.Equal(t, engine.StepStatusFailed, step(t, info, "bank").Status)
		require.Equal(t, engine.StepStatusSkipped, step(t, info, "mark_paid").Status)
	})

	// The bank answers, under the payout's key, a payout of another amount: no
	// success, and no reason to credit the wallet back either. The payout is
	// parked for an operator, the wallet still debited, the row pending.
	t.Run("Mismatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t, funds, &fakeservice.Options{AnswerFunc: func(req fakeservice.Request) (int, any) {
			var paid map[string]any
			if err := json.Unmarshal(req.Body, &paid); err != nil {
				return http.StatusBadRequest, map[string]string{"code": "invalid_body"}
			}
			paid["amount"] = amount + 1
			return http.StatusCreated, map[string]any{"id": "po_other", "request": paid}
		}})
		info := b.run(t, input)
		require.Equal(t, engine.StatusInProgress, info.Status)
		require.True(t, info.Parked)
		require.NotNil(t, info.Attention)
		require.Equal(t, payout.CodeBankMismatch, info.Attention.Code)
		require.Contains(t, info.Attention.Reason, "31")
		require.Equal(t, engine.StepStatusSucceeded, step(t, info, "debit").Status, "not compensated")
		require.Equal(t, engine.StepStatusPending, step(t, info, "mark_paid").Status)
		require.Equal(t, 1, b.bank.Effects())
		bk := b.books(t)
		require.Equal(t, int64(funds-amount), bk.balance, "not credited back")
		require.Equal(t, map[string]int{"pending": 1}, bk.statuses)
	})

	// The bank refuses the key as used for another request: it may have paid
	// under it, so the payout is parked, not credited back.
	t.Run("KeyReused", func(t *testing.T) {
		t.Parallel()
		b := setup(t, funds, &fakeservice.Options{AnswerFunc: func(fakeservice.Request) (int, any) {
			return http.StatusUnprocessableEntity, map[string]string{"code": "idempotency_key_reused", "message": "the key was used with another body"}
		}})
		info := b.run(t, input)
		require.True(t, info.Parked)
		require.Equal(t, payout.CodeBankMismatch, info.Attention.Code)
		require.Equal(t, engine.StepStatusSucceeded, step(t, info, "debit").Status, "not compensated")
		bk := b.books(t)
		require.Equal(t, int64(funds-amount), bk.balance, "not credited back")
		require.Equal(t, map[string]int{"pending": 1}, bk.statuses)
	})

	// A 503, then the bank pays: the retry asks the lookup, finds nothing, and
	// sends the same payout under the same key.
	t.Run("RetriedWithTheSameKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t, funds, nil)
		b.bank.FailNext(1, fakeservice.FaultError)
		info := b.run(t, input)
		require.NoError(t, checkPaid(t.Context(), b.pool, b.bank, info))
		key := bankKey(info)
		require.Equal(t, []string{key}, b.bank.Keys(), "every request under the derived key")
		calls := b.bank.Calls(key)
		require.Len(t, calls, 2)
		require.Equal(t, fakeservice.FaultError, calls[0].Fault)
		require.Equal(t, http.StatusServiceUnavailable, calls[0].Status)
		require.False(t, calls[0].Effect)
		require.True(t, calls[1].Effect)
		require.JSONEq(t, string(calls[0].Body), string(calls[1].Body), "the same payout")
		require.Equal(t, 1, b.bank.Lookups(), "the retry asked first")
		bankStep := step(t, info, "bank")
		require.Equal(t, 2, bankStep.Attempts)
		require.Equal(t, engine.ResolvedByCall, bankStep.ResolvedBy)
	})

	// The client retries its key: it gets the stored answer, and nothing runs
	// again.
	t.Run("ClientRetry", func(t *testing.T) {
		t.Parallel()
		b := setup(t, funds, nil)
		first := b.run(t, input)
		again, err := engine.Start(t.Context(), b.e, b.op, "client-1", t.Name(), input, nil)
		require.NoError(t, err)
		require.False(t, again.Created)
		require.Equal(t, first.ID, again.ID)
		require.JSONEq(t, string(first.Result), string(again.Existing.Result))
		require.NoError(t, checkPaid(t.Context(), b.pool, b.bank, first))
		require.Equal(t, 1, b.bank.Requests())
	})
}

func TestNew(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"", "bank.example", "/payouts", "ftp://bank.example", "http://", "http://bank.example/%zz"} {
		_, err := payout.New(payout.Config{BankURL: u})
		require.Error(t, err, "BankURL %q", u)
	}
	_, err := payout.New(payout.Config{BankURL: "https://bank.example/v1/"})
	require.NoError(t, err)
}
