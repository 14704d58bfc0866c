package riverjob_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/riverjob"
	"github.com/idemflow/idemflow/idemflowtest"
)

// ChargeArgs is a message from the shop's event stream, as a River job: the
// producer's message id and the body.
type ChargeArgs struct {
	MessageID string `json:"message_id"`
	Order     string `json:"order"`
	Amount    int64  `json:"amount"`
}

func (ChargeArgs) Kind() string { return "shop_charge" }

// A consumer of a stream that redelivers: each message is a River job, and the
// worker turns it into an operation keyed by the message's id, started in the
// transaction that completes the job. A redelivered message completes without
// a second charge; a message that reuses an id with another body is rejected,
// its job cancelled, and the application records it.
func ExampleNew() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("riverjob_example")
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE charge (order_id text NOT NULL, amount bigint NOT NULL);
		CREATE TABLE rejected_message (message_id text PRIMARY KEY, reason text NOT NULL)`); err != nil {
		panic(err)
	}

	type chargeIn struct {
		Order  string `json:"order"`
		Amount int64  `json:"amount"`
	}
	op, err := engine.NewOperation("charge", []engine.Step[chargeIn, struct{}]{
		engine.TxStep("charge", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in chargeIn, _ *struct{}) error {
			_, err := tx.Exec(ctx, `INSERT INTO charge VALUES ($1, $2)`, in.Order, in.Amount)
			return err
		}),
	}, func(in chargeIn, _ *struct{}) (int64, error) { return in.Amount, nil }, nil)
	if err != nil {
		panic(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	consumer := &riverjob.Config[ChargeArgs, chargeIn]{
		MessageFunc: func(job *river.Job[ChargeArgs]) (riverjob.Message[chargeIn], error) {
			return riverjob.Message[chargeIn]{
				Scope: "shop-events",
				ID:    job.Args.MessageID,
				Input: chargeIn{Order: job.Args.Order, Amount: job.Args.Amount},
			}, nil
		},
		RejectedFunc: func(ctx context.Context, tx pgx.Tx, job *river.Job[ChargeArgs], err error) error {
			_, err = tx.Exec(ctx, `INSERT INTO rejected_message VALUES ($1, $2) ON CONFLICT DO NOTHING`, job.Args.MessageID, err.Error())
			return err
		},
		Logger: quiet,
	}
	// The consumer runs on the engine's own River client, in a queue of its
	// own: River's leader then knows its jobs' kind.
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Logger: quiet,
		River: engine.RiverConfig{
			Workers: func(e *engine.Engine, workers *river.Workers) error {
				w, err := riverjob.New(e, op, consumer)
				if err != nil {
					return err
				}
				return river.AddWorkerSafely(workers, w)
			},
			Queues: map[string]river.QueueConfig{"shop": {MaxWorkers: 10}},
		},
	})
	if err != nil {
		panic(err)
	}
	if err := e.StartWorkers(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = e.Stop(ctx) }()
	client := e.River()

	// deliver inserts the message's job and waits until River is done with it.
	deliver := func(args ChargeArgs) *rivertype.JobRow {
		res, err := client.Insert(ctx, args, &river.InsertOpts{Queue: "shop"})
		if err != nil {
			panic(err)
		}
		for {
			job, err := client.JobGet(ctx, res.Job.ID)
			if err != nil {
				panic(err)
			}
			if job.FinalizedAt != nil {
				return job
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	msg := ChargeArgs{MessageID: "evt-1", Order: "A-1042", Amount: 1499}
	fmt.Println("first delivery:", deliver(msg).State)
	fmt.Println("redelivery:", deliver(msg).State)
	reused := deliver(ChargeArgs{MessageID: "evt-1", Order: "A-1042", Amount: 1500})
	var why riverjob.Rejection
	if err := json.Unmarshal(reused.Output(), &why); err != nil {
		panic(err)
	}
	fmt.Println("another body under evt-1:", reused.State, why.Fields)

	info, err := e.GetByKey(ctx, "shop-events", "evt-1")
	if err != nil {
		panic(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if info, err = e.Wait(waitCtx, info.ID); err != nil {
		panic(err)
	}
	var charges, rejected int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM charge), (SELECT count(*) FROM rejected_message)`).Scan(&charges, &rejected); err != nil {
		panic(err)
	}
	fmt.Printf("operation %s, charges %d, rejected messages %d\n", info.Status, charges, rejected)
	// Output:
	// first delivery: completed
	// redelivery: completed
	// another body under evt-1: cancelled [amount]
	// operation succeeded, charges 1, rejected messages 1
}
