// Package opscli is the operator's command for any service that runs
// idemflow (cmd/idemflow, and demo ops for what it shares): it needs only the database's URL, none of the service's
// definitions, and creates nothing in the database.
//
//	idemflow [-database-url URL] list [-status S] [-name N] [-scope C] [-attention] [-older-than D] [-limit N]
//	idemflow [-database-url URL] show <operation id>
//	idemflow [-database-url URL] processes
//	idemflow [-database-url URL] check
//	idemflow [-database-url URL] mismatches
//	idemflow [-database-url URL] retry <operation id>
//	idemflow [-database-url URL] cancel <operation id> [reason]
//
// list, show, processes, check and mismatches read; mismatches lists what
// reconciliation found (the application's runs: it lists no provider itself). check lists the unfinished operations
// whose definition no live process runs, and exits 1 when there is any. retry
// and cancel record a request in the database that a live process running the
// operation's definition carries out (within a sweep); the command waits for it
// (-wait) and says what happened: exit 0 when it was done, 1 when it was
// refused (a cancel past the point of no return, say) or failed, 3 when no
// process carried it out in time (the request stays, and is carried out when a
// process that runs the definition comes). The URL defaults to DATABASE_URL.
//
// Knowing no definitions, the command cannot do what needs them: check judges
// by the definitions of the live processes (name and version), not by a
// build's (a definition that lacks a step an operation still needs, or a
// deploy's next build, takes the build itself: Engine.Check, such as demo ops
// check); and reconcile run (a run now) needs the application's sources, so it
// only says where to run it (Engine.Reconcile, such as demo ops reconcile
// run). show and mismatches name the runbook's section on each attention code
// and mismatch kind; what a process answered a request, and the audit trail,
// are printed without the URLs and addresses of its Go errors.
package opscli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/redact"
	"github.com/idemflow/idemflow/opsweb"
)

const usage = `usage: idemflow [-database-url URL] [-wait D] <command> [args]
commands:
  list [-status S] [-name N] [-scope C] [-attention] [-older-than D] [-limit N]
  show <operation id>
  processes
  check       (exit 1 when an unfinished operation's definition, name@version, runs in no live process:
               judged by the live processes, as this command knows no definitions; to check a build
               before a deploy, run the build's own check: Engine.Check, such as demo ops check)
  mismatches  (reconciliation's findings; exit 1 when there is any)
  reconcile run  (not here: a run needs the application's build; this says where to run it)
  retry [-force] <operation id>   (-force reopens one that failed with a server fault)
  cancel <operation id> [reason]
  resolve <operation id> made <reference> <reason> | resolve <operation id> not-made <reason>
  migrate-get  (the SQL of idemflow's migrations, for a team that applies them with its own tool; needs no database)
  approvals  (what waits for operators' approval, oldest first)
  approve <operation id> <reason> | reject <operation id> <reason>   (an operation that waits at its approval step)
Set -actor NAME (default $USER) to name yourself in the audit trail.`

// reconcileHere is the answer of reconcile run, which needs what this command
// does not have.
const reconcileHere = `idemflow: reconcile run needs the application's build: a run reads the outside service's
records through the application's reconciliation source (its provider client and credentials),
which this command, knowing none of the application's definitions, does not have. Run it where
the application is: demo ops reconcile run for the demo, the ops pages' "Run now", or the
application's own command or admin endpoint (Engine.Reconcile; the demo's POST
/admin/reconciliation/run). idemflow mismatches lists what the last run found.`

// RunbookURL is the runbook whose sections show and mismatches name: one per
// attention code and mismatch kind (opsweb links the same).
const RunbookURL = opsweb.DefaultRunbookURL

// runbook is the link to the runbook's section on code.
func runbook(code string) string { return RunbookURL + "#" + code }

// Exit statuses.
const (
	exitOK      = 0
	exitRefused = 1
	exitUsage   = 2
	exitPending = 3
)

// Run runs the command line args (without the program's name) and returns the
// exit status: 0 done, 1 refused or failed, 2 a usage error, 3 a request that no
// live process carried out in time. getenv reads DATABASE_URL.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idemflow", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, usage) }
	dbURL := fs.String("database-url", getenv("DATABASE_URL"), "the service's database (DATABASE_URL)")
	wait := fs.Duration("wait", 30*time.Second, "how long retry, cancel and resolve wait for a live process to carry them out")
	// Without $USER, the engine names its default actor, "operator".
	actor := fs.String("actor", getenv("USER"), "who the audit trail names for retry, cancel and resolve (default $USER)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.Arg(0) == "migrate-get" {
		return migrateGet(stdout, stderr)
	}
	if fs.Arg(0) == "reconcile" {
		fmt.Fprintln(stderr, reconcileHere)
		return exitUsage
	}
	if fs.NArg() == 0 || *dbURL == "" {
		fmt.Fprintln(stderr, usage)
		if *dbURL == "" {
			fmt.Fprintln(stderr, "idemflow: no database: give -database-url or DATABASE_URL")
		}
		return exitUsage
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "idemflow: %v\n", err)
		return exitUsage
	}
	defer pool.Close()
	admin, err := engine.NewAdmin(ctx, pool)
	if err != nil {
		fmt.Fprintf(stderr, "idemflow: %v\n", err)
		return exitRefused
	}
	ctx = engine.WithActor(ctx, *actor)
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	c := &commands{admin: admin, stdout: stdout, stderr: stderr, wait: *wait}
	switch cmd {
	case "list":
		return c.list(ctx, rest)
	case "show":
		return c.show(ctx, rest)
	case "processes":
		return c.processes(ctx)
	case "check":
		return c.check(ctx)
	case "mismatches":
		return c.mismatches(ctx)
	case "retry", "cancel", "resolve":
		return c.request(ctx, cmd, rest)
	case "approvals":
		return c.approvals(ctx)
	case "approve", "reject":
		return c.decide(ctx, cmd, rest)
	}
	fmt.Fprintf(stderr, "idemflow: unknown command %q\n%s\n", cmd, usage)
	return exitUsage
}

type commands struct {
	admin          *engine.Admin
	stdout, stderr io.Writer
	wait           time.Duration
}

func (c *commands) fail(err error) int {
	fmt.Fprintf(c.stderr, "idemflow: %v\n", err)
	return exitRefused
}

func (c *commands) list(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("idemflow list", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	status := fs.String("status", "", "in_progress, succeeded or failed")
	name := fs.String("name", "", "operation type")
	scope := fs.String("scope", "", "client scope")
	attention := fs.Bool("attention", false, "only unfinished operations that wait for an operator")
	older := fs.Duration("older-than", 0, "only operations created longer ago")
	limit := fs.Int("limit", 100, "at most this many, newest first")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	list, err := c.admin.List(ctx, &engine.ListOpts{Status: engine.Status(*status), Name: *name, Scope: *scope,
		NeedsAttention: *attention, OlderThan: *older, Max: *limit})
	if err != nil {
		return c.fail(err)
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tNAME\tVERSION\tSTATUS\tSCOPE/KEY\tCREATED\tNOTE")
	for _, i := range list {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s/%s\t%s\t%s\n", i.ID, i.Name, i.Version, i.Status, i.Scope, i.Key,
			i.CreatedAt.UTC().Format(time.RFC3339), note(i))
	}
	_ = w.Flush()
	return exitOK
}

// note says in a few words what an operator should know of i.
func note(i *engine.Info) string {
	var parts []string
	if i.Error != nil {
		parts = append(parts, string(i.Error.Code)+": "+i.Error.Error())
	}
	if i.NeedsAttention() {
		parts = append(parts, "needs attention: "+string(i.Attention.Code)+": "+i.Attention.Reason)
	}
	if i.Parked {
		parts = append(parts, "(parked: retry or cancel it)")
	}
	return strings.Join(parts, " ")
}

func (c *commands) operationID(args []string) (uuid.UUID, bool) {
	if len(args) == 0 {
		fmt.Fprintln(c.stderr, "idemflow: an operation id is required")
		return uuid.Nil, false
	}
	id, err := uuid.Parse(args[0])
	if err != nil {
		fmt.Fprintf(c.stderr, "idemflow: %q is not an operation id\n", args[0])
		return uuid.Nil, false
	}
	return id, true
}

func (c *commands) show(ctx context.Context, args []string) int {
	id, ok := c.operationID(args)
	if !ok {
		return exitUsage
	}
	i, err := c.admin.Get(ctx, id)
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintf(c.stdout, "operation %s\n  name %s, version %d, %s, key %s/%s, runs %d\n  created %s",
		i.ID, i.Name, i.Version, i.Status, i.Scope, i.Key, i.Runs, i.CreatedAt.UTC().Format(time.RFC3339))
	if i.FinishedAt != nil {
		fmt.Fprintf(c.stdout, ", finished %s", i.FinishedAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintln(c.stdout)
	if n := note(i); n != "" {
		fmt.Fprintf(c.stdout, "  %s\n", n)
	}
	if i.NeedsAttention() {
		fmt.Fprintf(c.stdout, "  runbook: %s\n", runbook(string(i.Attention.Code)))
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  STEP\tSTATUS\tATTEMPTS\tRESOLVED BY\tDERIVED KEY\tLAST CAUSE")
	for _, s := range i.Steps {
		fmt.Fprintf(w, "  %s\t%s\t%d\t%s\t%s\t%s\n", s.Name, s.Status, s.Attempts, s.ResolvedBy, s.DerivedKey, s.LastCause)
	}
	_ = w.Flush()
	if len(i.Audit) > 0 {
		fmt.Fprintln(c.stdout, "  audit:")
		w = tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "  AT\tACTION\tACTOR\tRESULT\tREASON\tDETAIL")
		for _, a := range i.Audit {
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\n", a.At.UTC().Format(time.RFC3339), a.Action, a.Actor, a.Result, a.Reason, redact.Addresses(a.Detail))
		}
		_ = w.Flush()
	}
	if len(i.Mismatches) > 0 {
		fmt.Fprintln(c.stdout, "  reconciliation mismatches:")
		c.printMismatches(i.Mismatches, "  ")
	}
	return exitOK
}

// mismatches lists reconciliation's findings, every one, oldest first; exit
// 1 when there is any.
func (c *commands) mismatches(ctx context.Context) int {
	var ms []engine.Mismatch
	opts := &engine.MismatchListOpts{Limit: 1000}
	for {
		page, err := c.admin.MismatchList(ctx, opts)
		if err != nil {
			return c.fail(err)
		}
		ms = append(ms, page.Mismatches...)
		if page.Next == "" {
			break
		}
		opts.After = page.Next
	}
	if len(ms) == 0 {
		fmt.Fprintln(c.stdout, "no reconciliation mismatches")
		return exitOK
	}
	c.printMismatches(ms, "")
	return exitRefused
}

func (c *commands) printMismatches(ms []engine.Mismatch, indent string) {
	writeMismatches(c.stdout, ms, indent)
}

// writeMismatches writes ms as a table, then the runbook's section on each of
// their kinds.
func writeMismatches(out io.Writer, ms []engine.Mismatch, indent string) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "%sSOURCE\tKIND\tKEY\tREFERENCE\tAMOUNT\tSTATUS\tOPERATION\tLAST SEEN\tDETAIL\n", indent)
	for _, m := range ms {
		op := "-"
		if m.OperationID != uuid.Nil {
			op = m.OperationID.String()
		}
		fmt.Fprintf(w, "%s%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", indent, m.Source, m.Kind, m.Key, m.Reference, m.Amount,
			m.RecordStatus, op, m.LastSeen.UTC().Format(time.RFC3339), m.Detail)
	}
	_ = w.Flush()
	var kinds []string
	for _, m := range ms {
		if k := string(m.Kind); !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
			fmt.Fprintf(out, "%srunbook for %s: %s\n", indent, k, runbook(k))
		}
	}
}

// PrintReport writes a reconciliation run's report to w: what it read, then
// its mismatches as the mismatches command lists them. It is for a command
// that runs reconciliation with the application's sources (demo ops
// reconcile run).
func PrintReport(w io.Writer, rep *engine.ReconcileReport) {
	fmt.Fprintf(w, "source %s: %d record(s) made since %s checked, in %d page(s); %d not yet judged, %d unverifiable, %d expired; %d succeeded step(s) checked for a record\n",
		rep.Source, rep.Checked, rep.WindowStart.UTC().Format(time.RFC3339), rep.Pages, rep.NotYet, rep.Unverifiable, rep.Expired, rep.StepsChecked)
	if rep.Total == 0 {
		fmt.Fprintln(w, "no reconciliation mismatches")
		return
	}
	if rep.Truncated {
		fmt.Fprintf(w, "%d mismatch(es), the first %d below (idemflow mismatches lists them all):\n", rep.Total, len(rep.Mismatches))
	} else {
		fmt.Fprintf(w, "%d mismatch(es):\n", rep.Total)
	}
	writeMismatches(w, rep.Mismatches, "")
}

func (c *commands) processes(ctx context.Context) int {
	procs, err := c.admin.Processes(ctx)
	if err != nil {
		return c.fail(err)
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tHOST\tPID\tSTARTED\tSEEN\tDEFINITIONS")
	for _, p := range procs {
		var defs []string
		for _, d := range p.Definitions {
			defs = append(defs, d.String())
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", p.ID, p.Host, p.PID, p.StartedAt.UTC().Format(time.RFC3339),
			p.SeenAt.UTC().Format(time.RFC3339), strings.Join(defs, ","))
	}
	_ = w.Flush()
	return exitOK
}

func (c *commands) check(ctx context.Context) int {
	found, err := c.admin.Check(ctx)
	if err != nil {
		return c.fail(err)
	}
	n := 0
	for _, u := range found {
		for _, id := range u.IDs {
			fmt.Fprintf(c.stdout, "%s %s %d\n", id, u.Name, u.Version)
			n++
		}
	}
	if n > 0 {
		fmt.Fprintf(c.stderr, "idemflow check: %d unfinished operation(s) whose definition no live process runs\n", n)
		return exitRefused
	}
	return exitOK
}

func (c *commands) request(ctx context.Context, action string, args []string) int {
	force := false
	if action == "retry" && len(args) > 0 && (args[0] == "-force" || args[0] == "--force") {
		force, args = true, args[1:]
	}
	id, ok := c.operationID(args)
	if !ok {
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, c.wait)
	defer cancel()
	var info *engine.Info
	var err error
	switch action {
	case "retry":
		info, err = c.admin.Retry(ctx, id, &engine.RetryOpts{Force: force})
	case "resolve":
		res, ok := parseResolution(args[1:])
		if !ok {
			fmt.Fprintf(c.stderr, "idemflow: resolve <operation id> made <reference> <reason>, or resolve <operation id> not-made <reason>\n%s\n", usage)
			return exitUsage
		}
		info, err = c.admin.Resolve(ctx, id, res)
	default:
		info, err = c.admin.Cancel(ctx, id, strings.Join(args[1:], " "))
	}
	switch {
	case errors.Is(err, engine.ErrNotCarriedOut):
		fmt.Fprintf(c.stderr, "idemflow: %s: no live process carried it out within %s; it will be when a process that runs the operation's definition does (idemflow processes)\n",
			redact.Addresses(err.Error()), c.wait)
		return exitPending
	case err != nil:
		// The process's refusal, with its code when it is one, without the
		// addresses its errors name (its log has them).
		what := "refused"
		if why := engine.Refusal(""); errors.As(err, &why) {
			what += " (" + string(why) + ")"
		}
		fmt.Fprintf(c.stderr, "idemflow: %s %s: %s: %s\n", action, id, what, redact.Addresses(err.Error()))
		return exitRefused
	}
	return c.done(action, id, info)
}

// approvals lists what waits for operators' approval.
func (c *commands) approvals(ctx context.Context) int {
	list, err := c.admin.Approvals(ctx, 0)
	if err != nil {
		return c.fail(err)
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tNAME\tSCOPE/KEY\tSTEP\tREQUESTED\tEXPIRES\tAPPROVED")
	for _, a := range list {
		expires := "never"
		if a.ExpiresAt != nil {
			expires = a.ExpiresAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%s\t%s\t%s/%s\t%s\t%s\t%s\t%d of %d %s\n", a.OperationID, a.Name, a.Scope, a.Key, a.Step,
			a.RequestedAt.UTC().Format(time.RFC3339), expires, len(a.ApprovedBy), a.Need, strings.Join(a.ApprovedBy, ","))
	}
	_ = w.Flush()
	return exitOK
}

// decide approves or rejects an operation that waits at its approval step:
// at once, since it needs no definition; a live process carries the
// operation on within a sweep.
func (c *commands) decide(ctx context.Context, action string, args []string) int {
	id, ok := c.operationID(args)
	if !ok {
		return exitUsage
	}
	reason := strings.TrimSpace(strings.Join(args[1:], " "))
	decide := c.admin.Approve
	if action == "reject" {
		decide = c.admin.Reject
	}
	info, err := decide(ctx, id, reason)
	if err != nil {
		return c.fail(err)
	}
	return c.done(action, id, info)
}

// done says what an operator's request did: the audit trail's last entry of
// its action, without the addresses its text may name (the log has them).
func (c *commands) done(action string, id uuid.UUID, info *engine.Info) int {
	detail := ""
	for _, a := range info.Audit {
		if string(a.Action) == action {
			detail = a.Detail
		}
	}
	fmt.Fprintf(c.stdout, "%s %s: done: %s (%s)\n", action, id, redact.Addresses(detail), info.Status)
	return exitOK
}

// parseResolution reads "made <reference> <reason...>" or "not-made
// <reason...>".
func parseResolution(args []string) (engine.Resolution, bool) {
	switch {
	case len(args) >= 3 && args[0] == "made":
		return engine.Resolution{Made: true, Reference: args[1], Reason: strings.Join(args[2:], " ")}, true
	case len(args) >= 2 && args[0] == "not-made":
		return engine.Resolution{Reason: strings.Join(args[1:], " ")}, true
	}
	return engine.Resolution{}, false
}
