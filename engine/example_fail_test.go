package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// A step that gets a business answer no retry can change (a declined card)
// returns Fail: the steps that had succeeded are compensated, last first, and
// the client is told the code and message as they are.
func ExampleFail() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("example_fail")
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE hold_ledger (entry serial PRIMARY KEY, owner text NOT NULL, amount bigint NOT NULL, note text NOT NULL)`); err != nil {
		panic(err)
	}

	type buyIn struct {
		Owner  string `json:"owner"`
		Amount int64  `json:"amount"`
	}
	hold := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in buyIn, _ *struct{}) error {
		_, err := tx.Exec(ctx, `INSERT INTO hold_ledger (owner, amount, note) VALUES ($1, -$2::bigint, 'hold')`, in.Owner, in.Amount)
		return err
	}
	release := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in buyIn, _ *struct{}) error {
		_, err := tx.Exec(ctx, `INSERT INTO hold_ledger (owner, amount, note) VALUES ($1, $2, 'release')`, in.Owner, in.Amount)
		return err
	}
	charge := func(ctx context.Context, call engine.Attempt, in buyIn, _ *struct{}) error {
		return engine.Fail("card_declined", "the card was declined")
	}
	op, err := engine.NewOperation("buy", []engine.Step[buyIn, struct{}]{
		engine.TxStep("hold", hold).Compensate(release),
		engine.ExternalStep("charge", charge),
	}, func(in buyIn, _ *struct{}) (int64, error) { return in.Amount, nil }, nil)
	if err != nil {
		panic(err)
	}
	e, err := engine.New(pool, &engine.Config{
		Operations: []engine.Definition{op},
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		panic(err)
	}
	defer func() { _ = e.Stop(ctx) }()

	started, err := engine.Start(ctx, e, op, "client-1", "buy-1", buyIn{Owner: "ann", Amount: 30}, nil)
	if err != nil {
		panic(err)
	}
	info, err := started.Wait(ctx)
	if err != nil {
		panic(err)
	}
	// A business answer, not a server fault: an HTTP layer answers 4xx with it.
	fmt.Printf("status=%s code=%s message=%q serverFault=%v\n",
		info.Status, info.Error.Code, info.Error.Message, info.Error.ServerFault())

	rows, err := pool.Query(ctx, `SELECT owner, amount, note FROM hold_ledger ORDER BY entry`)
	if err != nil {
		panic(err)
	}
	defer rows.Close()
	for rows.Next() {
		var owner, note string
		var amount int64
		if err := rows.Scan(&owner, &amount, &note); err != nil {
			panic(err)
		}
		fmt.Printf("%s %s %d\n", note, owner, amount)
	}
	if err := rows.Err(); err != nil {
		panic(err)
	}
	// Output:
	// status=failed code=card_declined message="the card was declined" serverFault=false
	// hold ann -30
	// release ann 30
}
