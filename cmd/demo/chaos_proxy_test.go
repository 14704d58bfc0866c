package main

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// faultProxy forwards TCP connections to a server (PostgreSQL, in TestChaos)
// and injects faults into them when told to: latency on every byte for a while,
// abrupt resets of some of the connections, and stalls that forward nothing. Each
// client connection gets an upstream connection of its own, dialled when it is
// accepted; when the dial fails (the server is down), the client connection is
// closed, and the next one dials again.
//
// Each direction of a connection is a delay line: a reader stamps every chunk it
// reads with the time it is due (now, plus the latency in force), and a writer
// writes the chunks in order, each once it is due and no stall is in force.
// When one side ends, what was read from it is still delivered, then both sides
// are closed.
type faultProxy struct {
	ln     net.Listener
	target string
	ctx    context.Context // ends when close is called
	cancel context.CancelFunc
	// wg counts the accept loop and every goroutine of every connection: close
	// waits for all of them.
	wg sync.WaitGroup

	mu           sync.Mutex
	closed       bool
	conns        map[*proxyConn]struct{}
	nextID       uint64
	latency      time.Duration // added to every chunk read before latencyUntil
	latencyUntil time.Time
	stallUntil   time.Time // nothing is written before then
	// wake is closed, and replaced, when a stall or spike is ended early:
	// writers that wait for it look again.
	wake chan struct{}
}

// proxyConn is one proxied connection: the client's and the upstream one.
type proxyConn struct {
	p              *faultProxy
	id             uint64 // in the order of acceptance
	client, server *net.TCPConn
	done           chan struct{} // closed once both sides are
	once           sync.Once
}

// proxyChunk is what one read returned, and when it is due on the other side.
type proxyChunk struct {
	data []byte
	due  time.Time
}

// newFaultProxy listens on 127.0.0.1 and forwards to target (host:port) until
// close, which the test's cleanup calls.
func newFaultProxy(t *testing.T, target string) *faultProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	p := &faultProxy{ln: ln, target: target, ctx: ctx, cancel: cancel, conns: map[*proxyConn]struct{}{}, wake: make(chan struct{})}
	p.wg.Go(p.serve)
	t.Cleanup(p.close)
	return p
}

// addr returns the address the proxy listens on.
func (p *faultProxy) addr() string { return p.ln.Addr().String() }

// close stops accepting, closes every connection abruptly and waits until every
// goroutine of the proxy has returned.
func (p *faultProxy) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.sortedConns()
	p.mu.Unlock()
	p.cancel()
	_ = p.ln.Close()
	for _, c := range conns {
		c.close(true)
	}
	p.wg.Wait()
}

func (p *faultProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond): // out of descriptors, say: try again soon
				continue
			}
		}
		p.wg.Go(func() { p.handle(c.(*net.TCPConn)) })
	}
}

// handle dials the upstream connection for client and starts forwarding.
func (p *faultProxy) handle(client *net.TCPConn) {
	up, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		// The server is down (restarting) or the proxy is closing: the
		// client sees its connection closed, and connects again.
		_ = client.SetLinger(0)
		_ = client.Close()
		return
	}
	c := &proxyConn{p: p, client: client, server: up.(*net.TCPConn), done: make(chan struct{})}
	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.nextID++
		c.id = p.nextID
		p.conns[c] = struct{}{}
	}
	p.mu.Unlock()
	if closed {
		c.close(true)
		return
	}
	p.pipe(c, c.client, c.server)
	p.pipe(c, c.server, c.client)
}

// pipe forwards what src sends to dst, through a delay line of at most 16
// chunks: a full line stops reading src, so a stall holds back the peer too.
func (p *faultProxy) pipe(c *proxyConn, src, dst *net.TCPConn) {
	chunks := make(chan proxyChunk, 16)
	p.wg.Go(func() {
		defer close(chunks)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case chunks <- proxyChunk{data: bytes.Clone(buf[:n]), due: time.Now().Add(p.delay())}:
				case <-c.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	p.wg.Go(func() {
		defer c.close(false)
		for ch := range chunks {
			if !p.hold(c, ch.due) {
				return
			}
			if _, err := dst.Write(ch.data); err != nil {
				return
			}
		}
	})
}

// delay returns the latency of a chunk read now.
func (p *faultProxy) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Now().Before(p.latencyUntil) {
		return p.latency
	}
	return 0
}

// hold waits until due and the end of any stall, and reports false if c was
// closed meanwhile.
func (p *faultProxy) hold(c *proxyConn, due time.Time) bool {
	for {
		p.mu.Lock()
		// A chunk due before the end of a spike that calm ended is due now.
		if p.latencyUntil.IsZero() {
			due = time.Time{}
		}
		until := due
		if p.stallUntil.After(until) { // a stall begun while waiting holds the chunk too
			until = p.stallUntil
		}
		wake := p.wake
		p.mu.Unlock()
		wait := time.Until(until)
		if wait <= 0 {
			return true
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-wake:
			timer.Stop()
		case <-c.done:
			timer.Stop()
			return false
		}
	}
}

// close closes both sides of c; abrupt ones with a reset (RST) rather than a
// FIN, as a crashed host or a middlebox would.
func (c *proxyConn) close(abrupt bool) {
	c.once.Do(func() {
		if abrupt {
			_ = c.client.SetLinger(0)
			_ = c.server.SetLinger(0)
		}
		_ = c.client.Close()
		_ = c.server.Close()
		close(c.done)
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
}

// sortedConns returns the open connections in the order they were accepted.
// The caller holds p.mu.
func (p *faultProxy) sortedConns() []*proxyConn {
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	slices.SortFunc(conns, func(a, b *proxyConn) int { return cmp.Compare(a.id, b.id) })
	return conns
}

// spike delays every byte read in the next d by latency, in both directions.
func (p *faultProxy) spike(latency, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency, p.latencyUntil = latency, time.Now().Add(d)
}

// stall forwards nothing, in either direction, for the next d; the connections
// stay open, and what was held back is forwarded when the stall ends.
func (p *faultProxy) stall(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if end := time.Now().Add(d); end.After(p.stallUntil) {
		p.stallUntil = end
	}
}

// calm ends any latency spike and stall now.
func (p *faultProxy) calm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latencyUntil, p.stallUntil = time.Time{}, time.Time{}
	close(p.wake)
	p.wake = make(chan struct{})
}

// reset closes a share (0 to 1) of the open connections, at least one when
// there are any, abruptly on both sides, and returns how many it closed. The
// connections are picked with a generator seeded by seed, so that the caller's
// own generator draws the same numbers whatever the number of connections.
func (p *faultProxy) reset(share float64, seed uint64) int {
	p.mu.Lock()
	conns := p.sortedConns()
	p.mu.Unlock()
	if len(conns) == 0 {
		return 0
	}
	n := max(1, int(math.Round(share*float64(len(conns)))))
	for _, i := range rand.New(rand.NewPCG(seed, 0)).Perm(len(conns))[:n] {
		conns[i].close(true)
	}
	return n
}

// TestFaultProxy checks TestChaos's proxy against an echo server.
func TestFaultProxy(t *testing.T) {
	t.Parallel()

	// echoServer echoes every connection until the test ends, and sends each
	// connection's end to ends.
	echoServer := func(t *testing.T) (addr string, ends chan error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ends = make(chan error, 16)
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				wg.Go(func() {
					_, err := io.Copy(c, c)
					_ = c.Close()
					ends <- err
				})
			}
		})
		t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
		return ln.Addr().String(), ends
	}
	dial := func(t *testing.T, p *faultProxy) net.Conn {
		c, err := net.Dial("tcp", p.addr())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	roundTrip := func(t *testing.T, c net.Conn, msg string) {
		_, err := c.Write([]byte(msg))
		require.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = io.ReadFull(c, got)
		require.NoError(t, err)
		require.Equal(t, msg, string(got))
	}

	t.Run("Forwards", func(t *testing.T) {
		t.Parallel()
		addr, _ := echoServer(t)
		p := newFaultProxy(t, addr)
		c := dial(t, p)
		roundTrip(t, c, "hello")
		p.spike(20*time.Millisecond, time.Hour)
		roundTrip(t, c, "slowly")
		p.calm()
		roundTrip(t, c, "again")
	})

	t.Run("StallHoldsBytesAndKeepsTheConnection", func(t *testing.T) {
		t.Parallel()
		addr, _ := echoServer(t)
		p := newFaultProxy(t, addr)
		c := dial(t, p)
		roundTrip(t, c, "before")
		p.stall(time.Hour)
		_, err := c.Write([]byte("held"))
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
		_, err = c.Read(make([]byte, 4))
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, "a byte came through the stall")
		require.NoError(t, c.SetReadDeadline(time.Time{}))
		p.calm()
		got := make([]byte, 4)
		_, err = io.ReadFull(c, got)
		require.NoError(t, err)
		require.Equal(t, "held", string(got))
	})

	t.Run("ResetClosesBothSides", func(t *testing.T) {
		t.Parallel()
		addr, ends := echoServer(t)
		p := newFaultProxy(t, addr)
		c := dial(t, p)
		roundTrip(t, c, "x")
		require.Equal(t, 1, p.reset(0, 1))
		_, err := c.Read(make([]byte, 1))
		require.Error(t, err)
		require.Error(t, <-ends, "the server's side was closed without a reset")
		require.Zero(t, p.reset(1, 1), "no connection is left")
		roundTrip(t, dial(t, p), "a new connection")
	})

	t.Run("DialErrorClosesTheClient", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close()) // nothing listens there now
		p := newFaultProxy(t, addr)
		c, err := net.Dial("tcp", p.addr())
		if err == nil { // else the reset came before the dial returned
			_, err = c.Read(make([]byte, 1))
			_ = c.Close()
		}
		require.Error(t, err)
	})

	t.Run("CloseEndsEverything", func(t *testing.T) {
		t.Parallel()
		addr, _ := echoServer(t)
		p := newFaultProxy(t, addr)
		c := dial(t, p)
		roundTrip(t, c, "x")
		p.stall(time.Hour)
		_, err := c.Write([]byte("held"))
		require.NoError(t, err)
		p.close() // returns once every goroutine of the proxy has
		_, err = c.Read(make([]byte, 1))
		require.Error(t, err)
		_, err = net.Dial("tcp", p.addr())
		require.Error(t, err)
	})
}
