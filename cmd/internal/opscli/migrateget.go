package opscli

import (
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"

	"github.com/idemflow/idemflow/store"
)

// migrateGet prints the SQL that engine.Migrate applies, for a team that
// applies migrations with its own tool: idemflow's migrations, each with
// the version its table (idemflow_schema_version) then holds; River's are
// River's command's. It needs no database.
func migrateGet(stdout, stderr io.Writer) int {
	files, err := fs.Glob(store.Migrations(), "*.sql")
	if err != nil {
		fmt.Fprintf(stderr, "idemflow: %v\n", err)
		return exitRefused
	}
	sort.Strings(files)
	fmt.Fprintln(stdout, "-- idemflow's migrations, in order. Applied by engine.Migrate, each in a transaction of its own;")
	fmt.Fprintln(stdout, "-- after the one numbered N, idemflow_schema_version holds N (a process checks it at start).")
	for i, f := range files {
		b, err := fs.ReadFile(store.Migrations(), f)
		if err != nil {
			fmt.Fprintf(stderr, "idemflow: %v\n", err)
			return exitRefused
		}
		up, _, _ := strings.Cut(string(b), "---- create above / drop below ----")
		fmt.Fprintf(stdout, "\n-- idemflow %s\nBEGIN;\n%s\n", f, strings.TrimSpace(up))
		if i == 0 {
			fmt.Fprintln(stdout, "CREATE TABLE IF NOT EXISTS idemflow_schema_version (version integer NOT NULL);")
			fmt.Fprintln(stdout, "INSERT INTO idemflow_schema_version SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM idemflow_schema_version);")
		}
		fmt.Fprintf(stdout, "UPDATE idemflow_schema_version SET version = %d;\nCOMMIT;\n", i+1)
	}
	fmt.Fprintln(stdout, "\n-- River's migrations (the queue the engine's resume jobs run on), and the versions River records of")
	fmt.Fprintln(stdout, "-- them in river_migration, which the engine checks at start, are River's to apply: river migrate-up.")
	return exitOK
}
