package idemflowprom_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/contrib/idemflowprom"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idempotency"
)

// TestMetrics: the metrics' values after known traffic.
func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := idemflowtest.Pool(t, nil)
	reg := prometheus.NewRegistry()
	m, err := idemflowprom.New(reg, nil)
	require.NoError(t, err)

	var calls atomic.Int32
	op, err := engine.NewOperation("pay", []engine.Step[int, int]{
		engine.TxStep("debit", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
		engine.ExternalStep("bank", func(_ context.Context, _ engine.Attempt, in int, _ *int) error {
			if in == 2 && calls.Add(1) == 1 {
				return errors.New("lost answer")
			}
			return nil
		}).Lookup(func(context.Context, engine.Attempt, int, *int) (bool, error) { return false, nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, &engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Millisecond}})
	require.NoError(t, err)
	m.Declare(op)
	e := idemflowtest.Engine(t, pool, &engine.Config{Observer: m.Observer()}, op)

	for _, in := range []int{1, 2} {
		s, err := engine.Start(ctx, e, op, "c", fmt.Sprint("k", in), in, nil)
		require.NoError(t, err)
		idemflowtest.Wait(t, e, s)
	}
	m.ObserveRequest(ctx, "pay", idempotency.OutcomeReplayed)
	require.NoError(t, m.Refresh(ctx, e))

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idemflow_operations_started_total Operations this process reserved a key for.
# TYPE idemflow_operations_started_total counter
idemflow_operations_started_total{operation="pay"} 2
# HELP idemflow_operations_finished_total Operations that ended in this process, by status.
# TYPE idemflow_operations_finished_total counter
idemflow_operations_finished_total{operation="pay",status="succeeded"} 2
# HELP idemflow_step_attempts_total Step attempts that ended in this process, by outcome (succeeded, retried, pending, failed, panicked).
# TYPE idemflow_step_attempts_total counter
idemflow_step_attempts_total{operation="pay",outcome="retried",step="bank"} 1
idemflow_step_attempts_total{operation="pay",outcome="succeeded",step="bank"} 2
idemflow_step_attempts_total{operation="pay",outcome="succeeded",step="debit"} 2
# HELP idemflow_lookups_total Lookups by derived key, by whether they found the earlier attempt.
# TYPE idemflow_lookups_total counter
idemflow_lookups_total{found="false",operation="pay",step="bank"} 1
# HELP idemflow_idempotency_requests_total Keyed requests, by how they were answered.
# TYPE idemflow_idempotency_requests_total counter
idemflow_idempotency_requests_total{operation="pay",outcome="replayed"} 1
# HELP idemflow_operations_in_progress Unfinished operations in the database.
# TYPE idemflow_operations_in_progress gauge
idemflow_operations_in_progress{operation="pay"} 0
`), "idemflow_operations_started_total", "idemflow_operations_finished_total", "idemflow_step_attempts_total", "idemflow_lookups_total",
		"idemflow_idempotency_requests_total", "idemflow_operations_in_progress"))
	require.Equal(t, 2, testutil.CollectAndCount(reg, "idemflow_step_duration_seconds"), "a histogram per step")
}

// TestMetricsPending: a call answered pending counts as outcome "pending",
// not "retried", and its operation, waiting for the outcome, is counted by
// idemflow_operations_waiting{reason="outcome"} (0 for a type with none, and
// the other reasons 0).
func TestMetricsPending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := idemflowtest.Pool(t, nil)
	reg := prometheus.NewRegistry()
	m, err := idemflowprom.New(reg, nil)
	require.NoError(t, err)

	op, err := engine.NewOperation("payout", []engine.Step[int, int]{
		engine.ExternalStep("bank", func(context.Context, engine.Attempt, int, *int) error {
			return engine.Accepted("", "accepted; final status later")
		}).Lookup(func(context.Context, engine.Attempt, int, *int) (bool, error) {
			return false, engine.Accepted("", "still processing")
		}).Window(time.Hour),
		// The lookup is asked again only an hour later: the operation waits.
	}, func(in int, _ *int) (int, error) { return in, nil }, &engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Hour}})
	require.NoError(t, err)
	idle, err := engine.NewOperation("idle", []engine.Step[int, int]{
		engine.TxStep("a", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	m.Declare(op, idle)
	e := idemflowtest.Engine(t, pool, &engine.Config{Observer: m.Observer()}, op, idle)

	s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := e.Get(ctx, s.ID)
		require.NoError(t, err)
		return info.Steps[0].Status == engine.StepStatusWaiting
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, m.Refresh(ctx, e))

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idemflow_step_attempts_total Step attempts that ended in this process, by outcome (succeeded, retried, pending, failed, panicked).
# TYPE idemflow_step_attempts_total counter
idemflow_step_attempts_total{operation="payout",outcome="pending",step="bank"} 1
# HELP idemflow_operations_waiting Unfinished operations waiting with no process busy on them, by reason (outcome: a step waits for an outside service's word; signal, timer, approval: for a signal, a moment, operators' approvals).
# TYPE idemflow_operations_waiting gauge
idemflow_operations_waiting{operation="idle",reason="approval"} 0
idemflow_operations_waiting{operation="idle",reason="outcome"} 0
idemflow_operations_waiting{operation="idle",reason="signal"} 0
idemflow_operations_waiting{operation="idle",reason="timer"} 0
idemflow_operations_waiting{operation="payout",reason="approval"} 0
idemflow_operations_waiting{operation="payout",reason="outcome"} 1
idemflow_operations_waiting{operation="payout",reason="signal"} 0
idemflow_operations_waiting{operation="payout",reason="timer"} 0
# HELP idemflow_operations_in_progress Unfinished operations in the database.
# TYPE idemflow_operations_in_progress gauge
idemflow_operations_in_progress{operation="idle"} 0
idemflow_operations_in_progress{operation="payout"} 1
`), "idemflow_step_attempts_total", "idemflow_operations_waiting", "idemflow_operations_in_progress"))
}

// TestMetricsWaits: operations whose steps wait for a signal, a moment and
// approvals are counted by idemflow_operations_waiting under their reasons,
// every reason reported for every type (0 when none); once a signal and an
// approval decide two of the waits, their gauges drop back to 0 and
// idemflow_wait_duration_seconds counts one wait of each.
func TestMetricsWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := idemflowtest.Pool(t, nil)
	reg := prometheus.NewRegistry()
	m, err := idemflowprom.New(reg, nil)
	require.NoError(t, err)

	result := func(in int, _ *int) (int, error) { return in, nil }
	sig, err := engine.NewOperation("sig", []engine.Step[int, int]{
		engine.SignalStep("word", "go", func(context.Context, engine.Tx, engine.Attempt, int, *int, engine.Signal) error { return nil }),
	}, result, nil)
	require.NoError(t, err)
	later, err := engine.NewOperation("later", []engine.Step[int, int]{
		engine.TimerStep("release", func(int, *int) engine.Deadline { return engine.Deadline{After: 24 * time.Hour} }),
	}, result, nil)
	require.NoError(t, err)
	appr, err := engine.NewOperation("appr", []engine.Step[int, int]{
		engine.ApprovalStep("review", func(int, *int) engine.ApprovalPolicy { return engine.ApprovalPolicy{Need: 1} }),
	}, result, nil)
	require.NoError(t, err)
	m.Declare(sig, later, appr)
	e := idemflowtest.Engine(t, pool, &engine.Config{Observer: m.Observer()}, sig, later, appr)

	started := map[string]*engine.Started{}
	for _, op := range []*engine.Operation[int, int, int]{sig, later, appr} {
		s, err := engine.Start(ctx, e, op, "c", op.Name(), 1, nil)
		require.NoError(t, err)
		started[op.Name()] = s
		require.Eventually(t, func() bool {
			info, err := e.Get(ctx, s.ID)
			require.NoError(t, err)
			return info.Steps[0].Status == engine.StepStatusWaiting
		}, 10*time.Second, 10*time.Millisecond, "%s never waited", op.Name())
	}
	require.NoError(t, m.Refresh(ctx, e))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idemflow_operations_waiting Unfinished operations waiting with no process busy on them, by reason (outcome: a step waits for an outside service's word; signal, timer, approval: for a signal, a moment, operators' approvals).
# TYPE idemflow_operations_waiting gauge
idemflow_operations_waiting{operation="appr",reason="approval"} 1
idemflow_operations_waiting{operation="appr",reason="outcome"} 0
idemflow_operations_waiting{operation="appr",reason="signal"} 0
idemflow_operations_waiting{operation="appr",reason="timer"} 0
idemflow_operations_waiting{operation="later",reason="approval"} 0
idemflow_operations_waiting{operation="later",reason="outcome"} 0
idemflow_operations_waiting{operation="later",reason="signal"} 0
idemflow_operations_waiting{operation="later",reason="timer"} 1
idemflow_operations_waiting{operation="sig",reason="approval"} 0
idemflow_operations_waiting{operation="sig",reason="outcome"} 0
idemflow_operations_waiting{operation="sig",reason="signal"} 1
idemflow_operations_waiting{operation="sig",reason="timer"} 0
`), "idemflow_operations_waiting"))
	require.Equal(t, 0, testutil.CollectAndCount(reg, "idemflow_wait_duration_seconds"), "no wait decided yet")

	_, err = e.Signal(ctx, nil, engine.SignalTo{OperationID: started["sig"].ID}, engine.Signal{ID: "s1", Name: "go"})
	require.NoError(t, err)
	_, err = e.Approve(engine.WithActor(ctx, "alice"), started["appr"].ID, "checked")
	require.NoError(t, err)
	for _, name := range []string{"sig", "appr"} {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		info, err := started[name].Wait(wctx)
		cancel()
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, info.Status, name)
	}
	require.NoError(t, m.Refresh(ctx, e))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idemflow_operations_waiting Unfinished operations waiting with no process busy on them, by reason (outcome: a step waits for an outside service's word; signal, timer, approval: for a signal, a moment, operators' approvals).
# TYPE idemflow_operations_waiting gauge
idemflow_operations_waiting{operation="appr",reason="approval"} 0
idemflow_operations_waiting{operation="appr",reason="outcome"} 0
idemflow_operations_waiting{operation="appr",reason="signal"} 0
idemflow_operations_waiting{operation="appr",reason="timer"} 0
idemflow_operations_waiting{operation="later",reason="approval"} 0
idemflow_operations_waiting{operation="later",reason="outcome"} 0
idemflow_operations_waiting{operation="later",reason="signal"} 0
idemflow_operations_waiting{operation="later",reason="timer"} 1
idemflow_operations_waiting{operation="sig",reason="approval"} 0
idemflow_operations_waiting{operation="sig",reason="outcome"} 0
idemflow_operations_waiting{operation="sig",reason="signal"} 0
idemflow_operations_waiting{operation="sig",reason="timer"} 0
# HELP idemflow_operator_requests_total Operators' requests (retry, cancel, resolve, approve, reject) this process carried out or refused.
# TYPE idemflow_operator_requests_total counter
idemflow_operator_requests_total{action="approve",result="done"} 1
idemflow_operator_requests_total{action="approve",result="refused"} 0
idemflow_operator_requests_total{action="cancel",result="done"} 0
idemflow_operator_requests_total{action="cancel",result="refused"} 0
idemflow_operator_requests_total{action="reject",result="done"} 0
idemflow_operator_requests_total{action="reject",result="refused"} 0
idemflow_operator_requests_total{action="resolve",result="done"} 0
idemflow_operator_requests_total{action="resolve",result="refused"} 0
idemflow_operator_requests_total{action="retry",result="done"} 0
idemflow_operator_requests_total{action="retry",result="refused"} 0
`), "idemflow_operations_waiting", "idemflow_operator_requests_total"))

	// One wait of each reason decided, each in the histogram's count.
	families, err := reg.Gather()
	require.NoError(t, err)
	counts := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != "idemflow_wait_duration_seconds" {
			continue
		}
		for _, mt := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			counts[labels["operation"]+"/"+labels["step"]+"/"+labels["reason"]] = mt.GetHistogram().GetSampleCount()
			require.Len(t, mt.GetHistogram().GetBucket(), 13, "the default wait buckets")
		}
	}
	require.Equal(t, map[string]uint64{"sig/word/signal": 1, "appr/review/approval": 1}, counts)
}

// families is a prometheus.Registerer that only writes down the names of the
// metric families registered with it.
type families map[string]bool

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (f families) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			f[m[1]] = true
		}
	}
	return nil
}

func (f families) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = f.Register(c)
	}
}

func (f families) Unregister(prometheus.Collector) bool { return false }

// TestShippedRulesAndDashboard: the alerting rules and the Grafana dashboard
// shipped in docs/ name only metric families that New registers (a
// histogram's _bucket, _count and _sum series included), so that a renamed
// metric cannot leave them silently empty. CI checks the rules' syntax and
// behaviour with promtool.
func TestShippedRulesAndDashboard(t *testing.T) {
	t.Parallel()
	known := families{}
	_, err := idemflowprom.New(known, nil)
	require.NoError(t, err)
	require.True(t, known["idemflow_operations_waiting"])
	name := regexp.MustCompile(`idemflow_[a-z_]+`)
	for _, file := range []string{"../../docs/prometheus/idemflow-rules.yml", "../../docs/prometheus/idemflow-rules.test.yml", "../../docs/grafana/idemflow.json"} {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		if strings.HasSuffix(file, ".json") {
			require.True(t, json.Valid(b), "%s is JSON", file)
		}
		found := name.FindAllString(string(b), -1)
		require.NotEmpty(t, found, file)
		for _, n := range found {
			base := n
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if b, ok := strings.CutSuffix(n, suffix); ok && known[b] {
					base = b
				}
			}
			require.True(t, known[base], "%s names %s, which idemflowprom does not export", file, n)
		}
	}
}

// TestCommitGroupSize: idemflow_commit_group_size counts the groups of
// commits the engine sent, by whether they split; the series of groups that
// did not split exists from Declare on.
func TestCommitGroupSize(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := idemflowprom.New(reg, nil)
	require.NoError(t, err)
	m.Declare()
	require.Equal(t, 1, testutil.CollectAndCount(reg, "idemflow_commit_group_size"), "declared")
	obs := m.Observer()
	obs.CommitGrouped(context.Background(), 3, false)
	obs.CommitGrouped(context.Background(), 16, false)
	obs.CommitGrouped(context.Background(), 5, true)
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string][2]float64{}
	for _, f := range families {
		if f.GetName() != "idemflow_commit_group_size" {
			continue
		}
		for _, mt := range f.GetMetric() {
			h := mt.GetHistogram()
			got[mt.GetLabel()[0].GetValue()] = [2]float64{float64(h.GetSampleCount()), h.GetSampleSum()}
		}
	}
	require.Equal(t, map[string][2]float64{"false": {2, 19}, "true": {1, 5}}, got)
}
