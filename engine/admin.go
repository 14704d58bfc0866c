package engine

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/store"
)

// Admin is an operator's handle on a database that idemflow runs in, for a
// command or a page that has none of the service's definitions: it lists and
// reads operations, checks the unfinished ones against the definitions of the
// live processes, and asks those processes to retry or cancel one. It creates
// nothing: NewAdmin refuses a database that is not migrated. Make one with
// NewAdmin; it is safe for concurrent use.
type Admin struct {
	pool  *pgxpool.Pool
	store *store.Store
	// reader reads operations as an engine with no definitions does.
	reader *Engine
}

// NewAdmin returns an Admin on pool's database, or an error when the database
// lacks idemflow's tables (ErrNotMigrated is matched by it) or cannot be
// reached.
func NewAdmin(ctx context.Context, pool *pgxpool.Pool) (*Admin, error) {
	if err := checkSchema(ctx, pool); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	st := store.New()
	return &Admin{pool: pool, store: st, reader: &Engine{pool: pool, control: pool, store: st, logger: slog.Default()}}, nil
}

// List lists operations, as Engine.List does.
func (a *Admin) List(ctx context.Context, opts *ListOpts) ([]*Info, error) {
	return a.reader.List(ctx, opts)
}

// Get reads an operation with its steps. Without the definition, a step's Kind
// is empty and its DerivedKey is given for every step.
func (a *Admin) Get(ctx context.Context, id uuid.UUID) (*Info, error) { return a.reader.Get(ctx, id) }

// Mismatches lists the reconciliation mismatches of every source, as
// Engine.Mismatches does (runs are the application's: an Admin has no
// sources).
func (a *Admin) Mismatches(ctx context.Context) ([]Mismatch, error) { return a.reader.Mismatches(ctx) }

// MismatchList lists a page of the reconciliation mismatches, as
// Engine.MismatchList does.
func (a *Admin) MismatchList(ctx context.Context, opts *MismatchListOpts) (*MismatchListResult, error) {
	return a.reader.MismatchList(ctx, opts)
}

// Process is a live process that runs an engine with workers.
type Process struct {
	ID   uuid.UUID
	Host string
	PID  int
	// Definitions are the definitions it runs.
	Definitions []DefinitionName
	StartedAt   time.Time
	SeenAt      time.Time
}

// DefinitionName names a definition: an operation type's name and version.
type DefinitionName struct {
	Name    string
	Version int
}

func (d DefinitionName) String() string { return d.Name + "@" + strconv.Itoa(d.Version) }

func parseDefinitionName(s string) DefinitionName {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '@' {
			v, _ := strconv.Atoi(s[i+1:])
			return DefinitionName{Name: s[:i], Version: v}
		}
	}
	return DefinitionName{Name: s}
}

// Processes lists the live processes (seen within three of their leases)
// that run workers, oldest first.
func (a *Admin) Processes(ctx context.Context) ([]Process, error) {
	rows, err := a.store.ProcessListLive(ctx, a.pool)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	out := make([]Process, len(rows))
	for i, r := range rows {
		p := Process{ID: r.ID, Host: r.Host, PID: r.PID, StartedAt: r.StartedAt, SeenAt: r.SeenAt}
		for _, d := range r.Definitions {
			p.Definitions = append(p.Definitions, parseDefinitionName(d))
		}
		out[i] = p
	}
	return out, nil
}

// Check returns the unfinished operations whose definition (name and version)
// no live process runs: they wait until one does. (Whether a definition lacks
// a step an operation needs takes the definitions themselves: see Check.)
func (a *Admin) Check(ctx context.Context) ([]Unrunnable, error) {
	procs, err := a.Processes(ctx)
	if err != nil {
		return nil, err
	}
	live := map[DefinitionName]bool{}
	for _, p := range procs {
		for _, d := range p.Definitions {
			live[d] = true
		}
	}
	ops, err := a.store.OperationListUnfinished(ctx, a.pool)
	if err != nil {
		return nil, fmt.Errorf("engine: check: %w", err)
	}
	var out []Unrunnable
	index := map[DefinitionName]int{}
	for _, op := range ops {
		d := DefinitionName{op.Name, op.Version}
		if live[d] {
			continue
		}
		i, ok := index[d]
		if !ok {
			i = len(out)
			index[d] = i
			out = append(out, Unrunnable{Name: op.Name, Version: op.Version})
		}
		out[i].IDs = append(out[i].IDs, op.ID)
	}
	return out, nil
}

// Retry asks the live processes to retry the operation id, as Engine.Retry
// does, waits until one has, and returns what Engine.Retry returns there: the
// operation, or the refusal (ErrFinal, ErrNotFailed, ...). When ctx ends first
// it returns an error matching ErrNotCarriedOut: the request stays, and is carried
// out when a process that runs the operation's definition comes. opts may be
// nil.
func (a *Admin) Retry(ctx context.Context, id uuid.UUID, opts *RetryOpts) (*Info, error) {
	o := RetryOpts{}
	if opts != nil {
		o = *opts
	}
	return a.request(ctx, store.OperatorRequest{OperationID: id, Action: string(ActionRetry), Reason: o.Reason, Force: o.Force})
}

// Resolve asks the live processes to resolve the operation id, as
// Engine.Resolve does, and returns as Retry does.
func (a *Admin) Resolve(ctx context.Context, id uuid.UUID, res Resolution) (*Info, error) {
	if res.Reason == "" {
		return nil, refusedOf(id, fmt.Errorf("engine: resolve %s: %w: a reason is required", id, ErrInvalidResolution))
	}
	made := res.Made
	return a.request(ctx, store.OperatorRequest{OperationID: id, Action: string(ActionResolve), Reason: res.Reason, Made: &made, Reference: res.Reference})
}

// Approve approves the operation id, which waits at its ApprovalStep, as
// Engine.Approve does: at once, since it needs no definition. Its resume is
// left to the live processes' sweepers (within their SweepInterval).
func (a *Admin) Approve(ctx context.Context, id uuid.UUID, reason string) (*Info, error) {
	return a.reader.Approve(ctx, id, reason)
}

// Reject rejects the operation id, which waits at its ApprovalStep, as
// Engine.Reject does.
func (a *Admin) Reject(ctx context.Context, id uuid.UUID, reason string) (*Info, error) {
	return a.reader.Reject(ctx, id, reason)
}

// Approvals lists the operations that wait for approvals, as
// Engine.Approvals does.
func (a *Admin) Approvals(ctx context.Context, limit int) ([]AwaitingApproval, error) {
	return a.reader.Approvals(ctx, limit)
}

// Cancel asks the live processes to cancel the operation id, as Engine.Cancel
// does (refused past its point of no return), and returns as Retry does.
func (a *Admin) Cancel(ctx context.Context, id uuid.UUID, reason string) (*Info, error) {
	return a.request(ctx, store.OperatorRequest{OperationID: id, Action: string(ActionCancel), Reason: reason})
}

// InProgress reads the operations in progress of each type, as
// Engine.InProgress does (Runnable is false for every type: an Admin runs
// none).
func (a *Admin) InProgress(ctx context.Context) ([]InProgress, error) {
	return a.reader.InProgress(ctx)
}

// Reconciliation reads the last report of a source, as Engine.Reconciliation
// does: an Admin has no sources, so it answers ErrUnknownSource.
func (a *Admin) Reconciliation(ctx context.Context, source string) (*ReconcileReport, error) {
	return a.reader.Reconciliation(ctx, source)
}

// Reconcile answers ErrUnknownSource: a run needs the application's source,
// which an Admin does not have.
func (a *Admin) Reconcile(ctx context.Context, source string) (*ReconcileReport, error) {
	return a.reader.Reconcile(ctx, source)
}

// request records an operator's request, by ctx's actor (WithActor), waits
// until a process has carried it out, and returns what the process's call
// returned: the operation, or its refusal.
func (a *Admin) request(ctx context.Context, r store.OperatorRequest) (*Info, error) {
	id := r.OperationID
	if _, err := a.store.OperationGet(ctx, a.pool, id); err != nil {
		return nil, refusedOf(id, mapNotFound(err))
	}
	r.Actor = actorOf(ctx)
	reqID, err := a.store.OperatorRequestInsert(ctx, a.pool, r)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	delay := 20 * time.Millisecond
	for {
		done, err := a.store.OperatorRequestGet(context.WithoutCancel(ctx), a.pool, reqID)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		if done.DoneAt != nil {
			switch done.Outcome {
			case "done":
				return a.reader.Get(context.WithoutCancel(ctx), id)
			case "refused":
				return nil, refused(id, done.Code, done.Message)
			}
			return nil, fmt.Errorf("engine: %s %s: the process that carried it out failed: %s", r.Action, id, done.Message)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("engine: %s %s: request %d: %w", r.Action, id, reqID, ErrNotCarriedOut)
		case <-time.After(delay):
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

// operatorBatch bounds the requests one sweep carries out.
const operatorBatch = 10

// definitionNames are this engine's definitions as the database records them.
func (e *Engine) definitionNames() []string {
	out := []string{} // never NULL in the database
	for _, k := range e.defKeys() {
		out = append(out, DefinitionName{k.name, k.version}.String())
	}
	return out
}

// heartbeat records this process, with its definitions, for operators.
func (e *Engine) heartbeat(ctx context.Context) error {
	host, _ := os.Hostname()
	return e.store.ProcessUpsert(ctx, e.control, store.Process{
		ID: e.processID, Host: host, PID: os.Getpid(), Definitions: e.definitionNames(), Lease: e.cfg.Lease,
	})
}

// serveOperators carries out the operators' pending requests for operations
// of this process's definitions.
func (e *Engine) serveOperators(ctx context.Context) error {
	if _, err := e.store.OperatorRequestFailUnknown(ctx, e.control); err != nil {
		return err
	}
	reqs, err := e.store.OperatorRequestTake(ctx, e.control, e.processID, e.definitionNames(), e.cfg.Lease, operatorBatch)
	if err != nil {
		return err
	}
	ids := make([]int64, len(reqs))
	for i, r := range reqs {
		ids[i] = r.ID
	}
	stopRenewing := e.keepRequests(ctx, ids)
	defer stopRenewing()
	for _, r := range reqs {
		outcome, message := "done", ""
		var err error
		// The request's row is its audit entry: the engine records no other.
		ctx := context.WithValue(WithActor(ctx, r.Actor), auditedKey{}, true)
		switch Action(r.Action) {
		case ActionRetry:
			if _, err = e.Retry(ctx, r.OperationID, &RetryOpts{Force: r.Force, Reason: r.Reason}); err == nil {
				message = "reopened; it runs again"
			}
		case ActionCancel:
			var info *Info
			if info, err = e.Cancel(ctx, r.OperationID, r.Reason); err == nil {
				message = "cancelled: " + string(info.Status)
			}
		case ActionResolve:
			res := Resolution{Made: r.Made != nil && *r.Made, Reference: r.Reference, Reason: r.Reason}
			if _, err = e.Resolve(ctx, r.OperationID, res); err == nil {
				message = "resolved: the call was not made"
				if res.Made {
					message = "resolved: the call was made"
				}
			}
		default:
			err = fmt.Errorf("unknown action %q", r.Action)
		}
		code := refusalCode(err)
		if err != nil {
			outcome, message = "failed", err.Error()
			if code != "" {
				outcome = "refused"
			}
		}
		e.logger.InfoContext(ctx, "operator request carried out", slog.Int64("request", r.ID),
			slog.String("operation_id", r.OperationID.String()), slog.String("action", r.Action),
			slog.String("outcome", outcome), slog.String("message", message))
		if err := e.store.OperatorRequestFinish(context.WithoutCancel(ctx), e.control, r.ID, e.processID, outcome, message, code); err != nil {
			return err
		}
	}
	return nil
}

// keepRequests keeps the requests ids taken by this process, renewing those
// not finished every third of a lease, until the returned function is called:
// a cancel whose compensations outlast a lease, and the requests taken with it
// that wait for it, are not taken again by another process, which would find
// the operation running and record the request refused, or carry it out too.
func (e *Engine) keepRequests(ctx context.Context, ids []int64) (stop func()) {
	if len(ids) == 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(e.cfg.Lease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := e.store.OperatorRequestRenew(ctx, e.control, ids, e.processID); err != nil && ctx.Err() == nil {
					e.logger.WarnContext(ctx, "could not renew operator requests; another process may take them", slog.Any("error", err))
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// Operator is what operators do to operations, whichever handle they hold:
// an Engine, in a process of the service, or an Admin, with none of its
// definitions (its requests to retry, cancel and resolve are carried out by a
// live process of the service, and answered the same). opsweb serves either.
type Operator interface {
	Get(ctx context.Context, id uuid.UUID) (*Info, error)
	List(ctx context.Context, opts *ListOpts) ([]*Info, error)
	InProgress(ctx context.Context) ([]InProgress, error)
	Approvals(ctx context.Context, limit int) ([]AwaitingApproval, error)
	Mismatches(ctx context.Context) ([]Mismatch, error)
	MismatchList(ctx context.Context, opts *MismatchListOpts) (*MismatchListResult, error)
	Reconciliation(ctx context.Context, source string) (*ReconcileReport, error)
	Reconcile(ctx context.Context, source string) (*ReconcileReport, error)
	Retry(ctx context.Context, id uuid.UUID, opts *RetryOpts) (*Info, error)
	Cancel(ctx context.Context, id uuid.UUID, reason string) (*Info, error)
	Resolve(ctx context.Context, id uuid.UUID, res Resolution) (*Info, error)
	Approve(ctx context.Context, id uuid.UUID, reason string) (*Info, error)
	Reject(ctx context.Context, id uuid.UUID, reason string) (*Info, error)
}

var (
	_ Operator = (*Engine)(nil)
	_ Operator = (*Admin)(nil)
)
