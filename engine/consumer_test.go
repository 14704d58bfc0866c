package engine_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// maxConsumerModules bounds the modules in the build list of a service that
// imports engine, idempotency, opsweb and entry/riverjob: what the library costs a user's go.mod (141
// with the tools and goose in it, 55 with tern, 31 with the migration runner of its own).
const maxConsumerModules = 35

// consumerMain is a service of its own, outside this module: the public API
// only, as docs/guide/define.md shows it.
const consumerMain = `package main

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/engine"
	_ "github.com/idemflow/idemflow/entry/riverjob"
	_ "github.com/idemflow/idemflow/idempotency"
	_ "github.com/idemflow/idemflow/opsweb"
)

type in struct{ Amount int64 }
type state struct{ Paid string }

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := engine.Migrate(ctx, pool, nil); err != nil {
		panic(err)
	}
	op, err := engine.NewOperation("consumer_pay", []engine.Step[in, state]{
		engine.ExternalStep("pay", func(ctx context.Context, call engine.Attempt, in in, s *state) error {
			s.Paid = fmt.Sprint(in.Amount)
			return nil
		}),
	}, func(in in, s *state) (string, error) { return "paid " + s.Paid, nil }, nil)
	if err != nil {
		panic(err)
	}
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}})
	if err != nil {
		panic(err)
	}
	if err := e.StartWorkers(ctx); err != nil {
		panic(err)
	}
	defer e.Stop(ctx)
	started, err := engine.Start(ctx, e, op, "client", "key-1", in{Amount: 42}, nil)
	if err != nil {
		panic(err)
	}
	info, err := started.Wait(ctx)
	if err != nil {
		panic(err)
	}
	out, err := op.Result(info)
	if err != nil {
		panic(err)
	}
	fmt.Println(out)
}
`

// TestConsumerModule builds a throwaway service module that imports the
// library through a replace, runs it against a test database (Migrate, New,
// StartWorkers, Start, Wait, Stop), and counts the modules it pulls in.
func TestConsumerModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module of its own")
	}
	t.Parallel()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	dir := t.TempDir()
	goMod := "module example.com/consumer\n\ngo 1.26.0\n\nrequire github.com/idemflow/idemflow v0.0.0\n\nreplace github.com/idemflow/idemflow => " + root + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(consumerMain), 0o644))
	// The library's sums cover what the consumer needs: no download.
	sums, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sums, 0o644))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	goCmd, err := exec.LookPath("go")
	require.NoError(t, err, "the go command, which runs this test")
	run := func(env []string, args ...string) string {
		cmd := exec.CommandContext(ctx, goCmd, args...)
		cmd.Dir = dir
		// The test's own go flags (-count, -run) are not the consumer's.
		cmd.Env = append(os.Environ(), append([]string{"GOFLAGS=", "GOWORK=off"}, env...)...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		require.NoError(t, cmd.Run(), "go %s: %s", strings.Join(args, " "), errOut.String())
		return out.String()
	}
	run(nil, "mod", "tidy")
	modules := strings.Count(strings.TrimSpace(run(nil, "list", "-m", "all")), "\n") + 1
	t.Logf("a module that imports engine, idempotency, opsweb and entry/riverjob has %d modules in go list -m all", modules)
	require.LessOrEqual(t, modules, maxConsumerModules)

	out := run([]string{"DATABASE_URL=" + testdb.URL(t)}, "run", ".")
	require.Equal(t, "paid 42\n", out)
}
