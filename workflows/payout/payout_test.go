package payout_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
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

// stepOf returns the step name of info (the zero StepInfo when it has none).
func stepOf(info *engine.Info, name string) engine.StepInfo {
	for _, s := range info.Steps {
		if s.Name == name {
			return s
		}
	}
	return engine.StepInfo{}
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
	return checkCredited(ctx, pool, bank, info, payout.CodeDeclined)
}

// checkCredited says whether the books are right after a payout that failed
// after its debit, with one of codes: nothing paid, the wallet as funded
// (debited and credited back once), the payout row reversed.
func checkCredited(ctx context.Context, pool *pgxpool.Pool, bank *fakeservice.Service, info *engine.Info, codes ...string) error {
	var errs []error
	if info.Status != engine.StatusFailed || info.Error == nil || !slices.Contains(codes, string(info.Error.Code)) {
		errs = append(errs, fmt.Errorf("the payout is %s (parked %t, error %+v), not failed with %v", info.Status, info.Parked, info.Error, codes))
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
	return outcomeCheck(payout.CodeDeclined)(ctx, pool, bank, info)
}

// check is what a matrix checks the books with.
type check func(context.Context, *pgxpool.Pool, *fakeservice.Service, *engine.Info) error

// outcomeCheck is checkPaid for a payout that succeeded, checkCredited with
// codes for one that failed.
func outcomeCheck(codes ...string) check {
	return func(ctx context.Context, pool *pgxpool.Pool, bank *fakeservice.Service, info *engine.Info) error {
		if info.Status == engine.StatusFailed {
			return checkCredited(ctx, pool, bank, info, codes...)
		}
		return checkPaid(ctx, pool, bank, info)
	}
}

// matrix is the crash and fault matrix of a payout against a bank with opts,
// whose books check verifies. The kit's proxy stands in front of the bank
// (bankWords): the payout's own client, classify, decode and lookup read
// each fault.
func matrix(opts *fakeservice.Options, check check) idemflowtest.Matrix[payout.Input, payout.State, payout.Result] {
	return matrixWith(matrixOpts{bank: opts, check: check})
}

// matrixOpts are what a payout's matrix is made of.
type matrixOpts struct {
	// bank are the fake bank's options.
	bank *fakeservice.Options
	// payout is the payout's Config, but for BankURL and Client.
	payout payout.Config
	// release, when not zero, dates each run's payout that long after its
	// Setup (Input.ReleaseAt).
	release time.Duration
	check   check
}

// matrixWith is the crash and fault matrix of a payout as o says.
func matrixWith(o matrixOpts) idemflowtest.Matrix[payout.Input, payout.State, payout.Result] {
	return idemflowtest.Matrix[payout.Input, payout.State, payout.Result]{
		// In the test process: the bank outlives a killed child.
		Setup: func(t *testing.T, pool *pgxpool.Pool) *idemflowtest.Run {
			bank := fakeservice.Start(t, o.bank)
			require.NoError(t, migrateAndFund(t.Context(), pool, funds))
			env := map[string]string{"bank": bank.URL()}
			if o.release != 0 {
				env["releaseAt"] = time.Now().Add(o.release).UTC().Format(time.RFC3339Nano)
			}
			return &idemflowtest.Run{
				Env:      env,
				Services: map[string]idemflowtest.Service{"bank": bankWords},
				Check: func(ctx context.Context, info *engine.Info) error {
					return o.check(ctx, pool, bank, info)
				},
			}
		},
		// In the test process and in the child.
		Operation: func(_ *pgxpool.Pool, env map[string]string) (*engine.Operation[payout.Input, payout.State, payout.Result], error) {
			cfg := o.payout
			cfg.BankURL, cfg.Client = env["bank"], matrixClient
			return payout.New(cfg)
		},
		// The same in the child: it reads the same Env.
		InputFunc: func(env map[string]string) payout.Input {
			in := input
			if at, ok := env["releaseAt"]; ok {
				var err error
				if in.ReleaseAt, err = time.Parse(time.RFC3339Nano, at); err != nil {
					panic(err)
				}
			}
			return in
		},
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

// The payout's waits in the matrices: approval by two operators, and a
// release date shortly after each run's Setup, so that a run waits for both.
var (
	waitsConfig = payout.Config{ApprovalThreshold: amount, Approvers: 2}
	// matrixRelease is long enough for a run to reach the release step
	// before its date, and short for the matrix's time.
	matrixRelease = 1500 * time.Millisecond
)

// TestCrashMatrixWaits kills the process at every point of a payout that
// waits for two approvals and then for its release date: while it waits at
// each (the resumed process gives the approvals, or starts after the date),
// and after each wait was decided, before its checkpoint committed. Each wait
// is decided once by the process that resumes it, and the bank pays once.
func TestCrashMatrixWaits(t *testing.T) {
	t.Parallel()
	matrixWith(matrixOpts{payout: waitsConfig, release: matrixRelease, check: checkOutcome}).Crashes(t)
}

// TestCrashMatrixRejected kills the process at every point of a payout that
// an operator rejects: while it waits for approval, and in the debit's
// compensation. The wallet is credited back once, and the bank hears
// nothing.
func TestCrashMatrixRejected(t *testing.T) {
	t.Parallel()
	m := matrixWith(matrixOpts{payout: payout.Config{ApprovalThreshold: amount}, check: outcomeCheck(string(engine.CodeRejected))})
	m.WaitFunc = func(ctx context.Context, e *engine.Engine, info *engine.Info, step engine.StepInfo) error {
		if step.Wait.Reason != engine.WaitApproval {
			return idemflowtest.SatisfyWait(ctx, e, info, step)
		}
		_, err := e.Reject(engine.WithActor(ctx, "ops-bob"), info.ID, "the beneficiary is unknown")
		return err
	}
	m.Crashes(t)
}

// TestExpiryRaces approves a payout, from one engine, around the moment its
// wait for approval expires, while another engine's timer carries the expiry
// out: either the approval is accepted and the bank pays, or it is refused
// (engine.ErrWaitOver, engine.ErrFinished) and the wallet is credited back,
// once.
func TestExpiryRaces(t *testing.T) {
	t.Parallel()
	matrixWith(matrixOpts{
		payout: payout.Config{ApprovalThreshold: amount, ApprovalExpires: time.Second},
		check:  outcomeCheck(string(engine.CodeApprovalExpired)),
	}).ExpiryRaces(t)
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
	return setupWith(t, balance, opts, payout.Config{})
}

// setupWith is setup with the payout's cfg (but for its BankURL).
func setupWith(t *testing.T, balance int64, opts *fakeservice.Options, cfg payout.Config) *bundle {
	t.Helper()
	bank := fakeservice.Start(t, opts)
	pool := idemflowtest.Pool(t, func(ctx context.Context, pool *pgxpool.Pool) error {
		return migrateAndFund(ctx, pool, balance)
	})
	cfg.BankURL = bank.URL()
	op, err := payout.New(cfg)
	require.NoError(t, err)
	e := idemflowtest.Engine(t, pool, &engine.Config{Logger: quiet}, op)
	return &bundle{pool: pool, bank: bank, e: e, op: op}
}

// start starts a payout of in under a key of the test's.
func (b *bundle) start(t *testing.T, in payout.Input) *engine.Started {
	t.Helper()
	started, err := engine.Start(t.Context(), b.e, b.op, "client-1", t.Name(), in, nil)
	require.NoError(t, err)
	return started
}

// waiting waits until the payout id waits at step, and returns it.
func (b *bundle) waiting(t *testing.T, id uuid.UUID, step string) *engine.Info {
	t.Helper()
	var info *engine.Info
	require.Eventually(t, func() bool {
		var err error
		info, err = b.e.Get(t.Context(), id)
		require.NoError(t, err)
		return stepOf(info, step).Status == engine.StepStatusWaiting
	}, 20*time.Second, 10*time.Millisecond, "the payout never waited at %s", step)
	return info
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
			require.EqualValues(t, tc.code, info.Error.Code)
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
		require.EqualValues(t, payout.CodeBankMismatch, info.Attention.Code)
		require.Contains(t, info.Attention.Reason, "31")
		require.Equal(t, engine.StepStatusSucceeded, step(t, info, "debit").Status, "not compensated")
		require.Equal(t, engine.StepStatusNotStarted, step(t, info, "mark_paid").Status)
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
		require.EqualValues(t, payout.CodeBankMismatch, info.Attention.Code)
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

func TestApproval(t *testing.T) {
	t.Parallel()
	cfg := payout.Config{ApprovalThreshold: amount, Approvers: 2}
	as := func(t *testing.T, actor string) context.Context { return engine.WithActor(t.Context(), actor) }

	// Below the threshold: no wait, in the payout's first run.
	t.Run("BelowThreshold", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, funds, nil, cfg)
		info := b.run(t, payout.Input{Wallet: wallet, Amount: amount - 1, Destination: account})
		require.Equal(t, engine.StatusSucceeded, info.Status)
		require.Equal(t, 1, info.Runs, "never handed back to wait")
		require.Equal(t, engine.StepStatusSucceeded, step(t, info, "approval").Status)
		require.Equal(t, 1, b.bank.Effects())
	})

	// At the threshold: the payout waits, debited, until two distinct
	// operators approved it; then the bank pays.
	t.Run("Approved", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, funds, nil, cfg)
		started := b.start(t, input)
		info := b.waiting(t, started.ID, "approval")
		require.Equal(t, engine.StatusInProgress, info.Status)
		require.False(t, info.NeedsAttention())
		w := step(t, info, "approval").Wait
		require.Equal(t, engine.WaitApproval, w.Reason)
		require.Equal(t, 2, w.Need)
		require.Nil(t, w.Until, "no expiry by default")
		require.Equal(t, map[string]int{"pending": 1}, b.books(t).statuses, "the funds are held")
		require.Equal(t, int64(funds-amount), b.books(t).balance)
		list, err := b.e.Approvals(t.Context(), 0)
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, started.ID, list[0].OperationID)
		require.Equal(t, "approval", list[0].Step)

		info, err = b.e.Approve(as(t, "ann"), started.ID, "the beneficiary is known")
		require.NoError(t, err)
		require.Equal(t, []string{"ann"}, step(t, info, "approval").Wait.ApprovedBy)
		info, err = b.e.Approve(as(t, "ann"), started.ID, "again")
		require.NoError(t, err, "an approver who approved before changes nothing")
		require.Equal(t, []string{"ann"}, step(t, info, "approval").Wait.ApprovedBy)
		require.Equal(t, engine.StatusInProgress, info.Status, "one approval of two")
		require.Zero(t, b.bank.Requests(), "the bank is not called before the approvals")

		_, err = b.e.Approve(as(t, "bob"), started.ID, "four eyes")
		require.NoError(t, err)
		info = idemflowtest.Wait(t, b.e, started)
		require.NoError(t, checkPaid(t.Context(), b.pool, b.bank, info))
	})

	// A rejection fails the payout with engine.CodeRejected and credits the
	// wallet back; the bank hears nothing.
	t.Run("Rejected", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, funds, nil, cfg)
		started := b.start(t, input)
		b.waiting(t, started.ID, "approval")
		_, err := b.e.Approve(as(t, "ann"), started.ID, "fine by me")
		require.NoError(t, err)
		_, err = b.e.Reject(as(t, "bob"), started.ID, "the beneficiary is unknown")
		require.NoError(t, err)
		info := idemflowtest.Wait(t, b.e, started)
		require.NoError(t, checkCredited(t.Context(), b.pool, b.bank, info, string(engine.CodeRejected)))
		require.False(t, info.Error.ServerFault(), "a business answer")
		require.Equal(t, engine.StepStatusCompensated, step(t, info, "debit").Status)
		require.Equal(t, engine.StepStatusFailed, step(t, info, "approval").Status)
		require.Equal(t, engine.StepStatusSkipped, step(t, info, "bank").Status)
		require.Zero(t, b.bank.Requests())
		_, err = b.e.Approve(as(t, "cat"), started.ID, "too late")
		require.ErrorIs(t, err, engine.ErrFinished)
	})

	// Not approved in time: the payout fails with engine.CodeApprovalExpired
	// and the wallet is credited back; an approval after it is refused.
	t.Run("Expired", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, funds, nil, payout.Config{ApprovalThreshold: amount, ApprovalExpires: 300 * time.Millisecond})
		started := b.start(t, input)
		info := idemflowtest.Wait(t, b.e, started)
		require.NoError(t, checkCredited(t.Context(), b.pool, b.bank, info, string(engine.CodeApprovalExpired)))
		require.Zero(t, b.bank.Requests())
		_, err := b.e.Approve(as(t, "ann"), started.ID, "too late")
		require.ErrorIs(t, err, engine.ErrFinished)
	})
}

func TestRelease(t *testing.T) {
	t.Parallel()

	// A release date ahead: the payout waits, debited, with no process busy
	// on it, and the bank pays once the date has come.
	t.Run("Future", func(t *testing.T) {
		t.Parallel()
		b := setup(t, funds, nil)
		at := time.Now().Add(700 * time.Millisecond)
		started := b.start(t, payout.Input{Wallet: wallet, Amount: amount, Destination: account, ReleaseAt: at})
		info := b.waiting(t, started.ID, "release")
		w := step(t, info, "release").Wait
		require.Equal(t, engine.WaitTimer, w.Reason)
		require.WithinDuration(t, at, *w.Until, time.Millisecond)
		require.Equal(t, engine.StepStatusSucceeded, step(t, info, "approval").Status, "no threshold: no approval")
		require.Equal(t, int64(funds-amount), b.books(t).balance, "the funds are held")
		info = idemflowtest.Wait(t, b.e, started)
		require.NoError(t, checkPaid(t.Context(), b.pool, b.bank, info))
		// Not before its date: the bank's call is after the release step's
		// checkpoint, which the database's clock stamps.
		require.False(t, step(t, info, "release").FinishedAt.Before(*w.Until), "released before its date")
	})

	// A release date past: no wait, in the payout's first run.
	t.Run("Past", func(t *testing.T) {
		t.Parallel()
		b := setup(t, funds, nil)
		info := b.run(t, payout.Input{Wallet: wallet, Amount: amount, Destination: account, ReleaseAt: time.Now().Add(-time.Hour)})
		require.NoError(t, checkPaid(t.Context(), b.pool, b.bank, info))
		require.Equal(t, 1, info.Runs, "never handed back to wait")
		require.Equal(t, engine.StepStatusSucceeded, step(t, info, "release").Status)
	})

	// The payout waits for its date, its process stops, and another starts
	// after the date: that one releases the payout, once.
	t.Run("AcrossRestart", func(t *testing.T) {
		t.Parallel()
		bank := fakeservice.Start(t, nil)
		pool := idemflowtest.Pool(t, func(ctx context.Context, pool *pgxpool.Pool) error {
			return migrateAndFund(ctx, pool, funds)
		})
		op, err := payout.New(payout.Config{BankURL: bank.URL()})
		require.NoError(t, err)
		var mu sync.Mutex
		waited := map[string]int{}
		obs := &engine.Observer{Waited: func(_ context.Context, ev engine.StepEvent, _ engine.WaitReason, _ time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			waited[ev.Step]++
		}}
		first := idemflowtest.Engine(t, pool, &engine.Config{Logger: quiet, Observer: obs}, op)
		at := time.Now().Add(500 * time.Millisecond)
		started, err := engine.Start(t.Context(), first, op, "client-1", "k1", payout.Input{Wallet: wallet, Amount: amount, Destination: account, ReleaseAt: at}, nil)
		require.NoError(t, err)
		b := &bundle{pool: pool, bank: bank, e: first, op: op}
		b.waiting(t, started.ID, "release")
		require.NoError(t, first.Stop(t.Context()))
		time.Sleep(time.Until(at) + 100*time.Millisecond) // the date passes while no process is up

		second := idemflowtest.Engine(t, pool, &engine.Config{Logger: quiet, Observer: obs}, op)
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		info, err := second.Wait(ctx, started.ID)
		require.NoError(t, err)
		info, err = second.Get(t.Context(), info.ID)
		require.NoError(t, err)
		require.NoError(t, checkPaid(t.Context(), pool, bank, info))
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, map[string]int{"release": 1}, waited, "released once")
	})
}

// Payouts run to their end on the version they started on: V1, without the
// waits, beside V2.
func TestVersions(t *testing.T) {
	t.Parallel()
	bank := fakeservice.Start(t, nil)
	pool := idemflowtest.Pool(t, func(ctx context.Context, pool *pgxpool.Pool) error {
		return migrateAndFund(ctx, pool, funds)
	})
	v1, err := payout.New(payout.Config{BankURL: bank.URL(), Version: payout.V1, ApprovalThreshold: 1})
	require.NoError(t, err)
	require.Equal(t, payout.V1, v1.Version())
	v2, err := payout.New(payout.Config{BankURL: bank.URL()})
	require.NoError(t, err)
	require.Equal(t, payout.V2, v2.Version())

	// A V1 payout whose bank call failed once, in a process that runs V1 only
	// and has no workers: the retry waits for another process.
	old := idemflowtest.NewEngine(t, pool, &engine.Config{Logger: quiet}, v1)
	bank.FailNext(1, fakeservice.FaultError)
	started, err := engine.Start(t.Context(), old, v1, "client-1", "old", input, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := old.Get(t.Context(), started.ID)
		require.NoError(t, err)
		return stepOf(info, "bank").Attempts == 1
	}, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, old.Stop(t.Context()))

	// A process with both finishes it on V1, and starts new payouts on V2.
	e := idemflowtest.Engine(t, pool, &engine.Config{Logger: quiet}, v1, v2)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	info, err := e.Wait(ctx, started.ID)
	require.NoError(t, err)
	info, err = e.Get(t.Context(), info.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.Equal(t, payout.V1, info.Version)
	require.Equal(t, []string{"debit", "bank", "mark_paid"}, stepNames(info), "no approval, though Config asks for one")

	started, err = engine.Start(t.Context(), e, v2, "client-1", "new", payout.Input{Wallet: wallet, Amount: 10, Destination: account}, nil)
	require.NoError(t, err)
	info = idemflowtest.Wait(t, e, started)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.Equal(t, payout.V2, info.Version)
	require.Equal(t, []string{"debit", "approval", "release", "bank", "mark_paid"}, stepNames(info))

	// V1 has no release step: it refuses a release date rather than pay
	// early.
	started, err = engine.Start(t.Context(), e, v1, "client-1", "dated", payout.Input{Wallet: wallet, Amount: 10, Destination: account,
		ReleaseAt: time.Now().Add(time.Hour)}, nil)
	require.NoError(t, err)
	info = idemflowtest.Wait(t, e, started)
	require.Equal(t, engine.StatusFailed, info.Status)
	require.EqualValues(t, payout.CodeInvalidPayout, info.Error.Code)
	require.Equal(t, 2, bank.Effects())
	bk, err := readBooks(t.Context(), pool)
	require.NoError(t, err)
	require.Equal(t, int64(funds-amount-10), bk.balance)
}

// A payout without a release date keeps the input's JSON of V1, and so its
// fingerprint: a client's retry of a key taken before V2 is the same request.
func TestInputJSON(t *testing.T) {
	t.Parallel()
	raw, err := json.Marshal(input)
	require.NoError(t, err)
	require.JSONEq(t, `{"wallet": "w1", "amount": 30, "destination": "DE89370400440532013000"}`, string(raw))
}

func stepNames(info *engine.Info) []string {
	var names []string
	for _, s := range info.Steps {
		names = append(names, s.Name)
	}
	return names
}

func TestNew(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"", "bank.example", "/payouts", "ftp://bank.example", "http://", "http://bank.example/%zz"} {
		_, err := payout.New(payout.Config{BankURL: u})
		require.Error(t, err, "BankURL %q", u)
	}
	const url = "https://bank.example/v1/"
	for name, cfg := range map[string]payout.Config{
		"NegativeThreshold": {BankURL: url, ApprovalThreshold: -1},
		"NegativeApprovers": {BankURL: url, ApprovalThreshold: 1, Approvers: -1},
		"NegativeExpiry":    {BankURL: url, ApprovalThreshold: 1, ApprovalExpires: -time.Second},
		"NoSuchVersion":     {BankURL: url, Version: 3},
	} {
		_, err := payout.New(cfg)
		require.Error(t, err, name)
	}
	_, err := payout.New(payout.Config{BankURL: url})
	require.NoError(t, err)
}
