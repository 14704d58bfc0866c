package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/store"
)

// Unrunnable is a group of unfinished operations that a process with a given
// set of definitions could not run: their version is not among them, or their
// version's definition lacks steps they still need.
type Unrunnable struct {
	// Name and Version are the operations' definition.
	Name    string
	Version int
	// Missing lists the steps they still need that the definition lacks;
	// empty when the set has no definition of Version at all.
	Missing []string
	// IDs are the operations, oldest first.
	IDs []uuid.UUID
}

// Reason says in a line why the operations cannot run.
func (u Unrunnable) Reason() string {
	if len(u.Missing) == 0 {
		return fmt.Sprintf("no definition of %s version %d", u.Name, u.Version)
	}
	return fmt.Sprintf("%s version %d lacks step(s) %s that they still need", u.Name, u.Version, strings.Join(u.Missing, ", "))
}

// check returns the unfinished operations in pool's database that a process
// running exactly defs could not run, grouped by definition and missing steps:
// the check to run before a deploy, with the definitions of the new binary.
// None means every unfinished operation can finish after the deploy. It reads
// every unfinished operation and its steps, once: it is for a deploy pipeline,
// not for the request path. It creates nothing and needs no migration lock.
func check(ctx context.Context, pool *pgxpool.Pool, defs []Definition) ([]Unrunnable, error) {
	byKey := make(map[defKey]*opDef, len(defs))
	for _, d := range defs {
		od := d.definition()
		byKey[od.key()] = od
	}
	ops, err := store.New().OperationListUnfinished(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("engine: check: %w", err)
	}
	type group struct {
		key     defKey
		missing string
	}
	var order []group
	found := map[group]*Unrunnable{}
	for _, op := range ops {
		missing, ok := runnable(byKey[defKey{op.Name, op.Version}], op)
		if ok {
			continue
		}
		g := group{defKey{op.Name, op.Version}, strings.Join(missing, "\x00")}
		u := found[g]
		if u == nil {
			u = &Unrunnable{Name: op.Name, Version: op.Version, Missing: missing}
			found[g] = u
			order = append(order, g)
		}
		u.IDs = append(u.IDs, op.ID)
	}
	if len(order) == 0 {
		return nil, nil
	}
	out := make([]Unrunnable, len(order))
	for i, g := range order {
		out[i] = *found[g]
	}
	return out, nil
}

// runnable tells whether def can run op, and when it cannot because def lacks
// steps, which: the same rule as a run's (see run.load): a step op still needs
// is one that has neither been compensated nor, unless op compensates,
// succeeded.
func runnable(def *opDef, op store.UnfinishedOperation) ([]string, bool) {
	if def == nil {
		return nil, false
	}
	var missing []string
	for _, name := range op.Steps {
		if _, ok := def.index[name]; ok {
			continue
		}
		done := slices.Contains(op.Compensated, name) || !op.Failing && slices.Contains(op.Succeeded, name)
		if !done {
			missing = append(missing, name)
		}
	}
	return missing, len(missing) == 0
}

// Check returns the unfinished operations in the database that this engine's
// definitions could not run, grouped by definition and missing steps. Before a
// deploy, an engine made by New with the new binary's definitions (and no
// workers started) tells whether every unfinished operation can finish after
// it. It reads every unfinished operation and its steps, once: it is for a
// deploy pipeline, not for the request path.
func (e *Engine) Check(ctx context.Context) ([]Unrunnable, error) {
	defs := make([]Definition, 0, len(e.defs))
	for _, k := range e.defKeys() {
		defs = append(defs, opDefinition{e.defs[k]})
	}
	return check(ctx, e.pool, defs)
}

// opDefinition is an erased definition as a Definition.
type opDefinition struct{ d *opDef }

func (o opDefinition) Name() string       { return o.d.name }
func (o opDefinition) Version() int       { return o.d.version }
func (o opDefinition) definition() *opDef { return o.d }
