package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemflow/idemflow/engine"
)

// Insert inserts a River job in the step's transaction tx, through client: it
// commits with the step's writes and checkpoint, or not at all. opts may be nil.
func Insert(ctx context.Context, tx engine.Tx, client *river.Client[pgx.Tx], args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	ptx, err := engine.PgxTx(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	res, err := client.InsertTx(ctx, ptx, args, opts)
	if err != nil {
		return nil, fmt.Errorf("outbox: insert %s job: %w", args.Kind(), err)
	}
	return res, nil
}

// InsertMany inserts several River jobs in the step's transaction tx, in one
// statement; like Insert, they commit with the step or not at all.
func InsertMany(ctx context.Context, tx engine.Tx, client *river.Client[pgx.Tx], params []river.InsertManyParams) ([]*rivertype.JobInsertResult, error) {
	if len(params) == 0 {
		return nil, nil
	}
	ptx, err := engine.PgxTx(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	res, err := client.InsertManyTx(ctx, ptx, params)
	if err != nil {
		return nil, fmt.Errorf("outbox: insert %d jobs: %w", len(params), err)
	}
	return res, nil
}

// JobsFunc builds the jobs that a step enqueues, from the operation's input and
// state; at.Key is the step's derived key, unique to this step of this
// operation, for the jobs' own idempotency.
type JobsFunc[In, S any] func(at engine.Attempt, in In, state *S) ([]river.InsertManyParams, error)

// Step returns a transactional step named name that only enqueues the jobs that
// jobs builds: a step of its own after the steps whose outcome the jobs tell of,
// committed with its checkpoint. To enqueue with a step's own writes instead, in
// the same transaction, call Insert from that step, or wrap it with With.
func Step[In, S any](name string, client *river.Client[pgx.Tx], jobs JobsFunc[In, S]) engine.TxStepDef[In, S] {
	return engine.TxStep(name, With(nil, client, jobs))
}

// With returns fn followed, in its transaction, by the insert of the jobs that
// jobs builds from the state fn left: the jobs commit with fn's writes or not at
// all. A nil fn writes nothing itself.
func With[In, S any](fn func(ctx context.Context, tx engine.Tx, at engine.Attempt, in In, state *S) error, client *river.Client[pgx.Tx], jobs JobsFunc[In, S]) func(ctx context.Context, tx engine.Tx, at engine.Attempt, in In, state *S) error {
	return func(ctx context.Context, tx engine.Tx, at engine.Attempt, in In, state *S) error {
		if fn != nil {
			if err := fn(ctx, tx, at, in, state); err != nil {
				return err
			}
		}
		params, err := jobs(at, in, state)
		if err != nil {
			return err
		}
		_, err = InsertMany(ctx, tx, client, params)
		return err
	}
}
