package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/reconcile"
	"github.com/idemflow/idemflow/store"
)

// The books' side of a run: the succeeded steps of the operations created in
// the window, each checked for a record under its derived key among those the
// run listed (reconcile.MissingRecord).
const (
	// reconcileEdge is how far inside the window's start an operation must
	// have been created for its steps to be checked for records: the source's
	// clock may run behind the database's, and a record made just after the
	// operation would then be dated before the window. It is at most a
	// quarter of the window. An operation created at the edge is checked by
	// the runs before, while it was further inside.
	reconcileEdge = time.Minute
	// reconcileIDSkew is how far behind the database's clock a process's
	// may run and its operations still be read: operation ids are UUIDv7 of
	// the process's clock, and the books are read by id from the window's
	// start less this.
	reconcileIDSkew = 10 * time.Minute
	// reconcileBooksPage bounds a page of the books.
	reconcileBooksPage = 1000
	// maxReferenceLen bounds a reference kept in a checkpoint.
	maxReferenceLen = 255
)

// keySet is the set of record keys a run listed, kept as sorted hashes:
// 8 bytes a record, whatever the keys' length. A collision (about one run in
// 2^64 per pair) takes a step's missing record for listed: a mismatch not
// reported that run, never one made up.
type keySet struct {
	seed   maphash.Seed
	hashes []uint64
	sorted bool
}

func newKeySet() *keySet { return &keySet{seed: maphash.MakeSeed()} }

func (s *keySet) add(key string) {
	s.hashes = append(s.hashes, maphash.String(s.seed, key))
	s.sorted = false
}

func (s *keySet) has(key string) bool {
	if !s.sorted {
		slices.Sort(s.hashes)
		s.sorted = true
	}
	_, ok := slices.BinarySearch(s.hashes, maphash.String(s.seed, key))
	return ok
}

// bookStep is a step as the books hold it: its row, else its checkpoint in
// its operation's row.
type bookStep struct {
	state      store.StepState
	resolvedBy ResolvedBy
	// output is the operation's state after the step (a row's); reference
	// the reference a checkpoint kept.
	output      []byte
	reference   string
	succeededAt time.Time
}

// stepRows are step rows by operation and name.
type stepRows map[stepKey]store.ReconcileStep

func stepRowsOf(rows []store.ReconcileStep) stepRows {
	out := make(stepRows, len(rows))
	for _, r := range rows {
		out[stepKey{r.OperationID, r.Name}] = r
	}
	return out
}

// bookStep returns the step name of op as the books hold it: its row, which
// wins, else its checkpoint in op's row; false when neither exists.
func (rows stepRows) bookStep(op *store.ReconcileOperation, name string) (bookStep, bool) {
	if r, ok := rows[stepKey{op.ID, name}]; ok {
		bs := bookStep{state: r.State, resolvedBy: ResolvedBy(r.ResolvedBy), output: r.Output}
		if r.FinishedAt != nil {
			bs.succeededAt = *r.FinishedAt
		}
		return bs, true
	}
	if c, ok := op.Checkpoint(name); ok {
		return bookStep{state: store.StepSucceeded, resolvedBy: ResolvedBy(c.ResolvedBy), reference: c.Reference, succeededAt: c.SucceededAt}, true
	}
	return bookStep{}, false
}

// stepKey names a step of an operation.
type stepKey struct {
	id   uuid.UUID
	name string
}

// referenceOf is the reference that step st recorded in state, as its
// definition reads it (ExternalStepDef.Records): "" when it reads none, or
// its function panics (logged). It is made valid UTF-8 without NUL and
// bounded, so that a checkpoint can keep it.
func (e *Engine) referenceOf(st *stepDef, state any) (ref string) {
	if st.reference == nil {
		return ""
	}
	defer func() {
		if v := recover(); v != nil {
			e.logger.Error("a step's reference function panicked; no reference kept", slog.String("step", st.name), slog.Any("panic", v))
			ref = ""
		}
	}()
	ref = strings.ToValidUTF8(st.reference(state), "\uFFFD")
	ref = strings.ReplaceAll(ref, "\x00", "")
	if len(ref) > maxReferenceLen {
		ref = strings.ToValidUTF8(ref[:maxReferenceLen], "")
	}
	return ref
}

// bookedReference is the reference the books hold for a succeeded step of an
// operation of def (nil: another process's version): read from the state
// after the step by the definition, else kept in its checkpoint, else the
// one an operator gave resolving it.
func (e *Engine) bookedReference(def *opDef, step string, bs bookStep, operatorRef string) string {
	if def != nil && len(bs.output) > 0 {
		if i, ok := def.index[step]; ok && def.steps[i].reference != nil {
			if state, err := def.reloadState(bs.output); err == nil {
				if ref := e.referenceOf(def.steps[i], state); ref != "" {
					return ref
				}
			}
		}
	}
	if bs.reference != "" {
		return bs.reference
	}
	if bs.resolvedBy == ResolvedByOperator {
		return operatorRef
	}
	return ""
}

// resolvedByText names how a step's outcome was known, for a mismatch's
// detail: a checkpoint from before "r" was kept names none.
func resolvedByText(by ResolvedBy) string {
	if by == "" {
		return "its call or lookup"
	}
	return string(by)
}

// v7Floor is the least UUIDv7 of the millisecond of t: every id made from
// then on is greater.
func v7Floor(t time.Time) uuid.UUID {
	var id uuid.UUID
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(max(t.UnixMilli(), 0)))
	copy(id[:6], b[2:])
	return id
}

// createdAt is when the process that made the UUIDv7 id made it, on its
// clock; false for an id of another version.
func createdAt(id uuid.UUID) (time.Time, bool) {
	if id.Version() != 7 {
		return time.Time{}, false
	}
	sec, nsec := id.Time().UnixTime()
	return time.Unix(sec, nsec), true
}

// checkBooks checks the succeeded steps of the books whose records source
// lists (ExternalStepDef.Records) against the keys the run listed: those of
// the operations created within the window (past its edge, reconcileEdge)
// and finished, whose success is at least their outcome window old (a record
// may show in the source's list late). A step whose key was not listed is a
// reconcile.MissingRecord, kept with the reference the books hold. It returns
// how many steps it checked.
func (e *Engine) checkBooks(ctx context.Context, source string, run *store.ReconciliationRun, seen *keySet) (int64, error) {
	var names, stepNames []string
	for _, d := range e.defs {
		for _, sd := range d.steps {
			if sd.kind != StepKindExternal || sd.source != source {
				continue
			}
			if !slices.Contains(names, d.name) {
				names = append(names, d.name)
			}
			if !slices.Contains(stepNames, sd.name) {
				stepNames = append(stepNames, sd.name)
			}
		}
	}
	if len(names) == 0 {
		return 0, nil
	}
	slices.Sort(names)
	from := run.WindowStart.Add(min(reconcileEdge, run.StartedAt.Sub(run.WindowStart)/4))
	p := store.ReconcileBooksParams{After: v7Floor(from.Add(-reconcileIDSkew)), CreatedFrom: from, Names: names, Max: reconcileBooksPage}
	var checked int64
	for {
		ops, err := e.store.ReconcileBooks(ctx, e.pool, p)
		if err != nil {
			return checked, err
		}
		if len(ops) == 0 {
			return checked, nil
		}
		ids := make([]uuid.UUID, len(ops))
		for i := range ops {
			ids[i] = ops[i].ID
		}
		rows, err := e.store.ReconcileSteps(ctx, e.pool, ids, stepNames)
		if err != nil {
			return checked, err
		}
		steps := stepRowsOf(rows)
		var operatorIDs []uuid.UUID
		for _, r := range rows {
			if ResolvedBy(r.ResolvedBy) == ResolvedByOperator {
				operatorIDs = append(operatorIDs, r.OperationID)
			}
		}
		refs := map[uuid.UUID]string{}
		if len(operatorIDs) > 0 {
			if refs, err = e.store.ReconcileOperatorReferences(ctx, e.pool, operatorIDs); err != nil {
				return checked, err
			}
		}
		var found []store.Mismatch
		for i := range ops {
			op := &ops[i]
			def := e.def(op.Name, op.Version)
			if def == nil {
				continue // another process's version: its steps are not known here
			}
			for _, sd := range def.steps {
				if sd.kind != StepKindExternal || sd.source != source {
					continue
				}
				bs, ok := steps.bookStep(op, sd.name)
				if !ok || bs.state != store.StepSucceeded || bs.succeededAt.IsZero() ||
					bs.succeededAt.After(run.StartedAt.Add(-sd.settle)) {
					continue
				}
				checked++
				key := derivedKey(op.ID, op.KeySecret, op.Name, op.Scope, op.Key, sd.name)
				if seen.has(key) {
					continue
				}
				ref := e.bookedReference(def, sd.name, bs, refs[op.ID])
				under := ""
				if ref != "" {
					under = fmt.Sprintf(" under %q", ref)
				}
				found = append(found, store.Mismatch{
					RecordKey: key, Kind: string(reconcile.MissingRecord), Reference: ref, RecordCreatedAt: bs.succeededAt,
					OperationID: op.ID, Step: sd.name,
					Detail: fmt.Sprintf("the step %s succeeded%s at %s (resolved by %s); %s lists no record under its key",
						sd.name, under, bs.succeededAt.UTC().Format(time.RFC3339), resolvedByText(bs.resolvedBy), source),
				})
			}
		}
		if err := e.store.MismatchUpsert(ctx, e.pool, source, found); err != nil {
			return checked, err
		}
		if len(ops) < p.Max {
			return checked, nil
		}
		p.After = ops[len(ops)-1].ID
	}
}
