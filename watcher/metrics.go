package watcher

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/edgeflow/edgeflow/internal/metrics"
)

// The metrics' namespace (every name starts edgeflow_) and subsystems.
const (
	metricNamespace  = "edgeflow"
	subsystemWatcher = "watcher"
	subsystemCluster = "cluster"
	subsystemLatency = "latency"
	subsystemLoop    = "closed_loop"
)

// Label names of the metrics.
const (
	labelReason    = "reason"
	labelKind      = "kind"
	labelService   = "service"
	labelNamespace = "namespace"
	labelPod       = "pod"
	labelBound     = "bound"
	labelHeld      = "held"
	labelFrom      = "source_node" // the probes' label convention (prom.DefaultSourceLabel)
	labelTo        = "target_node"
)

// Values of the bound label of edgeflow_closed_loop_pod_capacity_rps.
const (
	boundEstimate = "estimate" // estimate.Capacity.RPS
	boundLower    = "lower"    // estimate.Capacity.Lower, what a pod's capacity in force is set from
)

// newMetrics makes the File's metrics and registers them with reg (nil: with none).
func (f *File) newMetrics(reg prometheus.Registerer) (err error) {
	defer func() { err = metrics.Registered("watcher", recover()) }()
	a := promauto.With(reg)
	f.updates = a.NewCounter(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: subsystemWatcher, Name: "topology_updates_total",
		Help: "Topologies read from the topology file, validated and delivered."})
	f.errors = a.NewCounter(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: subsystemWatcher, Name: "topology_errors_total",
		Help: "Reads of the topology file that were rejected (unreadable or invalid); the last good topology stays."})
	f.lastGood = a.NewGauge(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: subsystemWatcher, Name: "topology_last_success_timestamp_seconds",
		Help: "Unix time of the last topology delivered from the file."})
	return nil
}

// newMetrics makes the Live's metrics and registers them with reg (nil: with none).
func (c *Live) newMetrics(reg prometheus.Registerer) (err error) {
	defer func() { err = metrics.Registered("watcher", recover()) }()
	a := promauto.With(reg)
	c.unmeasured = a.NewGauge(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: subsystemLatency, Name: "unmeasured_pairs",
		Help: "Node pairs (unordered; zone pairs when the latency is per zone) with no latency measurement, given the default latency or the largest measured one."})
	c.ignored = a.NewGaugeVec(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: subsystemCluster, Name: "calls_ignored",
		Help: "Measured or configured call edges left out of the current topology, by reason."}, []string{labelReason})
	c.delivered = a.NewCounter(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: subsystemCluster, Name: "topologies_total",
		Help: "Topologies merged from the cluster sources and delivered."})
	c.rejected = a.NewCounter(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: subsystemCluster, Name: "rejected_topologies_total",
		Help: "Merged topologies that failed validation; the last good one stayed."})
	c.unmatched = a.NewCounterVec(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: subsystemWatcher, Name: "unmatched_total",
		Help: "Names in the measurements that match no Kubernetes object, counted each time one appears, by kind (node: a latency label, an error; pod: a pod load, left out)."}, []string{labelKind})
	c.noLatency = a.NewGauge(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: subsystemWatcher, Name: "degraded_plan",
		Help: "1 while the topology has no usable latency and the capacity-weighted plan (every node pair equal) is served."})
	c.tripped = a.NewGaugeVec(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: subsystemLoop, Name: "breaker_tripped",
		Help: "1 while the model-error breaker holds the service tripped (its measured own time far from lata-q's prediction: planned as lata, without capacities), else 0; by service key."}, []string{labelService})
	c.podCapacity = a.NewGaugeVec(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: subsystemLoop, Name: "pod_capacity_rps",
		Help: "Each pod's capacity (requests/s) as the estimator's last round has it, from the pod's own windows or its service's median: bound=estimate the point estimate, bound=lower its lower confidence bound (a pod's capacity in force is set from it, watcher.CapacitiesInForce). A pod without an estimate has no series."},
		[]string{labelNamespace, labelPod, labelBound})
	c.penalty = a.NewGaugeVec(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: subsystemLoop, Name: "latency_penalty_seconds",
		Help: "Each node pair's latency penalty in force, in seconds (what the plan adds to its ICMP RTT: what its requests pay beyond it, from the callers' attempt times and the callees' inbound times; estimate.LatencyCorrector), by the calling and the called node. A pair without a penalty has no series."},
		[]string{labelFrom, labelTo})
	c.excess = a.NewGaugeVec(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: subsystemLoop, Name: "latency_excess_seconds",
		Help: "Each node pair's measured excess in the latency corrector's last round, in seconds: what its requests paid beyond its ICMP RTT and a same-node call's overhead, before the corrector's detection floor, confidence rules and hysteresis decide the penalty in force (estimate.LatencyCorrector). A pair not measured in the last round has no series."},
		[]string{labelFrom, labelTo})
	c.queueScale = a.NewGaugeVec(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: subsystemLoop, Name: "queue_scale",
		Help: "Each CPU-limited service's wait scale in force, in (0, 1]: the share of lata-q's quota model's wait its pods are priced at, the slope of the waits measured against those the model predicts at the loads the pods carried, a load-free overhead apart (estimate.WaitScaler). A service without one (its pods priced at the model's whole wait) has no series."},
		[]string{labelService})
	c.windows = a.NewCounterVec(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: subsystemLoop, Name: "windows_total",
		Help: "Live windows of pod load the capacity estimator took (Prometheus's history read at start not counted), by held: true for a window in which the plan in force changed (the hold-down: the capacities and wait scales in force stay), false for one whose estimates went in force."},
		[]string{labelHeld})
	c.windows.WithLabelValues("false")
	c.windows.WithLabelValues("true")
	c.unmatched.WithLabelValues("node")
	c.unmatched.WithLabelValues("pod")
	return nil
}
