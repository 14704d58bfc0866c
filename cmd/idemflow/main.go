// Command idemflow is the operator's command for any service that runs
// idemflow: it needs only the database's URL, none of the service's
// definitions, and creates nothing in the database.
//
//	idemflow [-database-url URL] list [-status S] [-name N] [-scope C] [-attention] [-older-than D] [-limit N]
//	idemflow [-database-url URL] show <operation id>
//	idemflow [-database-url URL] processes
//	idemflow [-database-url URL] check
//	idemflow [-database-url URL] mismatches
//	idemflow [-database-url URL] retry [-force] <operation id>
//	idemflow [-database-url URL] cancel <operation id> [reason]
//	idemflow [-database-url URL] resolve <operation id> made <reference> <reason>
//	idemflow [-database-url URL] resolve <operation id> not-made <reason>
//	idemflow migrate-get
//	idemflow [-database-url URL] approvals
//	idemflow [-database-url URL] approve <operation id> <reason>
//	idemflow [-database-url URL] reject <operation id> <reason>
//
// migrate-get prints the SQL of idemflow's migrations, for a team that applies
// them with its own tool (River's are River's command's); it needs no
// database. list, show, processes, check, mismatches and approvals read. approve and
// reject an operation that waits at its approval step are carried out at
// once (they need no definition), and a live process carries the operation
// on within a sweep. check lists the unfinished
// operations whose definition (name and version) no live process runs, and
// exits 1 when there is any: it knows no definitions, so it judges by the live
// processes; a build's definitions, before a deploy, are checked by the build
// itself (Engine.Check, such as demo ops check). reconcile run is not here: a
// run needs the application's sources, so the command says where to run it
// (Engine.Reconcile, such as demo ops reconcile run). retry
// and cancel record a request in the database that a live process running the
// operation's definition carries out (within a sweep); the command waits for it
// (-wait) and says what happened: exit 0 when it was done, 1 when it was
// refused (a cancel past the point of no return, say) or failed, 3 when no
// process carried it out in time (the request stays, and is carried out when a
// process that runs the definition comes). The URL defaults to DATABASE_URL.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemflow/idemflow/cmd/internal/opscli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(opscli.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}
