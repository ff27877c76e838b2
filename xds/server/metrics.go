package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/xds"

	edgemetrics "github.com/edgeflow/edgeflow/internal/metrics"
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
}

// latencyBuckets span 100 µs … ~26 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2, 19)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeflow_xds_connected_clients",
			Help: "xDS streams currently open (an ADS client holds one).",
		}),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeflow_xds_connections",
			Help: "Client connections open on the xDS port (Server.Listener).",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeflow_xds_refused_total",
			Help: "Connections, streams and requests refused or closed at a bound or check, by reason: connections, streams, streams_per_connection, resource_names, request_rate, node_switch, no_node, identity.",
		}, []string{"reason"}),
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeflow_xds_nodes",
			Help: "Distinct xDS node ids with at least one open stream.",
		}),
		streamsOpened: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeflow_xds_streams_opened_total",
			Help: "xDS streams opened since start; grows on client reconnects.",
		}),
		publications: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeflow_xds_publications_total",
			Help: "Topologies solved, translated and published to the snapshot cache.",
		}),
		suppressed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeflow_xds_suppressed_publications_total",
			Help: "Recomputes not pushed by flap damping: the membership was unchanged and they moved less than the damping threshold of the traffic.",
		}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeflow_xds_rejected_topologies_total",
			Help: "Topologies not published (invalid, incomplete, or unsolvable); the previous publication stays.",
		}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeflow_xds_pushes_total",
			Help: "Per-node resource-type versions changed and pushed, by xDS type (lds, rds, cds, eds).",
		}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeflow_xds_nacks_total",
			Help: "Responses rejected by clients (requests with error_detail), by xDS type.",
		}, []string{"type"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeflow_xds_nack_fallbacks_total",
			Help: "What a node was set back to after a NACK: acked (its last ACKed set), previous (the set before the rejected one), kept (the cache's set, nothing earlier exists; kept-relabeled: under the version the client holds).",
		}, []string{"to"}),
		steps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeflow_xds_intermediate_snapshots_total",
			Help: "Snapshots set on a node's way to its publication's resources, for make before break: new clusters before the routes that name them, old clusters kept until no route names them.",
		}),
		solve: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "edgeflow_xds_solve_duration_seconds",
			Help:    "Time to compute the allocation of a topology (validate + solve).",
			Buckets: latencyBuckets,
		}),
		translate: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "edgeflow_xds_translate_duration_seconds",
			Help:    "Time to translate an allocation into per-node xDS resources.",
			Buckets: latencyBuckets,
		}),
		push: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "edgeflow_xds_push_duration_seconds",
			Help:    "From the first topology change of a debounced batch to the last SetSnapshot of its publication.",
			Buckets: latencyBuckets,
		}),
		convergence: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "edgeflow_xds_convergence_duration_seconds",
			Help:    "From the first topology change of a batch until every client pushed by its publication answered (ACK or NACK); publications superseded before that are not observed.",
			Buckets: latencyBuckets,
		}),
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
	if err := edgemetrics.Register("xds", reg, m.connected, m.connections, m.refused, m.nodes, m.streamsOpened, m.publications, m.rejected, m.suppressed,
		m.pushes, m.nacks, m.fallbacks, m.steps, m.solve, m.translate, m.push, m.convergence); err != nil {
		return nil, err
	}
	return m, nil
}
