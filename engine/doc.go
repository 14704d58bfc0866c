// Package engine runs multi-step operations that move money safely under retries
// and crashes.
//
// # Operations and steps
//
// An operation type (NewOperation) is a name and an ordered list of uniquely named
// steps over an input In and a state S, and a function that builds the final result
// Out. Steps are TxStep (writes to the database, committed with the step's
// checkpoint, so exactly once) or ExternalStep (calls out with a derived
// idempotency key, the same on every attempt, see DerivedKey). In, S and Out must
// survive a round trip through encoding/json: the input and the state after each
// step are stored, and a resumed operation reads them back.
//
// # Starting and waiting
//
// Start reserves (scope, key) atomically (INSERT ... ON CONFLICT DO NOTHING) and
// runs the first attempt at once in this process; StartTx does the reservation in
// the caller's transaction and leaves the run to a River worker. A second Start
// with the same key does not run anything: it returns the existing operation, its
// fingerprint and, once finished, its stored result. Started.Wait and Engine.Wait
// wait for the result; a first attempt hands it over without a poll.
//
// # What a first attempt costs
//
// The reservation commits with the first transactional step (or alone, just before
// an external step). An external step's checkpoint is not committed on its own: it
// rides with the next transaction, the one of the next transactional step or the
// one that stores the result. So an operation of a transactional step, an external
// step and another transactional step commits twice, the floor for one call to
// the outside world, and sends three statements of its own beside the steps':
// the reservation, the insert of the first transaction's checkpoints, and the
// statement that stores the result with the last transaction's checkpoints.
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
// # Failures
//
// A step that returns an error is retried after a backoff (RetryPolicy) by a River
// job scheduled in the same transaction that records the failure; lookups let an
// external step find out whether a lost attempt went through. A *PermanentError
// (Fail, Permanent), or a step out of attempts, ends the operation failed: the
// compensations of the steps that had succeeded run last first, and the error is
// stored as the operation's answer.
//
// # Crashes
//
// A run holds its operation through a lease on the operation's row, renewed while
// it works. When a process dies its leases expire; the sweeper, which runs in
// every process with started workers, hands such operations to River workers,
// which resume each at its first unfinished step. Checkpoints are written with
// INSERT ... ON CONFLICT, so a run that lost its lease and still finishes a step
// finds the checkpoint taken, and its transaction, the step's writes with it,
// fails.
//
// # Versioning
//
// An operation records the step list it was started with and is resumed by that
// list. A process whose definition lacks a step that the operation still needs
// ends it failed with a VersionError's message, code "definition_changed".
package engine
