// Package engine runs multi-step operations that move money safely under retries
// and crashes.
//
// # Operations and steps
//
// An operation type (NewOperation) is a name and an ordered list of uniquely named
// steps over an input In and a state S, and a function that builds the final result
// Out. Steps are TxStep (writes to the database, committed with the step's
// checkpoint, so exactly once) or ExternalStep (calls out with a derived
// idempotency key, the same on every attempt; see "Derived keys"); methods on them
// add a compensation, a lookup (external steps only) and a retry policy:
//
//	engine.TxStep("debit", debit).Compensate(credit)
//	engine.ExternalStep("pay", pay).Lookup(findPayment).Retries(engine.RetryPolicy{MaxAttempts: 5})
//
// Every step function, compensation and lookup gets an Attempt: the step's
// derived key, the attempt's number and the operation it belongs to. In, S and
// Out must survive a round trip through encoding/json: the input and the state
// after each step are stored, and a resumed operation reads them back.
//
// # Starting and waiting
//
// Start takes the scope (the client the key belongs to: keys of different
// clients never meet) before the client's key, as every function of this
// package that takes both does. It reserves (scope, key) atomically (a plain INSERT: a taken key is a unique
// violation) and runs the first attempt at once in this process; StartTx does the
// reservation in the caller's transaction and leaves the run to a River worker.
// A second Start with the same key runs nothing: with the same input it returns
// the existing operation and, once finished, its stored result; with another
// input it is refused with a *KeyReusedError naming the top-level fields that
// differ (a Fingerprint, one hash per field, is stored with the operation;
// OperationOpts.Unfingerprinted leaves fields out). Started.Wait and Engine.Wait
// wait for the result; a first attempt hands it over without a poll. A first
// attempt runs on its input and state as they decode from JSON, as a resumed run
// does, and NewOperation refuses types that would not survive that.
//
// # What a first attempt costs
//
// The reservation commits with the first transactional step (or alone, just before
// an external step). An external step's checkpoint is not committed on its own: it
// rides with the next transaction, the one of the next transactional step or the
// one that stores the result. So an operation of a transactional step, an external
// step and another transactional step commits twice, the floor for one call to
// the outside world, and sends two statements of its own beside the steps': the
// reservation, which carries the first transaction's checkpoints when the step
// sent nothing before its commit (else they are one update of the row more),
// and the statement that stores the result with the last transaction's
// checkpoints. Checkpoints live in the operation's row; a step that failed an
// attempt, or whose compensation ran, has a row of its own.
//
// None of them costs a round trip of its own. A step's transaction (a Tx) sends
// nothing until the step does: then BEGIN, and on a first attempt the
// reservation, go in one pgx batch with the step's first statement, and the
// checkpoints go in one batch with COMMIT. Every statement of the engine's
// fails rather than answer "no row" when the run must not go on (the key is
// taken, another run got the step first), so that what follows it in the batch
// does not run. A step that sends one statement, or one batch, costs one round
// trip, and its transaction two; a step whose writes all go with AtCommit, and
// fail on their own when they must (idemflow_fail), costs none: its
// transaction is one batch, which PostgreSQL runs as an implicit transaction,
// without BEGIN or COMMIT.
//
// # Failure
//
// The engine follows Garcia-Molina and Salem's sagas. A step is compensatable
// (a TxStep, or an ExternalStep with a Compensate), a pivot (an ExternalStep
// without one: a call that cannot be undone), or retriable (any step after a
// pivot). Once a pivot has succeeded the operation only goes forward: a later
// step that keeps failing is retried past its MaxAttempts every
// RetryPolicy.Cap, never given up, and the operation is marked as needing
// attention (Info.Attention) meanwhile; a permanent failure there, or of the
// result function, parks it for an operator; nothing is compensated.
//
// Before the pivot, a step that returns a *PermanentError (Fail, Permanent) or
// runs out of attempts ends the operation failed: the compensations of the
// steps that had succeeded run, last first, and the error is stored as the
// operation's answer. Money is not moved back on a guess: an external step
// whose call may have gone through waits for its outcome (see "Late and
// unknown outcomes"), and without a lookup it is parked, needing attention,
// with nothing undone. Engine.Cancel asks the same way, and refuses
// (ErrPastPivot) an operation past its pivot.
//
// A transient failure is retried after a backoff (RetryPolicy): waited out in
// the run when short, else by a River job scheduled in the transaction that
// records the failure. A panic in a step, a lookup, a compensation or the
// result function is one failed attempt, never the process's end. An attempt
// of a transactional step that failed because the database did not answer
// (IsUnavailable: a lock or statement timeout, a lost connection) is retried
// at the backoff without counting against MaxAttempts.
//
// # Late and unknown outcomes
//
// A call to the outside world ends in one of three ways, and only the first
// is an outcome:
//
//   - Known: an answer that says done (the step returns nil) or refused (Fail,
//     a business answer).
//   - Unknown: no definite answer (a timeout, a lost connection, a 5xx, a crash
//     mid-call). The request may still land, up to the step's settle window
//     (ExternalStepDef.Settle, DefaultSettle) after it was sent. Silence is
//     never "not made".
//   - Pending: the service accepted the call and gives its final status later
//     (the step returns Pending).
//
// MaxAttempts bounds the calls. An external step out of attempts with its
// outcome unknown (or failed with a server fault) sends nothing more: it
// waits (StepStatusWaiting), with no run, lease or busy River job on it,
// while its lookup is asked at the step's backoff (at most ten times its
// Base) and once more just after the window. Found: the step succeeds and the
// operation goes forward. Nothing found once the window has passed since the
// last request was sent: the call was not made, and the operation fails and
// compensates. A pending call waits the same way until its lookup finds it
// final (found, or a Fail: it ended without effect, and the operation
// compensates with that answer), or the application delivers the outcome
// (SettleSucceeded, SettleFailed, in its own transaction, by operation and
// step or by derived key: a webhook handler's), or an operator does. A lookup
// answers "still processing" with Pending too. A step that waits past its
// window, pending or with a lookup that cannot answer, needs attention
// (CodeOutcomeOverdue) and goes on waiting; one without a lookup whose
// outcome is unknown is parked.
//
// Who may decide: the step's own answer, its lookup, the application's
// delivered outcome, and an operator (Engine.Resolve, with the reference of
// what a made call made, recorded by the step's resolve function (ExternalStepDef.Resolve); refused while
// the lookup says otherwise); never the engine on a guess. Cancel
// follows the same rule: it refuses an operation whose call may still land or
// is pending, with an *OutcomeUnknownError saying when the outcome will be
// known. Told answers are final: Retry refuses (ErrFinal) an operation that
// ended with a business answer or an operator's cancel, and reopens one that
// failed with a server fault only with RetryOpts.Force, its answer kept as
// Info.PriorError (what an HTTP layer replays) until it finishes again.
//
// # Parked operations
//
// Some operations can go neither forward nor back without a person: a step
// returned a HaltError (a provider's answer that does not match the request), a
// permanent failure after the pivot, an outcome nobody can tell (an external
// step without a lookup), an input or state that no longer decodes, a
// compensation that failed for good (the operation is half undone; a reopen
// goes on compensating). Those are parked: in progress, needing attention,
// left alone by every run until an operator reopens (Engine.Retry) or
// cancels (Engine.Cancel) them. A client retrying its key meanwhile gets the
// operation in progress.
//
// # Operators
//
// Retry, Cancel and Resolve are what an operator asks of an operation;
// an Admin asks the live processes the same without the definitions. Each
// request, done or refused, is recorded with the operation and kept as long as
// it (Info.Audit): the action, who asked (WithActor), why, and what became of
// it. Refusals are typed errors (ErrFinal, ErrOutcomeUnknown, ErrPastPivot,
// ErrNotResolvable, ErrResolutionContradicts, ErrRunning...), never a failure
// of the operation.
//
// An operation needs attention (Info.NeedsAttention, List's NeedsAttention,
// the gauges) for one of three reasons: it is in progress and the engine
// recorded why it waits for a person (Info.Attention: parked, retrying past
// the pivot, an overdue outcome); it is in progress on a version that no live
// process runs while one runs another version of its name
// (CodeVersionNotRun); or, finished or not, a reconciliation mismatch names it
// (CodeReconciliationMismatch).
//
// # Reconciliation
//
// The engine checks its books against the outside services' own when the
// application gives it a Source (Config.Reconcile): how to list a service's
// records made in a window, in pages. A periodic River job on the leader, or
// Engine.Reconcile on request, reads them page by page and finds each
// record's step by its key (keys of scheme "idf3_" carry their operation's
// id, so a page costs two indexed reads, whatever the history holds). A record
// is judged once it is final and its operation has finished: money moved under
// no key of ours (reconcile.UnknownKey), moved while the step did not succeed
// (reconcile.NotSucceeded), not moved while it did (reconcile.RecordFailed),
// moved under another reference than an operator said
// (reconcile.ReferenceDiffers), or not what was asked (the step's
// reconcile function, reconcile.AmountDiffers). Mismatches are kept with their last
// sighting until a run no longer finds them, name their operation as needing
// attention, and are listed by Engine.Reconciliation and Engine.Mismatches.
// An event the application receives (a provider's webhook) is checked at once,
// in its own transaction, with Engine.CheckRecord. The window is at most the
// shortest retention of the operations that call out, so that no operation
// is deleted while its records are still read.
//
// # Errors
//
// Every failure has a text for the client and one for operators:
// PermanentError's Message and Cause, StepInfo's LastError and LastCause. The
// client's names nothing internal (no SQL, URL, Go error text or stack).
// PermanentError.ServerFault says whether a failure is a server fault (a step
// out of attempts, a failed compensation or result function, Permanent) rather
// than a business answer (Fail): what an HTTP layer answers 500 for.
//
// # Crashes
//
// A run holds its operation through a lease on the operation's row, renewed
// while it works; a run that cannot renew stops before its lease runs out. When
// a process dies its leases expire; the sweeper, which runs in every process
// with started workers, hands such operations to River workers, which resume
// each at its first unfinished step. Every transaction of a run is fenced by
// the run: the first by the reservation, the last by the statement that stores
// the result, the others by a statement that takes a FOR SHARE lock on the
// operation's row and raises unless the run holds it, so that another run's
// claim waits for the commit and then reads it. A step's transaction sends it
// with COMMIT, so that the lock does not keep the run's own lease renewals
// waiting while the step waits on the application's locks. A checkpoint is
// keyed by (operation, step) too. A run that lost its lease and still finishes
// a step cannot commit it, nor the step's writes. Leases, retry times and the
// retention horizon use the database's clock.
//
// A process with workers also holds a session advisory lock for as long as it
// lives, whose key starts its runs' ids (TakeoverConfig). PostgreSQL releases
// it the moment the session ends, so the other processes take a dead
// process's operations over within a fraction of a second rather than at the
// end of the lease; a process that is alive but slow keeps its session, its
// lock and its operations. The lease stays the bound when no lock is held (no
// workers, or a liveness connection through a pooler).
//
// # Derived keys
//
// An external step's Attempt.Key is the operation's id followed by a digest of
// the id, a random secret chosen at its reservation and the step's name
// (scheme "idf3_"): the same on every attempt, unknown to anyone without the
// database, new for a new operation under a client key that was used before
// (after retention deleted the old one), so it never meets the old operation's
// records at a provider, and a way back from a provider's record to its
// operation for reconciliation. Operations reserved before that scheme keep
// their "idf2_" or "idf1_" keys; reconciliation counts their records as
// unverifiable.
//
// # Versions
//
// An operation type has a name and a version (OperationOpts.Version, 1 by
// default). A process registers any number of versions of a name in
// Config.Operations; Start starts an operation on the version of the
// *Operation it is given (start new ones on the newest), and the operation
// records it and always runs on it, never on another. A process that does not
// run an operation's version leaves it alone: it never claims it, fails it,
// compensates it or runs any of its steps; its sweeper scans only the
// definitions it has (one index range each, so operations waiting for another
// version cost it nothing), it logs the operation once, and Get shows it
// needing attention (CodeVersionNotRun). A process that runs the version
// finishes it.
//
// Within a version, these changes are compatible and need no new version: a
// step's body changed, its name and the shape of the state kept (the state
// decodes strictly: a renamed field is not compatible); steps appended at the
// end (an operation runs the step list it started with, so operations started
// before finish without them); a step removed that every unfinished operation
// has finished. Every other change (steps renamed, removed while operations
// still need them, reordered, or a state that no longer decodes) needs a new
// version. New refuses a version registered twice and two versions with the
// same steps. A process whose definition of a version lacks a step that an
// operation still needs leaves the operation in progress, needing attention
// (CodeDefinitionChanged), for a process that has the step.
//
// Before a deploy, Engine.Check on an engine made with the new binary's
// definitions lists the unfinished operations it could not run. To retire a version:
// deploy with both versions, wait until Check with the new version alone
// returns nothing, then deploy without the old one.
package engine
