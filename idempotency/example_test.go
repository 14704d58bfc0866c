package idempotency_test

import (
	"cmp"
	"context"
	"errors"
	"log"
	"net/http"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
)

type refundIn struct {
	OrderID  string         `json:"orderId"`
	Amount   int64          `json:"amount"`
	Metadata map[string]any `json:"metadata,omitempty"`
}

type refundState struct {
	RefundID string `json:"refundId"`
}

type refundOut struct {
	RefundID string `json:"refundId"`
	OrderID  string `json:"orderId"`
	Amount   int64  `json:"amount"`
}

// Mount an operation type as POST /refunds. The example needs a database migrated
// with store.Migrate (and River's migrations), so it is compiled but not run; the
// package's tests run the same thing against PostgreSQL.
func ExampleHandler() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	refund, err := engine.NewOperation("refund", []engine.Step[refundIn, refundState]{
		engine.TxStep("ledger", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in refundIn, s *refundState) error {
			if !strings.HasPrefix(in.OrderID, "A-") {
				// A business outcome: stored, and answered 404 on every attempt.
				return engine.Fail("order_not_found", "there is no order "+in.OrderID)
			}
			s.RefundID = "re_" + in.OrderID
			return nil
		}),
	}, func(in refundIn, s *refundState) (refundOut, error) {
		return refundOut{RefundID: s.RefundID, OrderID: in.OrderID, Amount: in.Amount}, nil
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{refund}})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Stop(context.WithoutCancel(ctx))

	cfg := &idempotency.Config{
		Engine: e,
		ScopeFunc: func(r *http.Request) (string, error) {
			// The demo maps bearer tokens to client names.
			token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || token == "" {
				return "", errors.New("a bearer token is required")
			}
			return token, nil
		},
	}
	refunds, err := idempotency.Handler(cfg, refund, &idempotency.EndpointOpts[refundIn]{
		DecodeFunc: func(r *http.Request, f idempotency.Fields) (refundIn, error) {
			var in refundIn
			err := cmp.Or(
				f.Only("orderId", "amount", "metadata"),
				f.Required("orderId", &in.OrderID),
				f.Required("amount", &in.Amount),
				f.Optional("metadata", &in.Metadata),
			)
			if err == nil && in.Amount <= 0 {
				err = &idempotency.FieldError{Param: "amount", Message: "must be a positive integer"}
			}
			return in, err
		},
		Unfingerprinted: []string{"metadata"},
		ErrorStatusFunc: func(code string) int {
			if code == "order_not_found" {
				return http.StatusNotFound
			}
			return 0 // the default
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("POST /refunds", refunds)
	mux.HandleFunc("GET /refunds/{id}", func(w http.ResponseWriter, r *http.Request) {
		// The application's other endpoints answer errors the same way.
		idempotency.WriteError(w, http.StatusNotFound, "refund_not_found", "there is no refund "+r.PathValue("id"), nil)
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
