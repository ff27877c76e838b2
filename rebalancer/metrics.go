package rebalancer

import (
	"github.com/prometheus/client_golang/prometheus"

	edgemetrics "github.com/edgeflow/edgeflow/internal/metrics"
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

	placementFailures prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		gain: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgeflow_rebalance_planned_gain_ratio",
			Help: "Relative fall of the predicted LATA cost from the current placement to the last run's target."}),
		cost: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "edgeflow_rebalance_predicted_latency_cost_seconds",
			Help: "Predicted LATA latency cost of the current placement and of the target, at the last run: Σ requests/s × network latency in seconds, the network latency accrued per second of traffic."}, []string{"placement"}),
		moves: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeflow_rebalance_moves_total",
			Help: "Pods evicted to move them to their planned node."}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edgeflow_rebalance_moves_skipped_total",
			Help: "Planned moves not carried out, by reason."}, []string{"reason"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edgeflow_rebalance_runs_total",
			Help: "Rebalancer runs, by result (ok, error)."}, []string{"result"}),
		lastRun: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgeflow_rebalance_last_run_timestamp_seconds",
			Help: "Unix time of the last rebalancer run that planned."}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edgeflow_rebalance_gates_released_total",
			Help: "Pods whose edgeflow.io/placement scheduling gate was lifted, by how they were placed."}, []string{"placement"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgeflow_rebalance_leader",
			Help: "1 while this replica holds the rebalancer's Lease."}),
		placementFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeflow_rebalance_placement_failures_total",
			Help: "Replacements not scheduled on their planned node within the placement timeout, deleted so that their controller recreates them without a node."}),
	}
	if err := edgemetrics.Register("rebalancer", reg, m.gain, m.cost, m.moves, m.skipped, m.runs, m.lastRun, m.released, m.leader, m.placementFailures); err != nil {
		return nil, err
	}
	return m, nil
}
