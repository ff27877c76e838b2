package prom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/internal/metrics"
)

// Query names, as in the metrics' query label.
const (
	queryLatency = "latency"
	querySuccess = "success"
	queryCalls   = "calls"
)

// Reasons for ignoring a sample, as in the ignored-samples metric's reason label.
const (
	reasonBadValue     = "bad_value"
	reasonMissingLabel = "missing_label"
	reasonIncomplete   = "incomplete"
)

// sourceMetrics are a Source's metrics (embedded in Source).
type sourceMetrics struct {
	queries     *prometheus.CounterVec
	lastSuccess prometheus.Gauge
	up          prometheus.Gauge
	stale       *prometheus.GaugeVec
	ignored     *prometheus.CounterVec
	deliveries  prometheus.Counter
	suppressed  prometheus.Counter
	unreachable prometheus.Gauge
	window      prometheus.Gauge
	vanished    *prometheus.CounterVec
}

// newSourceMetrics makes the metrics of a Source of cfg (defaults applied), every series of its
// queries visible at 0. It registers nothing.
func newSourceMetrics(cfg Config) sourceMetrics {
	m := sourceMetrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeflow_prometheus_queries_total",
			Help: "Prometheus queries run, by query (latency, success, calls) and result (ok, error).",
		}, []string{"query", "result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeflow_prometheus_last_success_timestamp_seconds",
			Help: "Unix time of the last query round that succeeded.",
		}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeflow_prometheus_up",
			Help: "1 if the last query round succeeded, else 0.",
		}),
		stale: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edgeflow_prometheus_stale_series",
			Help: "Series seen before that vanished from the query result, kept at their last good value.",
		}, []string{"query"}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeflow_prometheus_ignored_samples_total",
			Help: "Samples ignored, by query and reason (bad_value: infinite, negative, out of range or a histogram; missing_label; incomplete: an RTT without a success ratio or the reverse).",
		}, []string{"query", "reason"}),
		deliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeflow_prometheus_deliveries_total",
			Help: "Measurements delivered (first answer, a changed set of pairs or edges, or a change beyond hysteresis).",
		}),
		suppressed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeflow_prometheus_suppressed_changes_total",
			Help: "Query rounds whose values changed, but within hysteresis, so nothing was delivered.",
		}),
		unreachable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeflow_prometheus_unreachable_pairs",
			Help: "Node pairs (ordered) that lost more than --max-probe-loss of their probes in the window.",
		}),
		window: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeflow_prometheus_window_seconds",
			Help: "The window of the queries in use.",
		}),
		vanished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeflow_prometheus_series_vanished_total",
			Help: "Series that vanished from a query result (then kept stale), by query: a flapping series counts at every vanishing.",
		}, []string{"query"}),
	}
	names := []string{queryLatency}
	if cfg.SuccessQuery != DisableSuccess {
		names = append(names, querySuccess)
	}
	if cfg.CallsQuery != DisableCalls {
		names = append(names, queryCalls)
	}
	for _, q := range names { // make every series visible at 0
		m.queries.WithLabelValues(q, "ok")
		m.queries.WithLabelValues(q, "error")
		m.ignored.WithLabelValues(q, reasonBadValue)
		m.ignored.WithLabelValues(q, reasonMissingLabel)
	}
	m.stale.WithLabelValues(queryLatency)
	m.vanished.WithLabelValues(queryLatency)
	if cfg.CallsQuery != DisableCalls {
		m.stale.WithLabelValues(queryCalls)
		m.vanished.WithLabelValues(queryCalls)
	}
	return m
}

// register registers the metrics with r (nil: they are not registered).
func (m *sourceMetrics) register(r prometheus.Registerer) error {
	return metrics.Register("prom", r, m.queries, m.lastSuccess, m.up, m.stale, m.ignored, m.deliveries, m.suppressed, m.unreachable, m.window, m.vanished)
}
