package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/cmd/internal/opscli"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/redact"
	"github.com/idemflow/idemflow/workflows/refund"
)

const opsUsage = `usage: demo ops [flags] list [in_progress|succeeded|failed]   (default failed)
       demo ops [flags] retry [-force] <operation id>   (-force reopens one that failed with a server fault)
       demo ops [flags] cancel <operation id> [reason]
       demo ops [flags] resolve <operation id> made <provider refund id> <reason>
       demo ops [flags] resolve <operation id> not-made <reason>
       demo ops [flags] approve <operation id> <reason>   (a refund of version 3 that waits for approval)
       demo ops [flags] reject <operation id> <reason>
       demo ops [flags] approvals   (the refunds that wait for approval, oldest first)
-actor NAME (default $USER, else operator) is who the audit trail names for retry, cancel, resolve, approve and reject.
       demo ops [flags] check   (exit status 1 when a process with -refund-versions could not run some unfinished
                                operation: judged by this build's definitions, whether or not a process runs)
       demo ops [flags] reconcile run   (checks the books against the provider at -provider-url now and prints
                                the report; exit status 1 when there is a mismatch)
       demo ops [flags] show <operation id>
       demo ops [flags] processes
       demo ops [flags] mismatches
(show, processes and mismatches are the idemflow command's, which any service can use: go run ./cmd/idemflow;
what each attention code and mismatch kind means, and what to do: docs/runbook.md)`

// opsCommands are the commands of demo ops: the first of its arguments that
// is one ends the flags.
var opsCommands = []string{"list", "retry", "cancel", "resolve", "approve", "reject", "approvals", "check", "reconcile", "show", "processes", "mismatches"}

// runOps is the operator's command line: list operations by status, retry a
// failed one (a running demo's workers pick it up), cancel one that no live
// process holds (its compensations run here), or resolve one; approve or
// reject a refund that waits for approval (a running demo goes on with it),
// and list those that wait; check the
// unfinished operations against this build's definitions (-refund-versions),
// and run reconciliation against the provider (-provider-url). It has the
// demo's definitions and provider, so it needs no live process for any of
// that. It uses the demo's database flags, and only a database that runs
// already: it starts, creates and migrates nothing.
func runOps(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, logger *slog.Logger) int {
	var flagArgs, rest []string
	for i, a := range args {
		if slices.Contains(opsCommands, a) {
			flagArgs, rest = args[:i], args[i:]
			break
		}
	}
	actor, flagArgs, err := actorFlag(flagArgs, getenv)
	if err != nil {
		fmt.Fprintf(stderr, "demo ops: %v\n%s\n", err, opsUsage)
		return 2
	}
	ctx = engine.WithActor(ctx, actor)
	if len(rest) == 0 {
		fmt.Fprintln(stderr, opsUsage)
		return 2
	}
	cfg, err := parseConfig("demo ops", flagArgs, getenv, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "demo ops: %v\n", err)
		return 2
	}
	if err := ops(ctx, cfg, rest, stdout, logger); err != nil {
		if errors.Is(err, errUnrunnable) {
			fmt.Fprintf(stderr, "demo ops check: %v\n", err)
			return 1
		}
		if errors.Is(err, errMismatches) {
			fmt.Fprintf(stderr, "demo ops reconcile run: %v\n", err)
			return 1
		}
		fmt.Fprintf(stderr, "demo ops: %v\n", err)
		return 1
	}
	return 0
}

func ops(ctx context.Context, cfg *config, args []string, stdout io.Writer, logger *slog.Logger) error {
	pool, err := openRunningDatabase(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	// A database the demo never migrated is not the demo's: say so, change
	// nothing.
	admin, err := engine.NewAdmin(ctx, pool)
	if err != nil {
		return err
	}
	providerURL := cfg.providerURL
	if providerURL == "" {
		providerURL = "http://" + cfg.addr + "/provider"
	}
	wf, err := refund.New(&refund.ProviderClient{BaseURL: providerURL, HTTP: providerHTTP(cfg)}, refundConfig(cfg))
	if err != nil {
		return err
	}
	// The server's retention and reconciliation source, run only when
	// asked (reconcile run): an engine without workers runs nothing alone.
	rc := reconcileConfig(cfg, providerURL)
	rc.Interval = -1
	e, err := engine.New(pool, &engine.Config{Operations: wf.Operations(), Logger: logger, Lease: cfg.lease,
		Retention: cfg.retention, Reconcile: rc})
	if err != nil {
		return err
	}
	defer func() { _ = e.Stop(context.WithoutCancel(ctx)) }()

	out := json.NewEncoder(stdout)
	out.SetIndent("", "  ")
	switch args[0] {
	case "list":
		status := engine.StatusFailed
		if len(args) > 1 {
			status = engine.Status(args[1])
		}
		list, err := e.List(ctx, &engine.ListOpts{Status: status})
		if err != nil {
			return err
		}
		for _, info := range list {
			line := fmt.Sprintf("%s  %-7s %-11s %s/%s", info.ID, info.Name, info.Status, info.Scope, info.Key)
			if info.Error != nil {
				line += "  " + info.Error.Error()
			}
			if info.NeedsAttention() {
				line += "  needs attention: " + string(info.Attention.Code) + ": " + info.Attention.Reason
				if info.Parked {
					line += " (parked: retry or cancel it)"
				}
			}
			fmt.Fprintln(stdout, line)
		}
		return nil
	case "show", "processes", "mismatches":
		// The idemflow command's, on the demo's database: it needs none of
		// the demo's definitions.
		args := append([]string{"-database-url", pool.Config().ConnString()}, args...)
		if code := opscli.Run(ctx, args, func(string) string { return "" }, stdout, os.Stderr); code != 0 {
			return fmt.Errorf("%s: exit status %d", args[2], code)
		}
		return nil
	case "reconcile":
		if len(args) != 2 || args[1] != "run" {
			return fmt.Errorf("reconcile takes one word, run\n%s", opsUsage)
		}
		rep, err := e.Reconcile(ctx, refund.ProviderSource)
		if err != nil {
			return withheld(err)
		}
		opscli.PrintReport(stdout, rep)
		if n := rep.Total; n > 0 {
			return fmt.Errorf("%w: %d; what each kind means and what to do: docs/runbook.md", errMismatches, n)
		}
		return nil
	case "check":
		// By this build's definitions (Engine.Check), not by the live
		// processes' (the idemflow command's check): it works with no
		// process running, before a deploy.
		found, err := e.Check(ctx)
		if err != nil {
			return err
		}
		n := 0
		for _, u := range found {
			for _, id := range u.IDs {
				fmt.Fprintf(stdout, "%s %s %d\n", id, u.Name, u.Version)
				n++
			}
		}
		if n > 0 {
			var why []string
			for _, u := range found {
				why = append(why, fmt.Sprintf("%d: %s", len(u.IDs), u.Reason()))
			}
			return fmt.Errorf("%w: %d unfinished operation(s) that refund versions %v could not run (%s)", errUnrunnable, n, cfg.versions, strings.Join(why, "; "))
		}
		return nil
	case "resolve":
		return resolveOp(ctx, e, args[1:], out)
	case "approve", "reject":
		return decideOp(ctx, admin, args, out)
	case "approvals":
		list, err := refund.ListApprovals(ctx, pool, admin, 0)
		if err != nil {
			return err
		}
		for _, a := range list {
			expires := "never"
			if a.ExpiresAt != nil {
				expires = a.ExpiresAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(stdout, "%s  %s %s %d  requested %s, expires %s, approved by %d of %d: %s\n", a.OperationID, a.Client, a.OrderID, a.Amount,
				a.RequestedAt.UTC().Format(time.RFC3339), expires, len(a.ApprovedBy), a.Need, strings.Join(a.ApprovedBy, ", "))
		}
		return nil
	case "retry", "cancel":
		force := false
		if args[0] == "retry" && len(args) > 1 && (args[1] == "-force" || args[1] == "--force") {
			force, args = true, append([]string{args[0]}, args[2:]...)
		}
		if len(args) < 2 {
			return fmt.Errorf("%s needs an operation id\n%s", args[0], opsUsage)
		}
		id, err := uuid.Parse(args[1])
		if err != nil {
			return fmt.Errorf("%q is not an operation id: %w", args[1], err)
		}
		if args[0] == "retry" {
			if _, err := e.Retry(ctx, id, &engine.RetryOpts{Force: force}); err != nil {
				return withheld(err)
			}
			fmt.Fprintf(stdout, "operation %s reopened; a running demo resumes it\n", id)
			return nil
		}
		reason := strings.Join(args[2:], " ")
		info, err := e.Cancel(ctx, id, reason)
		if err != nil {
			return withheld(err)
		}
		return out.Encode(map[string]any{"operationId": info.ID, "status": info.Status, "error": info.Error})
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], opsUsage)
}

// errUnrunnable is what demo ops check reports when it found operations that
// the given versions could not run.
var errUnrunnable = errors.New("not runnable")

// errMismatches is what demo ops reconcile run reports when the run found
// mismatches.
var errMismatches = errors.New("reconciliation mismatches")

// withheld is an error of the engine as demo ops prints it: its text without
// the URLs and addresses its Go errors name (the provider's, of a lookup that
// halted, or of its list), which the log has.
func withheld(err error) error {
	return errors.New(redact.Addresses(err.Error()))
}

// actorFlag takes -actor NAME (or -actor=NAME) out of the flags: who the audit
// trail names. It defaults to the USER variable, else (empty) to the
// engine's default actor, "operator".
func actorFlag(args []string, getenv func(string) string) (string, []string, error) {
	actor := getenv("USER")
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-actor" || a == "--actor":
			if i+1 >= len(args) || args[i+1] == "" {
				return "", nil, errors.New("-actor needs a name")
			}
			actor = args[i+1]
			i++
		case strings.HasPrefix(a, "-actor=") || strings.HasPrefix(a, "--actor="):
			actor = a[strings.Index(a, "=")+1:]
			if actor == "" {
				return "", nil, errors.New("-actor needs a name")
			}
		default:
			rest = append(rest, a)
		}
	}
	return actor, rest, nil
}

// decideOp is demo ops approve|reject <id> <reason...>: by the -actor, on
// engine.Admin, which needs no definitions (a running demo's sweeper resumes
// the refund). A refusal is an error that names its code, as the API's 409.
func decideOp(ctx context.Context, admin *engine.Admin, args []string, out *json.Encoder) error {
	if len(args) < 2 {
		return fmt.Errorf("%s needs an operation id and a reason\n%s", args[0], opsUsage)
	}
	// Without a reason, the engine refuses it, and the audit trail says so.
	id, err := uuid.Parse(args[1])
	if err != nil {
		return fmt.Errorf("%q is not an operation id: %w", args[1], err)
	}
	reason := strings.TrimSpace(strings.Join(args[2:], " "))
	decide := admin.Approve
	if args[0] == "reject" {
		decide = admin.Reject
	}
	info, err := decide(ctx, id, reason)
	switch {
	case errors.Is(err, engine.ErrWaitOver), errors.Is(err, engine.ErrFinished):
		return fmt.Errorf("refused (operation_final): %w", withheld(err))
	case errors.Is(err, engine.ErrNotAwaitingApproval):
		return fmt.Errorf("refused (not_awaiting_approval): %w", withheld(err))
	case err != nil:
		return withheld(err)
	}
	// What the audit trail says of it: the last entry of this action.
	detail := ""
	for _, a := range info.Audit {
		if string(a.Action) == args[0] {
			detail = a.Detail
		}
	}
	return out.Encode(map[string]any{"operationId": info.ID, "status": info.Status, "detail": detail})
}

// resolveOp is demo ops resolve: <id> made <provider refund id> <reason...>,
// or <id> not-made <reason...>.
func resolveOp(ctx context.Context, e *engine.Engine, args []string, out *json.Encoder) error {
	if len(args) < 3 {
		return fmt.Errorf("resolve needs an operation id, made or not-made, and a reason\n%s", opsUsage)
	}
	id, err := uuid.Parse(args[0])
	if err != nil {
		return fmt.Errorf("%q is not an operation id: %w", args[0], err)
	}
	res := engine.Resolution{}
	switch args[1] {
	case "made":
		if len(args) < 4 {
			return fmt.Errorf("resolve made needs the provider's refund id and a reason\n%s", opsUsage)
		}
		res.Made, res.Reference, res.Reason = true, args[2], strings.Join(args[3:], " ")
	case "not-made":
		res.Reason = strings.Join(args[2:], " ")
	default:
		return fmt.Errorf("resolve: %q is neither made nor not-made\n%s", args[1], opsUsage)
	}
	info, err := e.Resolve(ctx, id, res)
	if err != nil {
		return withheld(err)
	}
	return out.Encode(map[string]any{"operationId": info.ID, "status": info.Status, "error": info.Error})
}
