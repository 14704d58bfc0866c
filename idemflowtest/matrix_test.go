package idemflowtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// bank is a payout service that makes one payout per idempotency key, and
// counts them.
type bank struct {
	mu      sync.Mutex
	payouts map[string]int64
}

func (b *bank) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case r.Method == http.MethodPost:
		var req struct{ Amount int64 }
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		k := r.Header.Get("Idempotency-Key")
		if _, ok := b.payouts[k]; !ok {
			b.payouts[k] = req.Amount
		}
		fmt.Fprintf(w, `{"id":%q}`, "po_"+k)
	case strings.HasPrefix(r.URL.Path, "/by-key/"):
		k := strings.TrimPrefix(r.URL.Path, "/by-key/")
		if _, ok := b.payouts[k]; !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"id":%q}`, "po_"+k)
	}
}

func (b *bank) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.payouts)
}

type payIn struct {
	Wallet string
	Amount int64
}

type payState struct{ PayoutID string }

// flaw breaks the payout on purpose, to show that the matrices find it.
type flaw int

const (
	sound flaw = iota
	// freshKey sends a new random idempotency key on every attempt.
	freshKey
	// debitOutsideTx debits the wallet on the pool, not in the step's
	// transaction, so the debit commits without its checkpoint.
	debitOutsideTx
	// noSettle gives the bank's step no settle window, as if a request that
	// got no answer could never land later.
	noSettle
)

const walletSchema = `CREATE TABLE wallet (id text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
CREATE TABLE paid (wallet text NOT NULL, payout_id text NOT NULL);
INSERT INTO wallet VALUES ('w1', 100);`

func payoutOp(pool *pgxpool.Pool, bankURL string, f flaw) (*engine.Operation[payIn, payState, payState], error) {
	debit := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in payIn, _ *payState) error {
		var db engine.Tx = tx
		if f == debitOutsideTx {
			db = pool
		}
		_, err := db.Exec(ctx, "UPDATE wallet SET balance = balance - $2 WHERE id = $1", in.Wallet, in.Amount)
		return err
	}
	credit := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in payIn, _ *payState) error {
		_, err := tx.Exec(ctx, "UPDATE wallet SET balance = balance + $2 WHERE id = $1", in.Wallet, in.Amount)
		return err
	}
	keyOf := func(at engine.Attempt) string {
		if f == freshKey {
			return uuid.NewString()
		}
		return at.Key
	}
	pay := func(ctx context.Context, at engine.Attempt, in payIn, s *payState) error {
		body, _ := json.Marshal(map[string]int64{"amount": in.Amount})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, bankURL+"/payouts", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Idempotency-Key", keyOf(at))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&struct {
			ID *string `json:"id"`
		}{&s.PayoutID})
	}
	find := func(ctx context.Context, at engine.Attempt, _ payIn, s *payState) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, bankURL+"/by-key/"+keyOf(at), nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			return false, nil
		}
		return true, json.NewDecoder(resp.Body).Decode(&struct {
			ID *string `json:"id"`
		}{&s.PayoutID})
	}
	markPaid := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in payIn, s *payState) error {
		_, err := tx.Exec(ctx, "INSERT INTO paid VALUES ($1, $2)", in.Wallet, s.PayoutID)
		return err
	}
	bankStep := engine.ExternalStep("bank", pay).Lookup(find)
	if f == noSettle {
		bankStep = bankStep.Window(0)
	}
	return engine.NewOperation("payout", []engine.Step[payIn, payState]{
		engine.TxStep("debit", debit).Compensate(credit),
		bankStep,
		engine.TxStep("mark_paid", markPaid),
	}, func(_ payIn, s *payState) (payState, error) { return *s, nil }, nil)
}

func payoutMatrix(f flaw) idemflowtest.Matrix[payIn, payState, payState] {
	return idemflowtest.Matrix[payIn, payState, payState]{
		Setup: func(t *testing.T, pool *pgxpool.Pool) *idemflowtest.Run {
			_, err := pool.Exec(t.Context(), walletSchema)
			require.NoError(t, err)
			b := &bank{payouts: map[string]int64{}}
			srv := httptest.NewServer(b)
			t.Cleanup(srv.Close)
			return &idemflowtest.Run{
				Env: map[string]string{"bank": srv.URL},
				Check: func(ctx context.Context, info *engine.Info) error {
					var balance int64
					var paid int
					if err := pool.QueryRow(ctx, "SELECT balance, (SELECT count(*) FROM paid) FROM wallet WHERE id = 'w1'").Scan(&balance, &paid); err != nil {
						return err
					}
					var errs []error
					if info.Status != engine.StatusSucceeded {
						errs = append(errs, fmt.Errorf("the payout %s, not succeeded", info.Status))
					}
					if n := b.count(); n != 1 {
						errs = append(errs, fmt.Errorf("%d bank payouts, want 1", n))
					}
					if balance != 70 {
						errs = append(errs, fmt.Errorf("wallet balance %d, want 70 (debited once)", balance))
					}
					if paid != 1 {
						errs = append(errs, fmt.Errorf("%d paid rows, want 1", paid))
					}
					return errors.Join(errs...)
				},
			}
		},
		Operation: func(pool *pgxpool.Pool, env map[string]string) (*engine.Operation[payIn, payState, payState], error) {
			return payoutOp(pool, env["bank"], f)
		},
		Input: payIn{Wallet: "w1", Amount: 30},
	}
}

func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	payoutMatrix(sound).Crashes(t)
}

func TestFaultMatrix(t *testing.T) {
	t.Parallel()
	payoutMatrix(sound).Faults(t)
}

// brokenAt returns the points whose invariants broke.
func brokenAt(t *testing.T, results []idemflowtest.Result) []string {
	var out []string
	for _, r := range results {
		if r.Err != nil {
			t.Logf("%s (found %t): %v", r.Point, r.Found, r.Err)
			out = append(out, r.Point)
		}
	}
	return out
}

// TestCrashMatrixFindsFlaws: the crash matrix catches a payout that sends a new
// key on every attempt and one that debits outside its step's transaction, at
// the points where they break.
func TestCrashMatrixFindsFlaws(t *testing.T) {
	t.Parallel()
	t.Run("FreshKey", func(t *testing.T) {
		t.Parallel()
		results := payoutMatrix(freshKey).CrashResults(t)
		if results == nil {
			return // the child
		}
		// Every crash before the bank's checkpoint commits (with mark_paid's
		// transaction) makes the resume call again, with a new key.
		require.Equal(t, []string{"bank/after-effect", "mark_paid/before", "mark_paid/after-effect"}, brokenAt(t, results))
	})
	t.Run("DebitOutsideTx", func(t *testing.T) {
		t.Parallel()
		results := payoutMatrix(debitOutsideTx).CrashResults(t)
		if results == nil {
			return
		}
		// The debit commits without its checkpoint: a crash right after it
		// debits again on the resume, and a crash anywhere later debits again
		// too, in the client's retry, whose first attempt runs the debit before
		// it learns that the key is taken (a debit in the step's transaction
		// rolls back with the refused reservation).
		require.Equal(t, []string{"debit/after-effect", "bank/before", "bank/after-effect", "mark_paid/before", "mark_paid/after-effect"}, brokenAt(t, results))
	})
}

// TestFaultMatrixFindsFlaws: the fault matrix catches the fresh key on a lost
// answer, a timeout, a late landing and a pending outcome (whose lookups ask
// under a key the bank never saw), and a step without a settle window on a
// late landing, which it compensates although the bank paid.
func TestFaultMatrixFindsFlaws(t *testing.T) {
	t.Parallel()
	t.Run("FreshKey", func(t *testing.T) {
		t.Parallel()
		results := payoutMatrix(freshKey).FaultResults(t)
		require.Equal(t, []string{"bank/lost-response", "bank/timeout", "bank/late-landing", "bank/pending"}, brokenAt(t, results))
	})
	t.Run("NoSettleWindow", func(t *testing.T) {
		t.Parallel()
		results := payoutMatrix(noSettle).FaultResults(t)
		require.Equal(t, []string{"bank/late-landing"}, brokenAt(t, results))
	})
}
