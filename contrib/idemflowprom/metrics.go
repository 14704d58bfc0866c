package idemflowprom

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/reconcile"
)

// Opts are the optional parts of New.
type Opts struct {
	// GaugeInterval is how often Run reads the gauges of unfinished
	// operations. Defaults to 15 seconds.
	GaugeInterval time.Duration
	// Buckets are the step duration histogram's, in seconds. Defaults to
	// prometheus.DefBuckets.
	Buckets []float64
	// WaitBuckets are the wait duration histogram's
	// (idemflow_wait_duration_seconds), in seconds. Defaults to 0.1, 1, 10
	// seconds, 1, 5 and 15 minutes, 1, 4 and 12 hours, 1, 3, 7 and 30 days:
	// a signal may come at once, a release date weeks later.
	WaitBuckets []float64
	// Logger receives the gauge reads that failed. Defaults to slog.Default().
	Logger *slog.Logger
}

// ReasonOutcome is the reason label of idemflow_operations_waiting for an
// operation with a step that waits for an outside service's word: the call's
// outcome is unknown or pending (engine.StepStatusWaiting). It sleeps in its
// rows, no process busy on it but for a lookup now and then, until a lookup,
// an event or an operator settles it. The other reasons are the other
// engine.WaitReason values: "signal", "timer" and "approval".
const ReasonOutcome = string(engine.WaitOutcome)

// waitReasons are the reasons idemflow_operations_waiting reports for every
// operation type, 0 when none waits so.
var waitReasons = []engine.WaitReason{engine.WaitOutcome, engine.WaitSignal, engine.WaitTimer, engine.WaitApproval}

// defaultWaitBuckets are Opts.WaitBuckets' default, in seconds.
var defaultWaitBuckets = []float64{
	0.1, 1, 10, 60, 5 * 60, 15 * 60, 3600, 4 * 3600, 12 * 3600,
	86400, 3 * 86400, 7 * 86400, 30 * 86400,
}

// operatorActions are the operators' requests Declare reports.
var operatorActions = []engine.Action{engine.ActionRetry, engine.ActionCancel, engine.ActionResolve, engine.ActionApprove, engine.ActionReject}

// Metrics are an engine's metrics, registered with a Prometheus registerer.
type Metrics struct {
	opts Opts

	started    *prometheus.CounterVec
	finished   *prometheus.CounterVec
	attempts   *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	recoveries *prometheus.CounterVec
	lookups    *prometheus.CounterVec
	requests   *prometheus.CounterVec
	inProgress *prometheus.GaugeVec
	attention  *prometheus.GaugeVec
	outcome    *prometheus.GaugeVec
	operators  *prometheus.CounterVec
	oldest     *prometheus.GaugeVec
	// waiting is idemflow_operations_waiting{operation,reason};
	// waitingVersion, idemflow_operations_waiting_for_version.
	waiting        *prometheus.GaugeVec
	waitingVersion *prometheus.GaugeVec
	mismatches     *prometheus.GaugeVec
	// waited is idemflow_wait_duration_seconds{operation,step,reason}.
	waited *prometheus.HistogramVec
	// groups is idemflow_commit_group_size{split}.
	groups *prometheus.HistogramVec

	// mu guards seen, the operation types the gauges reported last time: a
	// type with nothing in progress any more is reported 0, not dropped.
	mu   sync.Mutex
	seen map[string]bool
}

// New registers the metrics with reg (prometheus.DefaultRegisterer, or a
// registry of the service's own). opts may be nil.
func New(reg prometheus.Registerer, opts *Opts) (*Metrics, error) {
	o := Opts{}
	if opts != nil {
		o = *opts
	}
	if o.GaugeInterval <= 0 {
		o.GaugeInterval = 15 * time.Second
	}
	if o.Buckets == nil {
		o.Buckets = prometheus.DefBuckets
	}
	if o.WaitBuckets == nil {
		o.WaitBuckets = defaultWaitBuckets
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	m := &Metrics{
		opts: o,
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemflow_operations_started_total", Help: "Operations this process reserved a key for.",
		}, []string{"operation"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemflow_operations_finished_total", Help: "Operations that ended in this process, by status.",
		}, []string{"operation", "status"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemflow_step_attempts_total", Help: "Step attempts that ended in this process, by outcome (succeeded, retried, pending, failed, panicked).",
		}, []string{"operation", "step", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "idemflow_step_duration_seconds", Help: "Durations of step attempts.", Buckets: o.Buckets,
		}, []string{"operation", "step"}),
		recoveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemflow_recoveries_total", Help: "Operations this process took over after another run's lease expired.",
		}, []string{"operation", "how"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemflow_lookups_total", Help: "Lookups by derived key, by whether they found the earlier attempt.",
		}, []string{"operation", "step", "found"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemflow_idempotency_requests_total", Help: "Keyed requests, by how they were answered.",
		}, []string{"operation", "outcome"}),
		inProgress: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemflow_operations_in_progress", Help: "Unfinished operations in the database.",
		}, []string{"operation"}),
		attention: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemflow_operations_needing_attention", Help: "Unfinished operations that wait for an operator.",
		}, []string{"operation"}),
		operators: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemflow_operator_requests_total", Help: "Operators' requests (retry, cancel, resolve, approve, reject) this process carried out or refused.",
		}, []string{"action", "result"}),
		outcome: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemflow_operations_waiting_for_outcome", Help: "Deprecated: idemflow_operations_waiting{reason=\"outcome\"}. Unfinished operations with a step that waits for its outcome: a call whose outcome is unknown or pending.",
		}, []string{"operation"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemflow_operations_waiting", Help: "Unfinished operations waiting with no process busy on them, by reason (outcome: a step waits for an outside service's word; signal, timer, approval: for a signal, a moment, operators' approvals).",
		}, []string{"operation", "reason"}),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemflow_oldest_in_progress_seconds", Help: "Age of the oldest unfinished operation (0 when none).",
		}, []string{"operation"}),
		waitingVersion: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemflow_operations_waiting_for_version", Help: "Unfinished operations of a version this process does not run: they wait for a process that does.",
		}, []string{"operation", "version"}),
		mismatches: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemflow_reconciliation_mismatches", Help: "Reconciliation mismatches, by kind: records of outside services that disagree with the steps.",
		}, []string{"kind"}),
		waited: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "idemflow_wait_duration_seconds", Help: "Time wait steps decided in this process waited, from the moment they were reached, by reason (signal, timer, approval).", Buckets: o.WaitBuckets,
		}, []string{"operation", "step", "reason"}),
		groups: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemflow_commit_group_size",
			Help:    "Transactions of this process that were sent together to share one commit (engine.Config.GroupCommit), by whether one of them failed so that each went again alone (split).",
			Buckets: []float64{2, 3, 4, 6, 8, 12, 16, 24, 32},
		}, []string{"split"}),
		seen: map[string]bool{},
	}
	for _, k := range reconcile.Kinds {
		m.mismatches.WithLabelValues(string(k)).Set(0)
	}
	for _, c := range []prometheus.Collector{m.started, m.finished, m.attempts, m.duration, m.recoveries, m.lookups, m.requests, m.inProgress, m.attention, m.outcome, m.waiting, m.oldest, m.waitingVersion, m.operators, m.mismatches, m.waited, m.groups} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Observer returns the engine.Observer that counts what the engine does, for
// engine.Config.Observer.
func (m *Metrics) Observer() *engine.Observer {
	return &engine.Observer{
		OperationStarted: func(_ context.Context, op engine.OperationEvent) {
			m.started.WithLabelValues(op.Name).Inc()
		},
		OperationFinished: func(_ context.Context, op engine.OperationEvent, status engine.Status) {
			m.finished.WithLabelValues(op.Name, string(status)).Inc()
		},
		OperationRecovered: func(_ context.Context, op engine.OperationEvent) {
			m.recoveries.WithLabelValues(op.Name, "resumed").Inc()
		},
		StepAttempted: func(_ context.Context, s engine.StepEvent) {
			m.attempts.WithLabelValues(s.Operation.Name, s.Step, string(s.Outcome)).Inc()
			m.duration.WithLabelValues(s.Operation.Name, s.Step).Observe(s.Duration.Seconds())
		},
		OperatorRequested: func(_ context.Context, action engine.Action, result string) {
			m.operators.WithLabelValues(string(action), result).Inc()
		},
		Reconciled: func(_ context.Context, _ string, counts map[reconcile.Kind]int64) {
			m.setMismatches(counts)
		},
		LookedUp: func(_ context.Context, s engine.StepEvent, found bool) {
			m.lookups.WithLabelValues(s.Operation.Name, s.Step, strconv.FormatBool(found)).Inc()
		},
		Waited: func(_ context.Context, s engine.StepEvent, reason engine.WaitReason, waited time.Duration) {
			m.waited.WithLabelValues(s.Operation.Name, s.Step, string(reason)).Observe(waited.Seconds())
		},
		CommitGrouped: func(_ context.Context, size int, split bool) {
			m.groups.WithLabelValues(strconv.FormatBool(split)).Observe(float64(size))
		},
	}
}

// ObserveRequest counts a keyed request: idempotency.Config.ObserveFunc.
func (m *Metrics) ObserveRequest(_ context.Context, operation string, outcome idempotency.Outcome) {
	m.requests.WithLabelValues(operation, string(outcome)).Inc()
}

// Declare reports operation types that nothing happened to yet, with zero
// counts of operations started and in progress, so that their series exist
// from the start (and a rate() over them is defined).
func (m *Metrics) Declare(defs ...engine.Definition) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range operatorActions {
		for _, r := range []string{"done", "refused"} {
			m.operators.WithLabelValues(string(a), r)
		}
	}
	m.groups.WithLabelValues("false")
	for _, d := range defs {
		m.started.WithLabelValues(d.Name())
		m.inProgress.WithLabelValues(d.Name()).Set(0)
		m.attention.WithLabelValues(d.Name()).Set(0)
		m.outcome.WithLabelValues(d.Name()).Set(0)
		m.setWaiting(d.Name(), nil)
		m.oldest.WithLabelValues(d.Name()).Set(0)
		m.seen[d.Name()] = true
	}
}

// setMismatches sets the mismatches' gauge, every kind it showed before kept
// (at 0 when gone).
func (m *Metrics) setMismatches(counts map[reconcile.Kind]int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, n := range counts {
		m.mismatches.WithLabelValues(string(k)).Set(float64(n))
	}
	for _, k := range reconcile.Kinds {
		if _, ok := counts[k]; !ok {
			m.mismatches.WithLabelValues(string(k)).Set(0)
		}
	}
}

// Refresh reads the gauges of unfinished operations and of reconciliation
// mismatches once.
func (m *Metrics) Refresh(ctx context.Context, e *engine.Engine) error {
	stats, err := e.InProgress(ctx)
	if err != nil {
		return err
	}
	counts, err := e.MismatchCounts(ctx)
	if err != nil {
		return err
	}
	m.setMismatches(counts)
	m.mu.Lock()
	defer m.mu.Unlock()
	type sums struct {
		count, attention int64
		waiting          map[engine.WaitReason]int64
		oldest           time.Duration
	}
	byName := map[string]*sums{}
	m.waitingVersion.Reset()
	for _, s := range stats {
		t := byName[s.Name]
		if t == nil {
			t = &sums{waiting: map[engine.WaitReason]int64{}}
			byName[s.Name] = t
		}
		t.count += s.Count
		t.attention += s.NeedingAttention
		for reason, n := range s.Waiting {
			t.waiting[reason] += n
		}
		t.oldest = max(t.oldest, s.Oldest)
		if !s.Runnable {
			m.waitingVersion.WithLabelValues(s.Name, strconv.Itoa(s.Version)).Set(float64(s.Count))
		}
	}
	now := map[string]bool{}
	for name, t := range byName {
		m.inProgress.WithLabelValues(name).Set(float64(t.count))
		m.attention.WithLabelValues(name).Set(float64(t.attention))
		m.outcome.WithLabelValues(name).Set(float64(t.waiting[engine.WaitOutcome]))
		m.setWaiting(name, t.waiting)
		m.oldest.WithLabelValues(name).Set(t.oldest.Seconds())
		now[name] = true
	}
	for name := range m.seen {
		if !now[name] {
			m.inProgress.WithLabelValues(name).Set(0)
			m.attention.WithLabelValues(name).Set(0)
			m.outcome.WithLabelValues(name).Set(0)
			m.setWaiting(name, nil)
			m.oldest.WithLabelValues(name).Set(0)
		}
	}
	for name := range now {
		m.seen[name] = true
	}
	return nil
}

// setWaiting sets idemflow_operations_waiting of the operation type name,
// every reason reported (0 when counts has none). m.mu is held.
func (m *Metrics) setWaiting(name string, counts map[engine.WaitReason]int64) {
	for _, reason := range waitReasons {
		m.waiting.WithLabelValues(name, string(reason)).Set(float64(counts[reason]))
	}
}

// Run refreshes the gauges every Opts.GaugeInterval until ctx ends.
func (m *Metrics) Run(ctx context.Context, e *engine.Engine) {
	t := time.NewTicker(m.opts.GaugeInterval)
	defer t.Stop()
	for {
		if err := m.Refresh(ctx, e); err != nil && ctx.Err() == nil {
			m.opts.Logger.WarnContext(ctx, "idemflowprom: could not read the operations in progress", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
