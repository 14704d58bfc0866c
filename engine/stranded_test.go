package engine_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/testdb"
)

// cutProxy is a TCP proxy to the test database that can be cut: every
// connection through it closed, and new ones refused, until it is mended.
type cutProxy struct {
	ln            net.Listener
	network, addr string
	cut           atomic.Bool
	mu            sync.Mutex
	conns         []net.Conn
}

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.cut.Load() {
			c.Close()
			continue
		}
		s, err := net.Dial(p.network, p.addr)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(s, c); s.Close() }()
		go func() { _, _ = io.Copy(c, s); c.Close() }()
	}
}

// cutOff closes every connection and refuses new ones.
func (p *cutProxy) cutOff() {
	p.cut.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *cutProxy) mend() { p.cut.Store(false) }

// cutPoolOn opens a pool on the database at url through a proxy that the
// test can cut off (its database "goes away") and mend.
func cutPoolOn(t *testing.T, url string) (*pgxpool.Pool, *cutProxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	p := &cutProxy{}
	if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		p.network, p.addr = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	} else {
		p.network, p.addr = "tcp", fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	}
	p.ln, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.ln.Close() })
	go p.serve()
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = uint16(p.ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.TLSConfig = nil
	cfg.ConnConfig.Fallbacks = nil
	engine.BoundPool(cfg, &engine.PoolOpts{Lease: 15 * time.Second})
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, p
}

// TestStrandedRunResumes: a run whose database goes away mid-operation (a
// restart, a failover) stops, holding its lease; once the database answers
// again, its own process hands the operation to a resume job at once rather
// than leave it to wait out its 15 s lease (the takeover does too, but only
// when the process's liveness lock came back under another key).
func TestStrandedRunResumes(t *testing.T) {
	t.Parallel()
	for _, workers := range []bool{true, false} {
		name := "WithWorkers"
		if !workers {
			// A process that only starts operations (an API's) hands its
			// stranded runs back too; another process's workers run them.
			name = "WithoutWorkers"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testStrandedRunResumes(t, workers)
		})
	}
}

func testStrandedRunResumes(t *testing.T, workers bool) {
	ctx := context.Background()
	url := testdb.URL(t)
	pool, p := cutPoolOn(t, url)
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	op, err := engine.NewOperation("stranded", []engine.Step[int, int]{
		engine.ExternalStep("call", func(ctx context.Context, _ engine.Attempt, _ int, _ *int) error {
			if calls.Add(1) == 1 {
				close(entered)
				<-release
			}
			return nil
		}).Lookup(func(context.Context, engine.Attempt, int, *int) (bool, error) { return calls.Load() > 0, nil }),
		engine.TxStep("book", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	cfg := &engine.Config{Lease: 15 * time.Second, SweepInterval: time.Second}
	e := idemflowtest.Engine(t, pool, cfg, op)
	starter := e
	if !workers {
		// The starter runs no workers, and holds no liveness lock: without
		// its rescue, only the lease's end would free the operation.
		starter, err = engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Lease: cfg.Lease})
		require.NoError(t, err)
		t.Cleanup(func() { _ = starter.Stop(context.Background()) })
		direct, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		t.Cleanup(direct.Close)
		e = idemflowtest.Engine(t, direct, cfg, op)
	}

	s, err := engine.Start(ctx, starter, op, "c", "k", 1, nil)
	require.NoError(t, err)
	<-entered
	p.cutOff()
	close(release) // the call returns with the database away: its checkpoint cannot commit
	time.Sleep(time.Second)
	p.mend()
	mended := time.Now()

	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	info, err := e.Wait(wctx, s.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	took := time.Since(mended)
	t.Logf("finished %s after the database answered again (lease 15 s)", took.Round(time.Millisecond))
	require.Less(t, took, 10*time.Second, "the operation waited out its lease")
}
