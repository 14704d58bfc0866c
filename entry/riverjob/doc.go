// Package riverjob consumes queued messages exactly once: a River worker that
// turns each job into an operation keyed by the message's id, started in the
// transaction that completes the job.
//
// Kafka, SQS and River itself deliver a message at least once: after a crash,
// a lost acknowledgement or a producer's retry, the same message comes again.
// The message's id, the same on every delivery, is the operation's idempotency
// key, and it is recorded in the same transaction as the job's completion:
//
//	w, err := riverjob.New(e, op, &riverjob.Config[PaymentArgs, PayIn]{
//		MessageFunc: func(job *river.Job[PaymentArgs]) (riverjob.Message[PayIn], error) {
//			return riverjob.Message[PayIn]{Scope: "payments-topic", ID: job.Args.MessageID,
//				Input: PayIn{Account: job.Args.Account, Amount: job.Args.Amount}}, nil
//		},
//		RejectedFunc: recordRejection, // optional
//	})
//	river.AddWorker(workers, w) // on the consumer's River client
//
// # The guarantee
//
// Work begins a transaction on the engine's pool, calls engine.StartTx with the
// message's scope and id, runs Config.StartedFunc if set, completes the job
// (river.JobCompleteTx) and commits. So there is one operation per (scope,
// message id), however often and however concurrently the message is
// delivered, and the operation's effects happen exactly once by the engine's
// steps (a TxStep's writes commit with its checkpoint; an external step calls
// out under its derived key), on the engine's workers, after the commit.
//
// There is no moment at which an effect has happened and the message is not
// acknowledged: the operation's reservation, which its steps need, and the
// job's completion commit together or not at all. A process that dies before
// the commit leaves no operation and the job running, to be delivered again
// (see "Stuck jobs"); one that dies after it leaves the job completed, and the
// operation to the engine, which resumes it. The job completes when the
// operation is started, not when it ends: how it ends (succeeded, failed,
// compensated) is the engine's to record and the application's to read (
// engine.Engine.GetByKey with the same scope and id).
//
// Any other failure (the database, StartedFunc, the completion) rolls all of it
// back and fails the job's attempt, which River retries with its retry policy.
//
// # What a duplicate costs
//
// A new message costs one transaction of five round trips: BEGIN, the
// reservation, the insert of the River job that runs the operation, the job's
// completion, COMMIT (and StartedFunc's statements). A duplicate costs the
// same five round trips with a read of the operation in place of the insert:
// no job is enqueued, nothing runs, no effect. A duplicate that arrives while
// an earlier delivery's transaction is open waits for it, on the key's unique
// index, and then finds its operation (or, if it rolled back, starts it).
//
// Duplicates are recognized for as long as the operation is kept: the
// engine's retention (engine.Config.Retention, or the operation type's
// engine.OperationOpts.Retention; 24 hours by default, counted from the
// operation's end). A message delivered again after its operation was deleted
// starts a new one, so keep the retention longer than the producer's
// redelivery window.
//
// # Rejected messages
//
// A message whose id holds an operation started with another input (a
// producer bug, or two producers sharing ids in one scope) is refused by the
// engine with a *engine.ReusedError naming the fields that differ; an empty
// id with engine.ErrInvalidKey. No retry can mend either, so Work rejects the
// message: in the job's transaction it calls Config.RejectedFunc (the
// application records "rejected"), stores a Rejection as the job's output,
// and cancels the job (River's JobCancelTx), then commits and returns
// river.JobCancel. The job is never retried, even if the process dies right
// after the commit (River's rescuer cancels a job marked so), and
// RejectedFunc's writes commit once, with the cancellation. The first
// message's operation is untouched. River may record the attempt's error as
// "job cancelled remotely" rather than the engine's: read the output, or the
// application's record, for why.
//
// Build Message.Input from the message's body only: a field that differs
// between deliveries of one message (a delivery count, a time of receipt)
// turns every redelivery into a rejected message.
//
// # Clients and workers
//
// Run the worker on the engine's own River client, in a queue of its own:
// engine.RiverConfig.Workers is given the engine as it is made, so the worker
// is made and added there, and RiverConfig.Queues names its queue:
//
//	e, err := engine.New(pool, &engine.Config{Operations: ops, River: engine.RiverConfig{
//		Workers: func(e *engine.Engine, workers *river.Workers) error {
//			w, err := riverjob.New(e, op, cfg)
//			if err != nil {
//				return err
//			}
//			return river.AddWorkerSafely(workers, w)
//		},
//		Queues: map[string]river.QueueConfig{"payments": {MaxWorkers: 10}},
//	}})
//
// Insert the jobs with engine.Engine.River (or any River client on the same
// database) into that queue. The operations that the worker starts run on the
// engine's workers: engine.Engine.StartWorkers must run in this process or
// another one on the database, or the operations wait.
//
// # Stuck jobs
//
// A job whose process died during Work stays running until River's leader
// rescues it (River's Config.RescueStuckJobsAfter, an hour by default;
// engine.RiverConfig.RescueStuckJobsAfter sets it for the engine's client) and
// retries it. The leader is one of the clients of the database and River
// schema that are eligible to lead, and the engine's client always is. A
// leader that has no worker for a job's kind discards the job instead of
// retrying it: if the engine's client leads when a consumer's job is stuck,
// the message is lost to the consumer (the job ends discarded; River keeps it
// for a week, and river.Client.JobRetry brings it back). So run the
// consumer's worker on the engine's own client, as above, and the leader,
// whichever process it is in, knows its kind. Alternatively give the
// consumer's client a River schema of its own (River's Config.Schema, migrated
// with rivermigrate and its Config.Schema): its leader is then one of its own
// clients, and the job's completion still commits with the engine's
// reservation, one transaction across both schemas. A rejected job is not
// affected: it is cancelled whoever leads.
package riverjob
