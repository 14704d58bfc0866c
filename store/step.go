package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/store/internal/dbsqlc"
)

// StepListByOperation reads the recorded steps of an operation, in step order.
func (s *Store) StepListByOperation(ctx context.Context, db DBTX, operationID uuid.UUID) ([]Step, error) {
	rows, err := s.q.StepListByOperation(ctx, db, pguuid.UUID(operationID))
	if err != nil {
		return nil, fmt.Errorf("store: list steps: %w", err)
	}
	out := make([]Step, len(rows))
	for i, r := range rows {
		out[i] = Step{
			OperationID: uuid.UUID(r.OperationID),
			Name:        r.Name,
			Position:    int(r.Position),
			State:       StepState(r.State),
			Attempts:    int(r.Attempts),
			Output:      r.Output,
			StartedAt:   r.StartedAt,
			FinishedAt:  r.FinishedAt,
			LastError:   deref(r.LastError),
			LastCause:   deref(r.LastCause),
			ResolvedBy:  deref(r.ResolvedBy),
			// The step's own attempts and its compensation's are counted apart.
			Compensations: int(r.Compensations),
			SentAt:        r.SentAt,
			Pending:       r.Pending,
			WaitingSince:  r.WaitingSince,
			SettleBy:      r.SettleBy,
			Reference:     deref(r.Reference),
			WaitReason:    deref(r.WaitReason),
			WaitSignal:    deref(r.WaitSignal),
			WaitUntil:     r.WaitUntil,
		}
		if r.WaitNeed != nil {
			out[i].WaitNeed = int(*r.WaitNeed)
		}
	}
	return out, nil
}

// StepCheckpointParams describe a succeeded step, for StepCheckpointMany.
type StepCheckpointParams struct {
	Name     string
	Position int
	Attempts int
	Output   json.RawMessage
	// StartedAt is when the attempt that succeeded started.
	StartedAt time.Time
	// Retried is true when an earlier attempt failed and left the step's row,
	// which the checkpoint then updates; a step without a row gets one.
	Retried bool
	// ResolvedBy is "call" or "lookup" for an external step, empty for others.
	ResolvedBy string
	// Reference is the outside service's reference for what an external step
	// made, as its definition reads it from Output (empty when it reads none),
	// kept in its checkpoint ("f"), whose state a finished operation drops:
	// valid UTF-8 without NUL.
	Reference string
}

// StepRecordFailureParams record a failed attempt of a step.
type StepRecordFailureParams struct {
	OperationID uuid.UUID
	Name        string
	Position    int
	// State is StepRetrying when another attempt follows, StepWaiting when
	// the step waits for its outcome, else StepFailed.
	State    StepState
	Attempts int
	// LastError is the failure's message for clients, LastCause for operators.
	LastError string
	LastCause string
	StartedAt time.Time
	// SentAt, when not nil, is when the attempt's request was sent at the
	// latest; the step keeps the last one given.
	SentAt *time.Time
	// Pending marks a waiting step whose call was accepted, its final status
	// to come.
	Pending bool
	// DerivedKey, when not empty, is the step's derived key, by which a
	// waiting step is found (StepWaitingByKey).
	DerivedKey string
	// SettleWindow, when not nil, says that the attempt sent a request: the
	// step's settle_by becomes the database's clock plus it, or stays later.
	SettleWindow *time.Duration
	// Reference, when not empty, is the outside service's reference of a call
	// it accepted as pending.
	Reference string
}

// StepRecordFailure records a failed attempt. A step already checkpointed keeps
// its record.
func (s *Store) StepRecordFailure(ctx context.Context, db DBTX, p StepRecordFailureParams) error {
	arg := dbsqlc.StepRecordFailureParams{
		OperationID: pguuid.UUID(p.OperationID),
		Name:        p.Name,
		Position:    int32(p.Position),
		State:       string(p.State),
		Attempts:    int32(p.Attempts),
		LastError:   ptr(Text(p.LastError)),
		LastCause:   ptr(Text(p.LastCause)),
		StartedAt:   p.StartedAt,
		SentAt:      p.SentAt,
		Pending:     p.Pending,
	}
	if p.DerivedKey != "" {
		arg.DerivedKey = ptr(p.DerivedKey)
	}
	if p.Reference != "" {
		arg.Reference = ptr(Text(p.Reference))
	}
	arg.SettleWindow = p.SettleWindow
	err := s.q.StepRecordFailure(ctx, db, arg)
	if err != nil {
		return fmt.Errorf("store: record failure of step %q: %w", p.Name, err)
	}
	return nil
}

// StepWaitingByKey returns the operation and the name of the waiting step
// whose derived key is key; ErrNotFound when no step waits under it.
func (s *Store) StepWaitingByKey(ctx context.Context, db DBTX, key string) (uuid.UUID, string, error) {
	row, err := s.q.StepWaitingByKey(ctx, db, &key)
	if err != nil {
		return uuid.Nil, "", mapErr("find waiting step", err)
	}
	return uuid.UUID(row.OperationID), row.Name, nil
}

// StepCompensationFailed records the failed attempt number n of a succeeded
// step's compensation, with its texts for the client and for operators.
func (s *Store) StepCompensationFailed(ctx context.Context, db DBTX, operationID uuid.UUID, name string, n int, lastError, lastCause string) error {
	if err := s.q.StepMaterialize(ctx, db, dbsqlc.StepMaterializeParams{OperationID: pguuid.UUID(operationID), Name: name}); err != nil {
		return fmt.Errorf("store: record failed compensation of step %q: %w", name, err)
	}
	err := s.q.StepCompensationFailed(ctx, db, dbsqlc.StepCompensationFailedParams{
		OperationID: pguuid.UUID(operationID), Name: name, Compensations: int32(n), LastError: ptr(Text(lastError)), LastCause: ptr(Text(lastCause)),
	})
	if err != nil {
		return fmt.Errorf("store: record failed compensation of step %q: %w", name, err)
	}
	return nil
}

// StepCompensated marks a succeeded step as compensated. It returns false when the
// step was not (or no longer) succeeded.
func (s *Store) StepCompensated(ctx context.Context, db DBTX, operationID uuid.UUID, name string) (bool, error) {
	// A step kept as a checkpoint gets a row, which the mark overrides it with.
	if err := s.q.StepMaterialize(ctx, db, dbsqlc.StepMaterializeParams{OperationID: pguuid.UUID(operationID), Name: name}); err != nil {
		return false, fmt.Errorf("store: mark step %q compensated: %w", name, err)
	}
	n, err := s.q.StepCompensated(ctx, db, dbsqlc.StepCompensatedParams{OperationID: pguuid.UUID(operationID), Name: name})
	if err != nil {
		return false, fmt.Errorf("store: mark step %q compensated: %w", name, err)
	}
	return n == 1, nil
}

// StepCheckpointManyParams record succeeded steps and, optionally, end their
// operation.
type StepCheckpointManyParams struct {
	OperationID uuid.UUID
	Steps       []StepCheckpointParams
	// Finish ends the operation in State with Result or Error, fenced by Run;
	// its key may be deleted once Retention has passed.
	Finish    bool
	Retention time.Duration
	Run       uuid.UUID
	State     OperationState
	Result    json.RawMessage
	Error     json.RawMessage
	// Finished, when not nil and db is a Queue, receives the finished
	// operation's timestamps from the database once the batch's results are
	// read.
	Finished *Finished
}

// Finished are the timestamps of an operation that StepCheckpointMany ended.
type Finished struct {
	CreatedAt  time.Time
	FinishedAt time.Time
}

// StepCheckpointMany records p.Steps as succeeded and, with p.Finish, ends the
// operation, in one or two statements: the steps whose row an earlier failed
// attempt left (Retried) are updated by one; the others are added to the
// operation's checkpoints by another (OperationCheckpoint), which with
// p.Finish is the statement that ends the operation, fenced by p.Run. Each
// fails with ErrFenced, the transaction aborted, when another run recorded
// one of the steps first, so that a COMMIT queued after them never commits
// what they did not; a checkpoint without Finish relies on the transaction's
// own fence for the lease. With a Queue for
// db they are only queued, and their errors come back with the batch's
// results (see Err).
func (s *Store) StepCheckpointMany(ctx context.Context, db DBTX, p StepCheckpointManyParams) error {
	var fresh, retried []StepCheckpointParams
	for _, st := range p.Steps {
		if st.Retried {
			retried = append(retried, st)
		} else {
			fresh = append(fresh, st)
		}
	}
	now := time.Now()
	if len(fresh) > 0 && !p.Finish {
		err := s.q.OperationCheckpoint(ctx, db, dbsqlc.OperationCheckpointParams{
			ID: pguuid.UUID(p.OperationID), Checkpoints: encodeCheckpoints(fresh, now, true), Names: stepNames(fresh),
		})
		if err != nil {
			return fmt.Errorf("store: checkpoint steps: %w", Err(err))
		}
	}
	if len(retried) > 0 {
		rc := stepColumnsOf(retried)
		args := dbsqlc.StepUpdateSucceededParams{
			OperationID: pguuid.UUID(p.OperationID),
			Names:       rc.names,
			Attempts:    rc.attempts,
			Outputs:     rc.outputs,
			ResolvedBys: rc.resolvedBys,
		}
		if err := s.q.StepUpdateSucceeded(ctx, db, args); err != nil {
			return fmt.Errorf("store: checkpoint retried steps: %w", Err(err))
		}
	}
	if p.Finish {
		args := dbsqlc.OperationFinishParams{
			OperationID: pguuid.UUID(p.OperationID),
			RunID:       pguuid.UUID(p.Run),
			State:       string(p.State),
			Result:      nullJSON(p.Result),
			Error:       nullJSON(p.Error),
			Retention:   p.Retention,
			// A succeeded operation's state is never read again.
			Checkpoints: encodeCheckpoints(fresh, now, p.State != OperationSucceeded),
			Names:       stepNames(fresh),
		}
		err := s.q.OperationFinish(ctx, db, args)
		if err != nil {
			return fmt.Errorf("store: finish operation: %w", Err(err))
		}
		if q, ok := db.(Queue); ok && p.Finished != nil {
			// Read from the statement's row (past its fence) when the batch
			// runs, rather than from a read of its own.
			q.Batch.QueuedQueries[len(q.Batch.QueuedQueries)-1].QueryRow(func(row pgx.Row) error {
				return row.Scan(nil, &p.Finished.CreatedAt, &p.Finished.FinishedAt)
			})
		}
	}
	return nil
}

// encodeCheckpoints encodes steps as the checkpoints column holds them (store
// migration 00010): an object by step name of {"p": position, "a": attempts,
// "r": resolved by (when set), "f": the reference (when set), "s": started at and "d": how long until
// finishedAt (microseconds), "o": the state after the step, a string of its
// JSON, when withState}. It returns nil for no steps. Written by hand: it is
// on every operation's path, and encoding/json would reflect over a map.
func encodeCheckpoints(steps []StepCheckpointParams, finishedAt time.Time, withState bool) json.RawMessage {
	if len(steps) == 0 {
		return nil
	}
	b := make([]byte, 0, 128*len(steps))
	b = append(b, '{')
	for i, st := range steps {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, st.Name)
		b = append(b, `:{"p":`...)
		b = strconv.AppendInt(b, int64(st.Position), 10)
		b = append(b, `,"a":`...)
		b = strconv.AppendInt(b, int64(st.Attempts), 10)
		if st.ResolvedBy != "" {
			b = append(b, `,"r":`...)
			b = appendJSONString(b, st.ResolvedBy)
		}
		if st.Reference != "" {
			b = append(b, `,"f":`...)
			b = appendJSONString(b, st.Reference)
		}
		b = append(b, `,"s":`...)
		b = strconv.AppendInt(b, st.StartedAt.UnixMicro(), 10)
		b = append(b, `,"d":`...)
		b = strconv.AppendInt(b, max(finishedAt.Sub(st.StartedAt).Microseconds(), 0), 10)
		if withState && len(st.Output) > 0 {
			// As a string of the exact bytes: jsonb would reorder the state's
			// keys, and refuses the \u0000 that a state may hold.
			b = append(b, `,"o":`...)
			b = appendJSONString(b, st.Output)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// appendJSONString appends s, valid UTF-8 (a step's name, a state's JSON), as a
// JSON string of the same characters.
func appendJSONString[T ~string | ~[]byte](b []byte, s T) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := range len(s) {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

func stepNames(steps []StepCheckpointParams) []string {
	names := make([]string, len(steps))
	for i, st := range steps {
		names[i] = st.Name
	}
	return names
}

// stepColumns are retried steps' checkpoints as StepUpdateSucceeded takes
// them: one array per column, one step per index.
type stepColumns struct {
	names       []string
	attempts    []int32
	outputs     []string
	resolvedBys []string
}

func stepColumnsOf(steps []StepCheckpointParams) stepColumns {
	c := stepColumns{
		names:       make([]string, len(steps)),
		attempts:    make([]int32, len(steps)),
		outputs:     make([]string, len(steps)),
		resolvedBys: make([]string, len(steps)),
	}
	for i, st := range steps {
		c.names[i] = st.Name
		c.attempts[i] = int32(st.Attempts)
		c.outputs[i] = string(st.Output)
		c.resolvedBys[i] = st.ResolvedBy
	}
	return c
}
