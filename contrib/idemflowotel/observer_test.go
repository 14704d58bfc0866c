package idemflowotel_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemflow/idemflow/contrib/idemflowotel"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// recorder is an in-memory exporter, and a way to await the end of a run's
// span (the engine ends a run after it hands the result to its waiters).
type recorder struct {
	exp  *tracetest.InMemoryExporter
	tp   *sdktrace.TracerProvider
	runs chan string
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	r := &recorder{exp: tracetest.NewInMemoryExporter(), runs: make(chan string, 100)}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(r.exp), sdktrace.WithSpanProcessor(runEnds{r.runs}))
	t.Cleanup(func() { _ = r.tp.Shutdown(context.WithoutCancel(t.Context())) })
	return r
}

// runEnds is told each span's end, after the exporter (processors are called
// in order), and passes on the names of runs.
type runEnds struct{ runs chan<- string }

func (p runEnds) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (p runEnds) OnEnd(s sdktrace.ReadOnlySpan) {
	if strings.HasPrefix(s.Name(), "idemflow.run/") {
		p.runs <- s.Name()
	}
}
func (p runEnds) Shutdown(context.Context) error   { return nil }
func (p runEnds) ForceFlush(context.Context) error { return nil }

// awaitRuns waits until n run spans have ended and returns every span ended
// so far.
func (r *recorder) awaitRuns(t *testing.T, n int) tracetest.SpanStubs {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for range n {
		select {
		case <-r.runs:
		case <-ctx.Done():
			t.Fatalf("waiting for %d runs to end: %v; spans so far: %v", n, ctx.Err(), names(r.exp.GetSpans()))
		}
	}
	return r.exp.GetSpans()
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// named returns the spans called name, in the order they ended.
func named(spans tracetest.SpanStubs, name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

func requireAttrs(t *testing.T, s tracetest.SpanStub, want map[string]any) {
	t.Helper()
	got := attrs(s)
	for k, v := range want {
		a, ok := got[attribute.Key(k)]
		require.True(t, ok, "span %s lacks %s (has %v)", s.Name, k, s.Attributes)
		require.Equal(t, v, a.AsInterface(), "span %s, attribute %s", s.Name, k)
	}
}

func requireNoAttr(t *testing.T, s tracetest.SpanStub, key string) {
	t.Helper()
	_, ok := attrs(s)[attribute.Key(key)]
	require.False(t, ok, "span %s has %s", s.Name, key)
}

// payment is the bank the external step calls, through Transport: it keeps
// the traceparent of each request.
type payment struct {
	srv     *httptest.Server
	mu      sync.Mutex
	parents []trace.SpanContext
}

func newPayment(t *testing.T) *payment {
	p := &payment{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		p.mu.Lock()
		p.parents = append(p.parents, trace.SpanContextFromContext(ctx))
		p.mu.Unlock()
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// setup is an operation of a transactional step and an external step with a
// lookup, whose call fails once transiently (its answer lost) and then
// succeeds, on an engine traced into a recorder.
type bundle struct {
	rec  *recorder
	e    *engine.Engine
	op   *engine.Operation[int, int, int]
	bank *payment
	// stepSpans are the span contexts the external step's function saw, one
	// per call.
	mu        sync.Mutex
	stepSpans []trace.SpanContext
}

func setup(t *testing.T, cfg *engine.Config) *bundle {
	t.Helper()
	b := &bundle{rec: newRecorder(t), bank: newPayment(t)}
	client := &http.Client{Transport: idemflowotel.Transport(b.rec.tp, nil)}
	var calls atomic.Int32
	op, err := engine.NewOperation("pay", []engine.Step[int, int]{
		engine.TxStep("debit", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
		engine.ExternalStep("bank", func(ctx context.Context, at engine.Attempt, _ int, _ *int) error {
			b.mu.Lock()
			b.stepSpans = append(b.stepSpans, trace.SpanFromContext(ctx).SpanContext())
			b.mu.Unlock()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.bank.srv.URL, nil)
			if err != nil {
				return err
			}
			req.Header.Set("Idempotency-Key", at.Key)
			res, err := client.Do(req)
			if err != nil {
				return err
			}
			_ = res.Body.Close()
			if calls.Add(1) == 1 {
				return errors.New("answer lost")
			}
			return nil
		}).Lookup(func(context.Context, engine.Attempt, int, *int) (bool, error) { return false, nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, &engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Millisecond}})
	require.NoError(t, err)
	b.op = op
	if cfg == nil {
		cfg = &engine.Config{}
	}
	cfg.Observer = idemflowotel.Observer(b.rec.tp, nil)
	b.e = idemflowtest.Engine(t, idemflowtest.Pool(t, nil), cfg, op)
	return b
}

// TestObserver: the spans of a run, its attempts and a lookup, with their
// attributes, statuses and parents, for a retry waited out in the run and one
// handed to River.
func TestObserver(t *testing.T) {
	t.Parallel()

	t.Run("RetryInTheRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		s, err := engine.Start(t.Context(), b.e, b.op, "c", "k", 7, nil)
		require.NoError(t, err)
		info := idemflowtest.Wait(t, b.e, s)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		spans := b.rec.awaitRuns(t, 1)

		runs := named(spans, "idemflow.run/pay")
		require.Len(t, runs, 1, "the retry is waited out in the run: %v", names(spans))
		run := runs[0]
		requireAttrs(t, run, map[string]any{
			"idemflow.operation.name":    "pay",
			"idemflow.operation.version": int64(1),
			"idemflow.operation.id":      s.ID.String(),
			"idemflow.run.resumed":       false,
			"idemflow.operation.status":  "succeeded",
		})
		requireNoAttr(t, run, "idemflow.run.end_reason")
		require.EqualValues(t, codes.Unset, run.Status.Code)

		debit := named(spans, "idemflow.step/debit")
		require.Len(t, debit, 1)
		bank := named(spans, "idemflow.step/bank")
		require.Len(t, bank, 2, "an attempt that failed, and the one that succeeded")
		for _, st := range append(debit, bank...) {
			require.Equal(t, run.SpanContext, st.Parent, "%s is the run's child", st.Name)
			require.Equal(t, run.SpanContext.TraceID(), st.SpanContext.TraceID())
		}
		requireAttrs(t, debit[0], map[string]any{
			"idemflow.operation.name": "pay", "idemflow.operation.id": s.ID.String(),
			"idemflow.step.name": "debit", "idemflow.step.attempt": int64(1), "idemflow.step.outcome": "succeeded",
		})
		require.EqualValues(t, codes.Unset, debit[0].Status.Code)

		full, err := b.e.Get(t.Context(), s.ID)
		require.NoError(t, err)
		key := full.Steps[1].DerivedKey
		require.NotEmpty(t, key)
		requireAttrs(t, bank[0], map[string]any{
			"idemflow.step.name": "bank", "idemflow.step.attempt": int64(1), "idemflow.step.outcome": "retried",
			"idemflow.step.derived_key": key,
		})
		require.EqualValues(t, codes.Error, bank[0].Status.Code)
		require.Equal(t, "attempt retried: answer lost", bank[0].Status.Description)
		require.Len(t, bank[0].Events, 1, "the error, recorded")
		requireAttrs(t, bank[1], map[string]any{
			"idemflow.step.name": "bank", "idemflow.step.attempt": int64(2), "idemflow.step.outcome": "succeeded",
			"idemflow.step.derived_key": key,
		})
		require.EqualValues(t, codes.Unset, bank[1].Status.Code)

		// The first attempt's error is recorded; the second asked the lookup first.
		require.Equal(t, "exception", bank[0].Events[0].Name)
		require.Len(t, bank[1].Events, 1)
		ev := bank[1].Events[0]
		require.Equal(t, idemflowotel.LookupEventName, ev.Name)
		require.ElementsMatch(t, []attribute.KeyValue{
			attribute.String("idemflow.step.name", "bank"), attribute.Int("idemflow.step.attempt", 2), attribute.Bool("idemflow.lookup.found", false),
		}, ev.Attributes)

		// The step's function ran in its attempt's span, and its HTTP call
		// was a child of it, which the bank got as the traceparent.
		b.mu.Lock()
		require.Equal(t, []trace.SpanContext{bank[0].SpanContext, bank[1].SpanContext}, b.stepSpans)
		b.mu.Unlock()
		clients := named(spans, "HTTP POST")
		require.Len(t, clients, 2, "%v", names(spans))
		b.bank.mu.Lock()
		defer b.bank.mu.Unlock()
		for i, c := range clients {
			require.Equal(t, trace.SpanKindClient, c.SpanKind)
			require.Equal(t, bank[i].SpanContext, c.Parent)
			require.Equal(t, c.SpanContext.TraceID(), b.bank.parents[i].TraceID())
			require.Equal(t, c.SpanContext.SpanID(), b.bank.parents[i].SpanID())
		}
	})

	t.Run("RetryByRiver", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder(t)
		// Every retry goes through a River job: the retry is a second run.
		b := setup(t, &engine.Config{InlineRetryMax: -1, River: engine.RiverConfig{Middleware: idemflowotel.RiverMiddleware(rec.tp)}})
		s, err := engine.Start(t.Context(), b.e, b.op, "c", "k", 7, nil)
		require.NoError(t, err)
		info := idemflowtest.Wait(t, b.e, s)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		spans := b.rec.awaitRuns(t, 2)
		river := rec.exp.GetSpans()

		runs := named(spans, "idemflow.run/pay")
		require.Len(t, runs, 2)
		first, second := runs[0], runs[1]
		requireAttrs(t, first, map[string]any{"idemflow.run.resumed": false, "idemflow.run.end_reason": string(engine.RunHandedOff)})
		requireNoAttr(t, first, "idemflow.operation.status")
		require.EqualValues(t, codes.Unset, first.Status.Code, "a hand-off is no failure")
		requireAttrs(t, second, map[string]any{"idemflow.run.resumed": true, "idemflow.operation.status": "succeeded"})
		requireNoAttr(t, second, "idemflow.run.end_reason")
		require.EqualValues(t, codes.Unset, second.Status.Code)

		bank := named(spans, "idemflow.step/bank")
		require.Len(t, bank, 2)
		require.Equal(t, first.SpanContext, bank[0].Parent)
		require.Equal(t, second.SpanContext, bank[1].Parent)
		require.Len(t, bank[1].Events, 1, "the resumed run asked the lookup")

		// River's spans, in their own provider: the insert of the retry's
		// job is the failed attempt's child, and the work span that the
		// second run is a child of links back to the insert of its job (that
		// one, or the sweeper's, which may enqueue a resume first once the
		// backoff is over).
		inserts := named(river, "river.insert_many")
		var handOff int
		for _, in := range inserts {
			if in.Parent.Equal(bank[0].SpanContext) {
				handOff++
			}
		}
		require.Equal(t, 1, handOff, "an insert under the failed attempt: %v", inserts)
		var work *tracetest.SpanStub
		for _, w := range river {
			if strings.HasPrefix(w.Name, "river.work/") && w.SpanContext.Equal(second.Parent) {
				work = &w
			}
		}
		require.NotNil(t, work, "the second run is a child of River's work span: %v", names(river))
		require.Equal(t, "river.work/idemflow_resume", work.Name)
		require.Len(t, work.Links, 1)
		linked := false
		for _, in := range inserts {
			linked = linked || in.SpanContext.TraceID() == work.Links[0].SpanContext.TraceID() && in.SpanContext.SpanID() == work.Links[0].SpanContext.SpanID()
		}
		require.True(t, linked, "the work span links to an insert")
	})
}

// TestRunUnderParentSpan: a run started with a context that has a span (a
// request's) is that span's child.
func TestRunUnderParentSpan(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx, parent := b.rec.tp.Tracer("test").Start(t.Context(), "POST /payments")
	s, err := engine.Start(ctx, b.e, b.op, "c", "k", 7, nil)
	require.NoError(t, err)
	parent.End()
	idemflowtest.Wait(t, b.e, s)
	run := named(b.rec.awaitRuns(t, 1), "idemflow.run/pay")[0]
	require.Equal(t, parent.SpanContext(), run.Parent)
	require.Equal(t, parent.SpanContext().TraceID(), run.SpanContext.TraceID())
}

// TestRunEndReasons: the runs that end without finishing their operation, and
// without failing, are Unset with their reason (the engine's RunEnd:
// parked, key_taken...).
func TestRunEndReasons(t *testing.T) {
	t.Parallel()

	t.Run("Parked", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder(t)
		op, err := engine.NewOperation("halt", []engine.Step[int, int]{
			engine.ExternalStep("bank", func(context.Context, engine.Attempt, int, *int) error {
				return engine.Halt("provider_mismatch", "the provider answered for another amount")
			}),
		}, func(in int, _ *int) (int, error) { return in, nil }, nil)
		require.NoError(t, err)
		e := idemflowtest.Engine(t, idemflowtest.Pool(t, nil), &engine.Config{Observer: idemflowotel.Observer(rec.tp, nil)}, op)
		s, err := engine.Start(t.Context(), e, op, "c", "k", 1, nil)
		require.NoError(t, err)
		require.True(t, idemflowtest.Wait(t, e, s).Parked)
		spans := rec.awaitRuns(t, 1)
		run := named(spans, "idemflow.run/halt")[0]
		requireAttrs(t, run, map[string]any{"idemflow.run.end_reason": string(engine.RunParked)})
		require.EqualValues(t, codes.Unset, run.Status.Code)
		step := named(spans, "idemflow.step/bank")[0]
		requireAttrs(t, step, map[string]any{"idemflow.step.outcome": "failed"})
		require.EqualValues(t, codes.Error, step.Status.Code)
	})

	t.Run("KeyTaken", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		s, err := engine.Start(t.Context(), b.e, b.op, "c", "k", 7, nil)
		require.NoError(t, err)
		idemflowtest.Wait(t, b.e, s)
		b.rec.awaitRuns(t, 1)
		again, err := engine.Start(t.Context(), b.e, b.op, "c", "k", 7, nil)
		require.NoError(t, err)
		require.False(t, again.Created)
		spans := b.rec.awaitRuns(t, 1)
		runs := named(spans, "idemflow.run/pay")
		require.Len(t, runs, 2)
		run := runs[1]
		requireAttrs(t, run, map[string]any{"idemflow.run.end_reason": string(engine.RunKeyTaken)})
		requireNoAttr(t, run, "idemflow.operation.status")
		require.EqualValues(t, codes.Unset, run.Status.Code)
		// The attempt whose transaction carried the refused reservation
		// ended with the run.
		debit := named(spans, "idemflow.step/debit")
		require.Len(t, debit, 2)
		require.Equal(t, run.SpanContext, debit[1].Parent)
		requireAttrs(t, debit[1], map[string]any{"idemflow.run.end_reason": string(engine.RunKeyTaken)})
		requireNoAttr(t, debit[1], "idemflow.step.outcome")
		require.EqualValues(t, codes.Unset, debit[1].Status.Code)
	})

	t.Run("FailedOperation", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder(t)
		op, err := engine.NewOperation("refuse", []engine.Step[int, int]{
			engine.TxStep("check", func(context.Context, engine.Tx, engine.Attempt, int, *int) error {
				return engine.Fail("amount_exceeds_refundable", "the amount exceeds what can be refunded")
			}),
		}, func(in int, _ *int) (int, error) { return in, nil }, nil)
		require.NoError(t, err)
		obs := idemflowotel.Observer(rec.tp, &idemflowotel.Opts{OmitDerivedKey: true})
		e := idemflowtest.Engine(t, idemflowtest.Pool(t, nil), &engine.Config{Observer: obs}, op)
		s, err := engine.Start(t.Context(), e, op, "c", "k", 1, nil)
		require.NoError(t, err)
		require.Equal(t, engine.StatusFailed, idemflowtest.Wait(t, e, s).Status)
		spans := rec.awaitRuns(t, 1)
		run := named(spans, "idemflow.run/refuse")[0]
		requireAttrs(t, run, map[string]any{"idemflow.operation.status": "failed"})
		requireNoAttr(t, run, "idemflow.run.end_reason")
		require.EqualValues(t, codes.Unset, run.Status.Code, "the run did its work: the operation's answer is a failure")
		step := named(spans, "idemflow.step/check")[0]
		requireAttrs(t, step, map[string]any{"idemflow.step.outcome": "failed"})
		require.EqualValues(t, codes.Error, step.Status.Code)
		requireNoAttr(t, step, "idemflow.step.derived_key") // Opts.OmitDerivedKey
	})
}

// TestObserverPending: an attempt answered pending is no failure: its span
// is Unset, its outcome "pending"; the run that waits for the outcome hands
// the operation off, and the lookup that finds it made ends it in another run.
func TestObserverPending(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	op, err := engine.NewOperation("pend", []engine.Step[int, int]{
		engine.ExternalStep("bank", func(context.Context, engine.Attempt, int, *int) error {
			return engine.Accepted("", "accepted; final status later")
		}).Lookup(func(context.Context, engine.Attempt, int, *int) (bool, error) { return true, nil }).Window(time.Hour),
	}, func(in int, _ *int) (int, error) { return in, nil }, &engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Millisecond}})
	require.NoError(t, err)
	e := idemflowtest.Engine(t, idemflowtest.Pool(t, nil), &engine.Config{Observer: idemflowotel.Observer(rec.tp, nil)}, op)
	s, err := engine.Start(t.Context(), e, op, "c", "k", 1, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, idemflowtest.Wait(t, e, s).Status)
	spans := rec.awaitRuns(t, 2)
	runs := named(spans, "idemflow.run/pend")
	require.Len(t, runs, 2, "%v", names(spans))
	requireAttrs(t, runs[0], map[string]any{"idemflow.run.end_reason": string(engine.RunHandedOff)})
	require.EqualValues(t, codes.Unset, runs[0].Status.Code)
	requireAttrs(t, runs[1], map[string]any{"idemflow.operation.status": "succeeded"})
	bank := named(spans, "idemflow.step/bank")
	require.NotEmpty(t, bank)
	requireAttrs(t, bank[0], map[string]any{"idemflow.step.outcome": "pending"})
	require.EqualValues(t, codes.Unset, bank[0].Status.Code, "pending is no failure")
	require.Empty(t, bank[0].Events, "no error recorded")
}

// TestObserverWaits: a step that waits hands its run off; the run that
// decides the wait has an idemflow.wait event, whether the step passes (a
// signal applied) or fails (a rejection).
func TestObserverWaits(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	result := func(in int, _ *int) (int, error) { return in, nil }
	sig, err := engine.NewOperation("sig", []engine.Step[int, int]{
		engine.SignalStep("word", "go", func(context.Context, engine.Tx, engine.Attempt, int, *int, engine.Signal) error { return nil }),
	}, result, nil)
	require.NoError(t, err)
	appr, err := engine.NewOperation("appr", []engine.Step[int, int]{
		engine.ApprovalStep("review", func(int, *int) engine.ApprovalPolicy { return engine.ApprovalPolicy{Need: 1} }),
	}, result, nil)
	require.NoError(t, err)
	e := idemflowtest.Engine(t, idemflowtest.Pool(t, nil), &engine.Config{Observer: idemflowotel.Observer(rec.tp, nil)}, sig, appr)

	for _, tc := range []struct {
		op     *engine.Operation[int, int, int]
		step   string
		reason engine.WaitReason
		decide func(s *engine.Started) error
		status engine.Status
	}{
		{sig, "word", engine.WaitSignal, func(s *engine.Started) error {
			_, err := e.Signal(t.Context(), nil, engine.SignalTo{OperationID: s.ID}, engine.Signal{ID: "s1", Name: "go"})
			return err
		}, engine.StatusSucceeded},
		{appr, "review", engine.WaitApproval, func(s *engine.Started) error {
			_, err := e.Reject(engine.WithActor(t.Context(), "alice"), s.ID, "wrong account")
			return err
		}, engine.StatusFailed},
	} {
		s, err := engine.Start(t.Context(), e, tc.op, "c", tc.op.Name(), 1, nil)
		require.NoError(t, err)
		spans := rec.awaitRuns(t, 1)
		runs := named(spans, "idemflow.run/"+tc.op.Name())
		require.Len(t, runs, 1)
		requireAttrs(t, runs[0], map[string]any{"idemflow.run.end_reason": string(engine.RunHandedOff)})
		require.Empty(t, runs[0].Events, "nothing decided yet")
		require.NoError(t, tc.decide(s))
		require.Equal(t, tc.status, idemflowtest.Wait(t, e, s).Status)
		spans = rec.awaitRuns(t, 1)
		runs = named(spans, "idemflow.run/"+tc.op.Name())
		require.Len(t, runs, 2, "%v", names(spans))
		require.Len(t, runs[1].Events, 1, "%v", runs[1].Events)
		ev := runs[1].Events[0]
		require.Equal(t, idemflowotel.WaitEventName, ev.Name)
		got := map[attribute.Key]any{}
		for _, kv := range ev.Attributes {
			got[kv.Key] = kv.Value.AsInterface()
		}
		require.Equal(t, tc.step, got["idemflow.step.name"])
		require.Equal(t, int64(1), got["idemflow.step.attempt"])
		require.Equal(t, string(tc.reason), got["idemflow.wait.reason"])
		require.IsType(t, float64(0), got["idemflow.wait.duration"])
		require.GreaterOrEqual(t, got["idemflow.wait.duration"], 0.0)
	}
}

// TestObserverOff: without a provider, nothing is traced.
func TestObserverOff(t *testing.T) {
	t.Parallel()
	require.Nil(t, idemflowotel.Observer(nil, nil))
	require.Nil(t, idemflowotel.RiverMiddleware(nil))
	rt := http.NewFileTransport(http.Dir("."))
	require.Equal(t, rt, idemflowotel.Transport(nil, rt))
	require.Equal(t, http.DefaultTransport, idemflowotel.Transport(nil, nil))
	require.Equal(t, okHandler{}, idemflowotel.Handler(nil, okHandler{}))
}

type okHandler struct{}

func (okHandler) ServeHTTP(http.ResponseWriter, *http.Request) {}
