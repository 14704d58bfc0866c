package engine_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/faults"
)

const (
	crashEnvURL   = "IDEMFLOW_CRASH_TEST_URL"
	crashEnvPoint = "IDEMFLOW_CRASH_TEST_AT"
	crashReached  = "CRASH POINT REACHED"
	crashKey      = "crash-key"
	crashScope    = "crash-client"
)

// TestCrash kills a real process (SIGKILL) at each point of each step of a
// transfer, then retries the same key in a fresh engine, as a client would, and
// checks that every effect happened exactly once.
func TestCrash(t *testing.T) {
	t.Parallel()
	for _, step := range []string{"ledger", "payout", "finalize"} {
		for _, point := range []faults.Point{faults.PointBefore, faults.PointAfterEffect} {
			at := step + ":" + string(point)
			t.Run(at, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				url, pool := scratchDB(t)

				killChildAt(t, url, at)

				// A client retries the key; the process that gets it finishes the
				// operation, resuming it once the dead run's lease expires.
				b := &bundle{pool: pool}
				op := b.transferOp(t, engine.RetryPolicy{Base: 10 * time.Millisecond})
				e := idemflowtest.Engine(t, pool, nil, op) // a lease of a second

				started, err := engine.Start(ctx, e, op, crashScope, crashKey, transferIn{From: "a", To: "b", Amount: 42}, nil)
				require.NoError(t, err)
				// Only a crash before the first commit leaves no operation behind.
				require.Equal(t, step == "ledger", started.Created)
				info := waitDone(t, e, started)
				require.Equal(t, engine.StatusSucceeded, info.Status)
				require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, pool))
				if step == "payout" && point == faults.PointAfterEffect {
					require.Equal(t, int32(0), b.calls.Load(), "the lookup found the lost payout")
				}
				got, err := e.Get(ctx, info.ID)
				require.NoError(t, err)
				require.Equal(t, 1, got.Steps[0].Attempts, "a finished step never runs again")
			})
		}
	}
}

// killChildAt runs TestCrashChild in a child process and kills it with SIGKILL
// once it reports that it reached the point at.
func killChildAt(t *testing.T, url, at string) {
	t.Helper()
	cmd := startChild(t, "TestCrashChild", []string{crashEnvURL + "=" + url, crashEnvPoint + "=" + at}, crashReached)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
}

// startChild runs the test named test in a child process of this test binary,
// with env added to this process's, and returns it once a line of its output
// contains marker. The child is killed at cleanup if it still runs.
func startChild(t testing.TB, test string, env []string, marker string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // a stopped child dies of SIGKILL only once continued
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	reached := make(chan bool, 1)
	var out strings.Builder
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), marker) {
				reached <- true
				return
			}
		}
		reached <- false
	}()
	select {
	case ok := <-reached:
		require.True(t, ok, "child %s ended without reaching %q:\n%s", test, marker, out.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("child %s did not reach %q:\n%s", test, marker, out.String())
	}
	return cmd
}

// TestCrashChild is the process that TestCrash kills. It does nothing unless
// TestCrash started it.
func TestCrashChild(t *testing.T) {
	url, at := os.Getenv(crashEnvURL), os.Getenv(crashEnvPoint)
	if url == "" {
		t.Skip("run by TestCrash only")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	b := &bundle{pool: pool}
	op := b.transferOp(t, engine.RetryPolicy{})
	e, err := engine.New(pool, &engine.Config{
		Operations: []engine.Definition{op},
		Lease:      time.Second,
		Faults: engine.Faults{Hook: func(ctx context.Context, ev faults.Event) error {
			if ev.Step+":"+string(ev.Point) == at {
				fmt.Println(crashReached)
				time.Sleep(time.Hour) // until SIGKILL
			}
			return nil
		}},
	})
	require.NoError(t, err)
	started, err := engine.Start(ctx, e, op, crashScope, crashKey, transferIn{From: "a", To: "b", Amount: 42}, nil)
	require.NoError(t, err)
	_, err = started.Wait(ctx)
	require.NoError(t, err)
	t.Fatal("the operation finished: the crash point was never reached")
}
