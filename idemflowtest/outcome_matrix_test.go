package idemflowtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemflowtest/fakeservice"
	"github.com/idemflow/idemflow/steps/httpstep"
)

// A top-up charges a card at a card service, then credits the customer's
// wallet with what was charged. The card service is a fakeservice that the
// top-up reads in a dialect of its own: a 2xx {"id"} is a charge made, 202
// {"status": "pending"} a charge accepted whose outcome comes later, 402 a
// decline; its lookup answers 200 with the charge, {"status": "pending"}
// while pending, {"status": "failed"} for a pending charge that failed, or 404
// not_found. The kit's proxy speaks the decline and the pending answers in
// that dialect (cardWords), so that the top-up's own decoding meets them.

type topUpIn struct {
	Wallet string
	Amount int64
}

type topUpState struct{ ChargeID string }

// topUpFlaw breaks the top-up on purpose, to show that the kit's outcome
// faults find it.
type topUpFlaw int

const (
	topUpSound topUpFlaw = iota
	// creditOnPending takes a pending charge for a charge made: the customer
	// is credited while the card service has not said yes.
	creditOnPending
	// creditBeforeCapture credits the wallet before the card is charged, as
	// a step of its own with nothing to undo it: a declined card leaves the
	// credit in place. With a card that is charged, nothing shows.
	creditBeforeCapture
	// shortWindow gives the charge a settle window (10ms) shorter than its
	// call's timeout (300ms).
	shortWindow
)

// topUpTimeout is the timeout of the top-up's calls to the card service.
const topUpTimeout = 300 * time.Millisecond

// cardWords is how the card service says "declined" and "pending".
var cardWords = idemflowtest.Service{
	Declined: func(string) idemflowtest.Answer {
		return idemflowtest.Answer{Status: http.StatusPaymentRequired, Body: `{"code":"card_declined","message":"the card was declined"}`}
	},
	Pending: func(key string) idemflowtest.Answer {
		return idemflowtest.Answer{Status: http.StatusAccepted, Body: chargeJSON(key, "pending")}
	},
	LookupPending: func(key string) idemflowtest.Answer {
		return idemflowtest.Answer{Status: http.StatusOK, Body: chargeJSON(key, "pending")}
	},
	LookupFailed: func(key string) idemflowtest.Answer {
		return idemflowtest.Answer{Status: http.StatusOK, Body: chargeJSON(key, "failed")}
	},
}

func chargeJSON(key, status string) string {
	b, err := json.Marshal(map[string]string{"id": "ch_" + key, "status": status, "code": "card_declined"})
	if err != nil {
		panic(err)
	}
	return string(b)
}

func topUpOp(base string, f topUpFlaw) (*engine.Operation[topUpIn, topUpState, topUpState], error) {
	credit := engine.TxStep("credit", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in topUpIn, _ *topUpState) error {
		_, err := tx.Exec(ctx, "UPDATE topup_wallet SET balance = balance + $2 WHERE id = $1", in.Wallet, in.Amount)
		return err
	})
	decode := func(_ engine.Attempt, _ topUpIn, s *topUpState, a httpstep.Answer) error {
		var c struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Code   string `json:"code"`
		}
		if err := json.Unmarshal(a.Body, &c); err != nil {
			return err
		}
		switch {
		case c.Status == "pending" && f == creditOnPending:
			// The flaw: a charge accepted is not a charge made.
		case c.Status == "pending":
			return engine.Accepted(c.ID, "the card service accepted the charge; its outcome comes later")
		case c.Status == "failed":
			return engine.Fail(c.Code, "the card service failed the charge")
		}
		s.ChargeID = c.ID
		return nil
	}
	window := 2 * time.Second
	if f == shortWindow {
		window = 10 * time.Millisecond
	}
	capture := httpstep.Step("capture", httpstep.Call[topUpIn, topUpState]{
		Client: &http.Client{Timeout: topUpTimeout},
		RequestFunc: func(_ context.Context, _ engine.Attempt, in topUpIn, _ *topUpState) (httpstep.Request, error) {
			return httpstep.Request{URL: base + "/charges", Body: map[string]any{"wallet": in.Wallet, "amount": in.Amount}}, nil
		},
		ClassifyFunc: func(a httpstep.Answer) error {
			if a.StatusCode == http.StatusPaymentRequired {
				return engine.Fail("card_declined", "the card was declined")
			}
			return httpstep.Classify(a)
		},
		DecodeFunc: decode,
		Lookup: &httpstep.Lookup[topUpIn, topUpState]{
			URLFunc: func(at engine.Attempt, _ topUpIn, _ *topUpState) string {
				return base + "/by-key/" + url.PathEscape(at.Key)
			},
			NotFoundFunc: httpstep.HasCode("not_found"),
		},
	}).Window(window).Retries(engine.RetryPolicy{Base: 100 * time.Millisecond})
	steps := []engine.Step[topUpIn, topUpState]{capture, credit}
	if f == creditBeforeCapture {
		steps = []engine.Step[topUpIn, topUpState]{credit, capture}
	}
	return engine.NewOperation("topup", steps, func(_ topUpIn, s *topUpState) (topUpState, error) { return *s, nil }, nil)
}

// topUpMatrix is the matrix of a top-up of 30 to a wallet of 100. Its books
// are right when a top-up that succeeded was charged once and credited once,
// and one that failed was neither.
func topUpMatrix(f topUpFlaw) idemflowtest.Matrix[topUpIn, topUpState, topUpState] {
	return idemflowtest.Matrix[topUpIn, topUpState, topUpState]{
		Setup: func(t *testing.T, pool *pgxpool.Pool) *idemflowtest.Run {
			_, err := pool.Exec(t.Context(), `CREATE TABLE topup_wallet (id text PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO topup_wallet VALUES ('w1', 100);`)
			require.NoError(t, err)
			card := fakeservice.Start(t, nil)
			return &idemflowtest.Run{
				Env:      map[string]string{"card": card.URL()},
				Services: map[string]idemflowtest.Service{"card": cardWords},
				Check: func(ctx context.Context, info *engine.Info) error {
					var balance int64
					if err := pool.QueryRow(ctx, "SELECT balance FROM topup_wallet WHERE id = 'w1'").Scan(&balance); err != nil {
						return err
					}
					charges := card.Effects()
					var errs []error
					switch info.Status {
					case engine.StatusSucceeded:
						if charges != 1 || balance != 130 {
							errs = append(errs, fmt.Errorf("the top-up succeeded with %d charges and a balance of %d, want 1 and 130", charges, balance))
						}
					case engine.StatusFailed:
						if charges != 0 || balance != 100 {
							errs = append(errs, fmt.Errorf("the top-up failed with %d charges and a balance of %d, want 0 and 100", charges, balance))
						}
					default:
						errs = append(errs, fmt.Errorf("the top-up %s (parked %t), not finished", info.Status, info.Parked))
					}
					return errors.Join(errs...)
				},
			}
		},
		Operation: func(_ *pgxpool.Pool, env map[string]string) (*engine.Operation[topUpIn, topUpState, topUpState], error) {
			return topUpOp(env["card"], f)
		},
		Input: topUpIn{Wallet: "w1", Amount: 30},
	}
}

// TestOutcomeFaultMatrix: a sound top-up keeps its books through every fault
// at the card service's transport, a decline and both ends of a pending
// charge included.
func TestOutcomeFaultMatrix(t *testing.T) {
	t.Parallel()
	topUpMatrix(topUpSound).Faults(t)
}

// TestOutcomeCrashMatrix: a sound top-up keeps its books through every crash,
// after a declined and after a pending answer included.
func TestOutcomeCrashMatrix(t *testing.T) {
	t.Parallel()
	results := topUpMatrix(topUpSound).CrashResults(t)
	if results == nil {
		return // the child
	}
	var points []string
	for _, r := range results {
		points = append(points, r.Point)
	}
	require.Subset(t, points, []string{"capture/after-declined", "capture/after-pending"})
	require.Empty(t, brokenAt(t, results))
}

// TestOutcomeMatricesFindFlaws: the outcome faults catch what the faults at
// the engine let through.
func TestOutcomeMatricesFindFlaws(t *testing.T) {
	t.Parallel()
	t.Run("CreditOnPending", func(t *testing.T) {
		t.Parallel()
		// Credited on "pending", for a charge that then failed.
		results := topUpMatrix(creditOnPending).FaultResults(t)
		require.Equal(t, []string{"capture/pending-failed"}, brokenAt(t, results))
	})
	t.Run("CreditBeforeCapture", func(t *testing.T) {
		t.Parallel()
		// A card that is charged shows nothing; one declined, at once or
		// after a pending answer, leaves the credit in place.
		results := topUpMatrix(creditBeforeCapture).FaultResults(t)
		require.Equal(t, []string{"capture/pending-failed", "capture/declined"}, brokenAt(t, results))
	})
	t.Run("CreditBeforeCaptureCrashes", func(t *testing.T) {
		t.Parallel()
		results := topUpMatrix(creditBeforeCapture).CrashResults(t)
		if results == nil {
			return // the child
		}
		// The decline is read again on the resume, and the credit stays.
		require.Equal(t, []string{"capture/after-declined"}, brokenAt(t, results))
	})
	t.Run("ShortWindow", func(t *testing.T) {
		t.Parallel()
		// A window of 10ms under a call timeout of 300ms: the late landing
		// fails, whatever the books say this time.
		results := topUpMatrix(shortWindow).FaultResults(t)
		require.Equal(t, []string{"capture/late-landing"}, brokenAt(t, results))
	})
}
