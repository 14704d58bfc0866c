// Package outbox enqueues River jobs in a step's transaction: the transactional
// outbox, River's way.
//
//	outbox.Step("notify", client, func(at engine.Attempt, in In, s *State) ([]river.InsertManyParams, error) {
//		return []river.InsertManyParams{{Args: ReceiptArgs{Key: at.Key, Email: in.Email}}}, nil
//	})
//
// A job inserted with Insert, InsertMany, With or Step commits with the step's
// writes and checkpoint or not at all, so a notification or a webhook job
// exists exactly when the ledger move it tells of does: a step attempt that
// fails, or a process that dies before COMMIT, leaves no job behind, and a
// retried step inserts its job once more only because the first never
// committed.
//
// The job itself runs at least once (River retries a failed job), so its worker
// must be idempotent in turn: the derived key (engine.Attempt.Key) that Step
// and Insert's callers have at hand is a good idempotency key for what the job
// sends.
//
// Inserting needs the step's transaction as a pgx.Tx (engine.PgxTx), which costs
// the step its deferred BEGIN: one more round trip for that step.
//
// The client may be an insert-only River client (river.NewClient with no
// Queues), made before the engine: it only inserts.
package outbox
