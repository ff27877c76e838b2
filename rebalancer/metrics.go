package rebalancer

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	edgemetrics "github.com/edgeflow/edgeflow/internal/metrics"
)

// The metrics' namespace and subsystem: every name starts edgeflow_rebalance_.
const (
	metricNamespace = "edgeflow"
	metricSubsystem = "rebalance"
)

// Label names of the metrics.
const (
	labelPlacement = "placement"
	labelReason    = "reason"
	labelResult    = "result"
)

// Label values of edgeflow_rebalance_gates_released_total.
const (
	ReleasePlanned   = "planned"    // the replacement of a move, with affinity to its planned node
	ReleaseUnplanned = "unplanned"  // no move awaits a pod of its service (a scale-up, a rollout)
	ReleaseTimeout   = "timeout"    // not released within GateTimeout
	ReleaseNodeUnfit = "node_unfit" // its planned node cannot take it any more (full, tainted, cordoned, gone)
)

type metrics struct {
	gain     prometheus.Gauge
	cost     *prometheus.GaugeVec
	moves    prometheus.Counter
	skipped  *prometheus.CounterVec
	runs     *prometheus.CounterVec
	lastRun  prometheus.Gauge
	released *prometheus.CounterVec
	leader   prometheus.Gauge
	forwards *prometheus.CounterVec

	placementFailures prometheus.Counter
	rateReplans       prometheus.Counter
}

// newMetrics makes the metrics and registers them with reg (nil: with none). A registration
// that fails (a name registered twice, say) is returned as an error.
func newMetrics(reg prometheus.Registerer) (m *metrics, err error) {
	defer func() { err = edgemetrics.Registered("rebalancer", recover()) }()
	f := promauto.With(reg)
	m = &metrics{
		gain: f.NewGauge(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "planned_gain_ratio",
			Help: "Relative fall of the predicted cost (network + queueing) from the current placement to the last run's target."}),
		cost: f.NewGaugeVec(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "predicted_latency_cost_seconds",
			Help: "Predicted LATA latency cost of the current placement and of the target, at the last run: Σ requests/s × network latency in seconds, the network latency accrued per second of traffic."}, []string{labelPlacement}),
		forwards: f.NewCounterVec(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "webhook_forwards_total",
			Help: "Webhook reviews a replica that does not lead forwarded to the leader, by result (ok: the leader answered; no_leader, error: answered here, ungated)."}, []string{labelResult}),
		moves: f.NewCounter(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "moves_total",
			Help: "Pods evicted to move them to their planned node."}),
		skipped: f.NewCounterVec(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "moves_skipped_total",
			Help: "Planned moves not carried out, by reason."}, []string{labelReason}),
		runs: f.NewCounterVec(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "runs_total",
			Help: "Rebalancer runs, by result (ok, error)."}, []string{labelResult}),
		lastRun: f.NewGauge(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "last_run_timestamp_seconds",
			Help: "Unix time of the last rebalancer run that planned."}),
		released: f.NewCounterVec(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "gates_released_total",
			Help: "Pods whose edgeflow.io/placement scheduling gate was lifted, by how they were placed."}, []string{labelPlacement}),
		leader: f.NewGauge(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "leader",
			Help: "1 while this replica holds the rebalancer's Lease."}),
		placementFailures: f.NewCounter(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "placement_failures_total",
			Help: "Replacements not scheduled on their planned node within the placement timeout, deleted so that their controller recreates them without a node."}),
		rateReplans: f.NewCounter(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "rate_replans_total",
			Help: "Plans made before the period was up because the offered rate moved by more than the rate change from the last plan's."}),
	}
	for _, r := range []string{ForwardOK, ForwardNoLeader, ForwardError} {
		m.forwards.WithLabelValues(r)
	}
	return m, nil
}
