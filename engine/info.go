package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/store"
)

// Status is the state of an operation.
type Status string

// The states of an operation.
const (
	StatusInProgress Status = "in_progress"
	StatusSucceeded  Status = "succeeded"
	StatusFailed     Status = "failed"
)

// StepStatus is the state of one step of an operation, as Get reports it.
type StepStatus string

// The states of a step.
const (
	// StepStatusNotStarted: the step has not run yet.
	StepStatusNotStarted StepStatus = "pending"
	// StepStatusRunning: the step is being attempted, or waits for its next attempt after
	// a transient failure (Attempts and LastError tell which).
	StepStatusRunning StepStatus = "running"
	// StepStatusWaiting: the step waits for its outcome, with no run busy on
	// it: its call got no definite answer and it is out of attempts, or the
	// outside service accepted it and settles it later (StepInfo.Pending).
	// Its lookup, an event (Engine.RecordOutcome) or an operator
	// settles it (see the package documentation, "Late and unknown outcomes").
	StepStatusWaiting StepStatus = "waiting"
	// StepStatusSucceeded: the step is checkpointed; it never runs again.
	StepStatusSucceeded StepStatus = "succeeded"
	// StepStatusFailed: the step failed for good and ended the operation.
	StepStatusFailed StepStatus = "failed"
	// StepStatusCompensated: the step succeeded, then was undone by its compensation.
	StepStatusCompensated StepStatus = "compensated"
	// StepStatusSkipped: the operation ended before the step ran; it never will.
	StepStatusSkipped StepStatus = "skipped"
)

// Info is an operation as stored: its state, its stored answer and its steps.
type Info struct {
	ID uuid.UUID
	// Name is the operation type's name, Version the version of its definition
	// that the operation started on and runs on.
	Name    string
	Version int
	// Scope and Key are the client scope and the client's idempotency key.
	Scope  string
	Key    string
	Status Status
	// Fingerprint is what tells a retry of the start from another start under
	// the same key (see Start).
	Fingerprint *Fingerprint
	// Result is the exact bytes of the JSON result once the operation succeeded.
	Result json.RawMessage
	// Error is the error that ended a failed operation: its Message for the
	// client, its Cause for operators.
	Error *PermanentError
	// Compensating, for an operation in progress, is the failure whose
	// compensations it runs (or is parked in the middle of): its answer once
	// they are done.
	Compensating *PermanentError
	// PriorError, for an operation in progress that an operator reopened by
	// force (RetryOpts.Force), is the server fault it had ended with: what its
	// client was told, and what an HTTP layer replays for its key until it
	// finishes again.
	PriorError *PermanentError
	// Attention, while not nil, says why the operation waits for an operator
	// (see NeedsAttention): a step that keeps failing after the point of no
	// return, a halt, an outcome nobody can tell, a state that does not
	// decode, a version no live process runs, or (finished operations too) a
	// reconciliation mismatch.
	Attention *Attention
	// Parked is true when no run takes the operation up again until an operator
	// reopens (Engine.Retry) or cancels (Engine.Cancel) it.
	Parked bool
	// Runs counts the runs that claimed the operation: 1 for an operation that
	// finished in its first attempt.
	Runs       int
	CreatedAt  time.Time
	FinishedAt *time.Time
	// Steps lists every step the operation was started with, in order. Get fills
	// it; the Info that Start and Wait return leave it nil.
	Steps []StepInfo
	// Audit lists the operators' requests on the operation, oldest first
	// (Retry, Cancel, Resolve, done or refused). Get fills it.
	Audit []AuditEntry
	// Mismatches are the reconciliation mismatches that name the operation
	// (see Engine.Reconcile). Get fills it.
	Mismatches []Mismatch
}

// Attention is why an operation waits for an operator.
type Attention struct {
	// Code is one of the engine's attention codes (CodeRetryingPastPivot,
	// CodeFailedPastPivot, CodeOutcomeUnknown, CodeUndecodableState,
	// CodeDefinitionChanged) or a step's HaltError code.
	Code AttentionCode
	// Reason is for operators.
	Reason string
}

// NeedsAttention reports whether the operation waits for an operator: one in
// progress with an Attention, and any operation that a reconciliation
// mismatch names. It is what List's NeedsAttention selects, and what the
// gauges count. An in-progress operation whose attention was recorded and
// that has finished since does not need it any more.
func (i *Info) NeedsAttention() bool {
	if i.Attention == nil {
		return false
	}
	return i.Status == StatusInProgress || i.Attention.Code == CodeReconciliationMismatch
}

// ResolvedBy says what gave an external step its outcome (StepInfo.ResolvedBy).
type ResolvedBy string

// What gives an external step its outcome.
const (
	// ResolvedByCall: the step's own call gave its outcome.
	ResolvedByCall ResolvedBy = "call"
	// ResolvedByLookup: the step's lookup, by derived key, found that an
	// earlier attempt whose answer was lost had gone through.
	ResolvedByLookup ResolvedBy = "lookup"
	// ResolvedByEvent: the outside service's word, by another door than the lookup (Engine.RecordOutcome),
	// from an event such as a provider's webhook.
	ResolvedByEvent ResolvedBy = "event"
	// ResolvedByOperator: an operator said how the call ended.
	ResolvedByOperator ResolvedBy = "operator"
)

// StepInfo is one step of an operation.
type StepInfo struct {
	Name   string
	Kind   StepKind
	Status StepStatus
	// Attempts counts the finished attempts of the step.
	Attempts int
	// DerivedKey is the idempotency key of an external step, empty for others.
	DerivedKey string
	// ResolvedBy is ResolvedByCall, ResolvedByLookup, ResolvedByEvent or
	// ResolvedByOperator for an external step that succeeded, empty otherwise
	// (and for steps checkpointed before it was kept).
	ResolvedBy ResolvedBy
	StartedAt  *time.Time
	FinishedAt *time.Time
	// Accepted is true for a waiting step whose call the outside service
	// accepted, with its final outcome to come; WaitingSince is when a waiting
	// step began waiting; SentAt is when an external step's last request that
	// failed was sent at the latest, from which its outcome window runs.
	Accepted     bool
	WaitingSince *time.Time
	SentAt       *time.Time
	// Window is an external step's outcome window in this process's
	// definition (ExternalStepDef.Window); zero when this process does not
	// define the step. The window of a request already sent is SettleBy's.
	Window time.Duration
	// SettleBy is when a request of an external step that got no definite
	// answer can no longer land, by the database's clock: fixed when the
	// request was sent, with the step's window then. Nil for a step that sent
	// no request that failed.
	SettleBy *time.Time
	// Reference is the outside service's reference of a call it accepted as
	// pending (Accepted); empty when none was told.
	Reference string
	// LastError is the last failure's message for the client: it names nothing
	// internal (no SQL, URL or Go error text). LastCause is the same failure for
	// operators.
	LastError string
	LastCause string
	// Wait, for a step in StepStatusWaiting, says what it waits for and
	// until when.
	Wait *WaitInfo
}

// WaitInfo is what a waiting step waits for (StepInfo.Wait).
type WaitInfo struct {
	Reason WaitReason
	// Signal is the signal a SignalStep waits for.
	Signal string
	// Until is when the wait ends, by the database's clock: a TimerStep's
	// moment, a deadline, an approval's expiry, or an external step's
	// SettleBy. Nil: no end is fixed.
	Until *time.Time
	// Need is how many distinct actors must approve, ApprovedBy those who
	// did, in the order they did (WaitApproval).
	Need       int
	ApprovedBy []string
}

// Get reads an operation and its steps. It returns ErrNotFound when there is none.
func (e *Engine) Get(ctx context.Context, id uuid.UUID) (*Info, error) {
	rec, err := e.store.OperationGet(ctx, e.pool, id)
	if err != nil {
		return nil, e.statementErr(ctx, err)
	}
	return e.infoWithSteps(ctx, rec)
}

// GetByKey reads the operation reserved under (scope, key), with its steps. It
// returns ErrNotFound when there is none.
func (e *Engine) GetByKey(ctx context.Context, scope, key string) (*Info, error) {
	rec, err := e.store.OperationGetByKey(ctx, e.pool, scope, key)
	if err != nil {
		return nil, e.statementErr(ctx, err)
	}
	return e.infoWithSteps(ctx, rec)
}

func (e *Engine) infoWithSteps(ctx context.Context, rec *store.Operation) (*Info, error) {
	steps, err := e.store.StepListByOperation(ctx, e.pool, rec.ID)
	if err != nil {
		return nil, e.statementErr(ctx, err)
	}
	info := infoFromRecord(rec)
	if info.Audit, err = e.auditOf(ctx, rec.ID); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	byName := make(map[string]store.Step, len(steps))
	for _, s := range steps {
		byName[s.Name] = s
	}
	def := e.def(rec.Name, rec.Version)
	if def == nil && rec.State == store.OperationInProgress && info.Attention == nil {
		waits, err := e.versionWaits(ctx, rec.Name, rec.Version)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		if waits {
			info.Attention = versionNotRun(rec.Name, rec.Version)
		}
	}
	if info.Mismatches, err = e.mismatches(ctx, e.pool, store.MismatchListParams{Operation: &rec.ID, Max: reconcileReportMax}); err != nil {
		return nil, err
	}
	if m := info.Mismatches; len(m) > 0 && (info.Attention == nil || rec.State != store.OperationInProgress) {
		info.Attention = &Attention{Code: CodeReconciliationMismatch, Reason: fmt.Sprintf(
			"reconciliation: %s record %s of %s: %s", m[0].Kind, m[0].Reference, m[0].Source, m[0].Detail)}
	}
	held := rec.State == store.OperationInProgress && rec.LockedBy != nil && rec.LockedUntil.After(time.Now())
	sawUnfinished := false
	for _, name := range rec.Steps {
		si := StepInfo{Name: name, Status: StepStatusNotStarted}
		if def != nil {
			if i, ok := def.index[name]; ok {
				si.Kind = def.steps[i].kind
				if si.Kind == StepKindExternal {
					si.DerivedKey = derivedKey(rec.ID, rec.KeySecret, rec.Name, rec.Scope, rec.Key, name)
					si.Window = def.steps[i].settle
				}
			}
		} else if len(e.defs) == 0 {
			// An Admin, which has no definitions, cannot tell which steps
			// call out: an operator gets every step's key (see Admin.Get).
			si.DerivedKey = derivedKey(rec.ID, rec.KeySecret, rec.Name, rec.Scope, rec.Key, name)
		}
		if s, ok := byName[name]; ok {
			si.Attempts = s.Attempts
			si.LastError = s.LastError
			si.LastCause = s.LastCause
			si.ResolvedBy = ResolvedBy(s.ResolvedBy)
			started := s.StartedAt
			si.StartedAt = &started
			si.FinishedAt = s.FinishedAt
			si.SentAt = s.SentAt
			si.SettleBy = s.SettleBy
			si.Reference = s.Reference
			switch s.State {
			case store.StepWaiting:
				si.Status = StepStatusWaiting
				si.Accepted = s.Pending
				si.WaitingSince = s.WaitingSince
				if si.Wait, err = e.waitInfo(ctx, rec, s); err != nil {
					return nil, err
				}
				if rec.State != store.OperationInProgress {
					// Its operation ended without it (an operator's cancel
					// once its window had passed): its calls took no effect.
					si.Status, si.Accepted, si.WaitingSince, si.Wait = StepStatusFailed, false, nil, nil
				}
			case store.StepSucceeded:
				si.Status = StepStatusSucceeded
			case store.StepCompensated:
				si.Status = StepStatusCompensated
			case store.StepFailed:
				si.Status = StepStatusFailed
			case store.StepRetrying:
				si.Status = StepStatusRunning
			}
		}
		if si.Status == StepStatusNotStarted || si.Status == StepStatusRunning {
			switch {
			case rec.State != store.OperationInProgress:
				si.Status = StepStatusSkipped
			case !sawUnfinished && held:
				// The first unfinished step of an operation that a live run holds is
				// the one that run is working on.
				si.Status = StepStatusRunning
			}
			sawUnfinished = true
		}
		info.Steps = append(info.Steps, si)
	}
	return info, nil
}

// waitInfo is what the waiting step s waits for.
func (e *Engine) waitInfo(ctx context.Context, rec *store.Operation, s store.Step) (*WaitInfo, error) {
	if s.WaitReason == "" {
		return &WaitInfo{Reason: WaitOutcome, Until: s.SettleBy}, nil
	}
	w := &WaitInfo{Reason: WaitReason(s.WaitReason), Until: s.WaitUntil, Need: s.WaitNeed}
	switch w.Reason {
	case WaitSignal:
		w.Signal = s.WaitSignal
	case WaitApproval:
		signals, err := e.store.SignalList(ctx, e.pool, rec.ID, []string{signalApprove})
		if err != nil {
			return nil, e.statementErr(ctx, err)
		}
		for _, g := range signals {
			w.ApprovedBy = append(w.ApprovedBy, g.Actor)
		}
	}
	return w, nil
}

// versionNotRun is the attention of an operation on a version no live process
// runs.
func versionNotRun(name string, version int) *Attention {
	return &Attention{Code: CodeVersionNotRun, Reason: fmt.Sprintf(
		"no live process runs version %d of %s: the operation waits for a process that does", version, name)}
}

// versionWaits reports whether no live process runs version of name while
// one runs another version of it, this process included when it runs one.
func (e *Engine) versionWaits(ctx context.Context, name string, version int) (bool, error) {
	procs, err := e.store.ProcessListLive(ctx, e.pool)
	if err != nil {
		return false, err
	}
	other := len(e.versions[name]) > 0
	this := DefinitionName{name, version}.String()
	for _, p := range procs {
		for _, d := range p.Definitions {
			if d == this {
				return false, nil
			}
			if parseDefinitionName(d).Name == name {
				other = true
			}
		}
	}
	return other, nil
}

func infoFromRecord(rec *store.Operation) *Info {
	info := &Info{
		ID:          rec.ID,
		Name:        rec.Name,
		Version:     rec.Version,
		Scope:       rec.Scope,
		Key:         rec.Key,
		Status:      Status(rec.State),
		Fingerprint: decodeFingerprint(rec.Fingerprint),
		Parked:      rec.Parked,
		Result:      rec.Result,
		Runs:        rec.Runs,
		CreatedAt:   rec.CreatedAt,
		FinishedAt:  rec.FinishedAt,
	}
	if rec.AttentionCode != "" {
		info.Attention = &Attention{Code: AttentionCode(rec.AttentionCode), Reason: rec.Attention}
	}
	if rec.VersionWaiting && info.Attention == nil {
		info.Attention = versionNotRun(rec.Name, rec.Version)
	}
	if rec.Mismatched && (info.Attention == nil || rec.State != store.OperationInProgress) {
		info.Attention = &Attention{Code: CodeReconciliationMismatch, Reason: "a reconciliation mismatch names the operation"}
	}
	if len(rec.Error) > 0 && rec.State == store.OperationFailed {
		info.Error = storedError(rec.Error)
	}
	if len(rec.Error) > 0 && rec.State == store.OperationInProgress {
		info.Compensating = storedError(rec.Error)
	}
	if len(rec.PriorError) > 0 && rec.State == store.OperationInProgress {
		info.PriorError = storedError(rec.PriorError)
	}
	return info
}

// storedError decodes an error stored with an operation.
func storedError(raw []byte) *PermanentError {
	pe := &PermanentError{}
	if err := json.Unmarshal(raw, pe); err != nil {
		pe = fault(CodeUnreadableError, "", string(raw))
	}
	return pe
}

func mapNotFound(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return ErrNotFound
	}
	return fmt.Errorf("engine: %w", err)
}
