// Package idemflowprom exports an idemflow engine's metrics to Prometheus, with
// the Prometheus client library. It is a module of its own, so that a service
// that imports idemflow without it does not get the client library in its
// module graph.
//
// New registers the metrics and returns a Metrics whose Observer goes into
// engine.Config.Observer and whose ObserveRequest goes into
// idempotency.Config.ObserveFunc; Run reads the gauges of unfinished
// operations from the database on a timer (one index-only scan each time,
// never per request):
//
//	m, err := idemflowprom.New(prometheus.DefaultRegisterer, nil)
//	e, err := engine.New(pool, &engine.Config{Operations: ops, Observer: m.Observer()})
//	go m.Run(ctx, e)
//	http.Handle("/metrics", promhttp.Handler())
//
// The families, whose operation and step labels are names from the
// definitions, never keys or ids:
//
//   - idemflow_operations_started_total{operation}
//   - idemflow_operations_finished_total{operation,status}
//   - idemflow_step_attempts_total{operation,step,outcome}
//   - idemflow_step_duration_seconds{operation,step} (a histogram)
//   - idemflow_recoveries_total{operation,how}
//   - idemflow_lookups_total{operation,step,found}
//   - idemflow_idempotency_requests_total{operation,outcome}
//   - idemflow_operations_in_progress{operation}
//   - idemflow_operations_needing_attention{operation}: unfinished operations
//     that need attention (engine.Info.NeedsAttention)
//   - idemflow_operator_requests_total{action,result}: operators' retries,
//     cancels, resolves, approvals and rejections, done or refused
//   - idemflow_operations_waiting{operation,reason}: unfinished operations
//     waiting with no process busy on them, by reason (engine.WaitReason),
//     each reported for every operation type, 0 when none waits so:
//     ReasonOutcome ("outcome"), a step waits for an outside service's word
//     (its outcome unknown or pending); "signal", a SignalStep waits for its
//     signal; "timer", a TimerStep waits for its moment; "approval", an
//     ApprovalStep waits for operators' approvals
//   - idemflow_wait_duration_seconds{operation,step,reason}: a histogram of
//     how long the wait steps decided in this process waited, from the
//     moment each was reached to its decision (a signal applied, a moment
//     come, approved, rejected, expired), by the database's clock
//     (engine.Observer.Waited); reason "signal", "timer" or "approval";
//     buckets from 0.1 seconds to 30 days (Opts.WaitBuckets)
//   - idemflow_operations_waiting_for_outcome{operation}: deprecated, the same
//     count as idemflow_operations_waiting{reason="outcome"}
//   - idemflow_oldest_in_progress_seconds{operation}
//   - idemflow_operations_waiting_for_version{operation,version}: unfinished
//     operations of a version this process does not run
//   - idemflow_reconciliation_mismatches{kind}: reconciliation mismatches now
//     (reconcile.Kinds, 0 when none), set as a run ends and by Refresh
package idemflowprom
