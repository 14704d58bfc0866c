// Command idemflow is the operator's command for any service that runs
// idemflow: it needs only the database's URL, none of the service's
// definitions, and creates nothing in the database.
//
//	idemflow [-database-url URL] list [-status S] [-name N] [-scope C] [-attention] [-older-than D] [-limit N]
//	idemflow [-database-url URL] show <operation id>
//	idemflow [-database-url URL] processes
//	idemflow [-database-url URL] check
//	idemflow [-database-url URL] retry <operation id>
//	idemflow [-database-url URL] cancel <operation id> [reason]
//
// list, show, processes and check read. check lists the unfinished operations
// whose definition no live process runs, and exits 1 when there is any. retry
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
