package server

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	edgemetrics "github.com/edgeflow/edgeflow/internal/metrics"

	"github.com/edgeflow/edgeflow/xds"
)

// The metrics' namespace and subsystem: every name starts edgeflow_xds_.
const (
	metricNamespace = "edgeflow"
	metricSubsystem = "xds"
)

// Label names of the metrics.
const (
	labelReason = "reason"
	labelType   = "type"
	labelTo     = "to"
	labelSvc    = "service"
)

// metrics are the server's Prometheus metrics. Names follow Prometheus conventions:
// edgeflow_xds_ prefix, base units (_seconds), _total for counters.
type metrics struct {
	connected     prometheus.Gauge
	connections   prometheus.Gauge
	refused       *prometheus.CounterVec
	nodes         prometheus.Gauge
	streamsOpened prometheus.Counter
	publications  prometheus.Counter
	rejected      prometheus.Counter
	suppressed    prometheus.Counter
	pushes        *prometheus.CounterVec
	nacks         *prometheus.CounterVec
	fallbacks     *prometheus.CounterVec
	steps         prometheus.Counter
	solve         prometheus.Histogram
	translate     prometheus.Histogram
	push          prometheus.Histogram
	convergence   prometheus.Histogram
	pooled        *prometheus.GaugeVec

	pooledMu    sync.Mutex
	pooledNames []string // the services pooled holds a series for (setPooled)
}

// setPooled makes edgeflow_xds_service_pooled hold a series of 1 for each of names and none for
// any other service: it deletes only the series of services no longer named, so that a scrape
// during a publication reads the set before or the set after, never an empty one (as a Reset
// followed by the Sets would show it for an instant).
func (m *metrics) setPooled(names []string) {
	m.pooledMu.Lock()
	defer m.pooledMu.Unlock()
	now := make(map[string]bool, len(names))
	for _, name := range names {
		now[name] = true
		m.pooled.WithLabelValues(name).Set(1)
	}
	for _, name := range m.pooledNames {
		if !now[name] {
			m.pooled.DeleteLabelValues(name)
		}
	}
	m.pooledNames = slices.Clone(names)
}

// latencyBuckets span 100 µs … ~26 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2, 19)

// newMetrics makes the metrics and registers them with reg (nil: with none). A registration
// that fails (a name registered twice, say) is returned as an error.
func newMetrics(reg prometheus.Registerer) (m *metrics, err error) {
	defer func() { err = edgemetrics.Registered("xds", recover()) }()
	f := promauto.With(reg)
	m = &metrics{
		connected: f.NewGauge(prometheus.GaugeOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "connected_clients",
			Help:      "xDS streams currently open (an ADS client holds one).",
		}),
		connections: f.NewGauge(prometheus.GaugeOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "connections",
			Help:      "Client connections open on the xDS port (Server.Listener).",
		}),
		refused: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "refused_total",
			Help:      "Connections, streams and requests refused or closed at a bound or check, by reason: connections, streams, streams_per_connection, resource_names, request_rate, node_switch, no_node, identity.",
		}, []string{labelReason}),
		nodes: f.NewGauge(prometheus.GaugeOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "nodes",
			Help:      "Distinct xDS node ids with at least one open stream.",
		}),
		streamsOpened: f.NewCounter(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "streams_opened_total",
			Help:      "xDS streams opened since start; grows on client reconnects.",
		}),
		publications: f.NewCounter(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "publications_total",
			Help:      "Topologies solved, translated and published to the snapshot cache.",
		}),
		suppressed: f.NewCounter(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "suppressed_publications_total",
			Help:      "Recomputes not pushed by flap damping: the membership was unchanged and they moved less than the damping threshold of the traffic.",
		}),
		rejected: f.NewCounter(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "rejected_topologies_total",
			Help:      "Topologies not published (invalid, incomplete, or unsolvable); the previous publication stays.",
		}),
		pushes: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "pushes_total",
			Help:      "Per-node resource-type versions changed and pushed, by xDS type (lds, rds, cds, eds).",
		}, []string{labelType}),
		nacks: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "nacks_total",
			Help:      "Responses rejected by clients (requests with error_detail), by xDS type.",
		}, []string{labelType}),
		fallbacks: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "nack_fallbacks_total",
			Help:      "What a node was set back to after a NACK: acked (its last ACKed set), previous (the set before the rejected one), kept (the cache's set, nothing earlier exists; kept-relabeled: under the version the client holds).",
		}, []string{labelTo}),
		steps: f.NewCounter(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "intermediate_snapshots_total",
			Help:      "Snapshots set on a node's way to its publication's resources, for make before break: new clusters before the routes that name them, old clusters kept until no route names them.",
		}),
		solve: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "solve_duration_seconds",
			Help:      "Time to compute the allocation of a topology (validate + solve).",
			Buckets:   latencyBuckets,
		}),
		translate: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "translate_duration_seconds",
			Help:      "Time to translate an allocation into per-node xDS resources.",
			Buckets:   latencyBuckets,
		}),
		push: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "push_duration_seconds",
			Help:      "From the first topology change of a debounced batch to the last SetSnapshot of its publication.",
			Buckets:   latencyBuckets,
		}),
		convergence: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "convergence_duration_seconds",
			Help:      "From the first topology change of a batch until every client pushed by its publication answered (ACK or NACK); publications superseded before that are not observed.",
			Buckets:   latencyBuckets,
		}),
		pooled: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "service_pooled",
			Help:      "1 for each callee service the plan in force pools (closed-loop delivered by bands: its load reached the utilisation cap of its measured capacity, or it is not measured yet, and its callers balance least-request over all its pods instead of the plan's bands); no series for the others.",
		}, []string{labelSvc}),
	}
	for _, r := range []string{"connections", "streams", "streams_per_connection", "resource_names", "request_rate", "node_switch", "no_node", "identity"} {
		m.refused.WithLabelValues(r)
	}
	for _, to := range []string{"acked", "previous", "kept", "kept-relabeled"} {
		m.fallbacks.WithLabelValues(to)
	}
	for _, t := range xds.SetNames {
		m.pushes.WithLabelValues(t)
		m.nacks.WithLabelValues(t)
	}
	return m, nil
}
