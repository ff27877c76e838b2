package prom

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/edgeflow/edgeflow/internal/metrics"
)

// The metrics' namespace and subsystem: every name starts edgeflow_prometheus_.
const (
	metricNamespace = "edgeflow"
	metricSubsystem = "prometheus"
)

// Label names of the metrics.
const (
	labelQuery  = "query"
	labelResult = "result"
	labelReason = "reason"
	labelSignal = "signal"
)

// Query names, as in the metrics' query label.
const (
	queryLatency = "latency"
	querySuccess = "success"
	queryCalls   = "calls"
	// The pod-load queries: the names start "pod_" (Source.round relies on it).
	queryPodRequests   = "pod_requests"
	queryPodInbound    = "pod_inbound"
	queryPodDownstream = "pod_downstream"
	queryPodCPU        = "pod_cpu"
)

// Reasons for ignoring a sample, as in the ignored-samples metric's reason label.
const (
	reasonBadValue     = "bad_value"
	reasonMissingLabel = "missing_label"
	reasonIncomplete   = "incomplete"
	reasonUntrusted    = "untrusted"
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
	contested   *prometheus.GaugeVec
}

// newSourceMetrics makes the metrics of a Source of cfg (defaults applied), every series of its
// queries visible at 0, and registers them with cfg.Registerer (nil: with none). A registration
// that fails (a name registered twice, say) is returned as an error.
func newSourceMetrics(cfg Config) (m sourceMetrics, err error) {
	defer func() { err = metrics.Registered("prom", recover()) }()
	f := promauto.With(cfg.Registerer)
	m = sourceMetrics{
		queries: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "queries_total",
			Help:      "Prometheus queries run, by query (latency, success, calls, pod_requests, pod_inbound, pod_downstream, pod_cpu, attempts, attempt_seconds) and result (ok, error).",
		}, []string{labelQuery, labelResult}),
		lastSuccess: f.NewGauge(prometheus.GaugeOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "last_success_timestamp_seconds",
			Help:      "Unix time of the last query round that succeeded.",
		}),
		up: f.NewGauge(prometheus.GaugeOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "up",
			Help:      "1 if the last query round succeeded, else 0.",
		}),
		stale: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "stale_series",
			Help:      "Series seen before that vanished from the query result, kept at their last good value.",
		}, []string{labelQuery}),
		ignored: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "ignored_samples_total",
			Help:      "Samples ignored, by query and reason (bad_value: infinite, negative, out of range or a histogram; missing_label; incomplete: an RTT without a success ratio or the reverse; untrusted: a probe series no target of the probe job produces).",
		}, []string{labelQuery, labelReason}),
		deliveries: f.NewCounter(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "deliveries_total",
			Help:      "Measurements delivered (first answer, a changed set of pairs, edges or pods, a change beyond hysteresis, or a window of pod load).",
		}),
		suppressed: f.NewCounter(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "suppressed_changes_total",
			Help:      "Query rounds whose values changed, but within hysteresis, so nothing was delivered.",
		}),
		unreachable: f.NewGauge(prometheus.GaugeOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "unreachable_pairs",
			Help:      "Node pairs (ordered) that lost more than --max-probe-loss of their probes in the window.",
		}),
		window: f.NewGauge(prometheus.GaugeOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "window_seconds",
			Help:      "The window of the queries in use.",
		}),
		vanished: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "series_vanished_total",
			Help:      "Series that vanished from a query result (then kept stale), by query: a flapping series counts at every vanishing.",
		}, []string{labelQuery}),
		contested: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricNamespace,
			Subsystem: metricSubsystem,
			Name:      "contested_series",
			Help:      "Node pairs (signal latency) or pods (pod_requests, pod_inbound, pod_downstream, pod_cpu) whose series came from more than one scrape in the last round: each keeps its last trusted value.",
		}, []string{labelSignal}),
	}
	names := []string{queryLatency}
	if cfg.SuccessQuery != DisableSuccess {
		names = append(names, querySuccess)
	}
	if cfg.CallsQuery != DisableCalls {
		names = append(names, queryCalls)
	}
	var load []string // the pod-load queries that are on
	for sig, q := range loadQueries(&cfg) {
		if q != DisableLoad {
			load = append(load, loadQueryNames[sig])
		}
	}
	for _, q := range append(names, load...) { // make every series visible at 0
		m.queries.WithLabelValues(q, "ok")
		m.queries.WithLabelValues(q, "error")
		m.ignored.WithLabelValues(q, reasonBadValue)
		m.ignored.WithLabelValues(q, reasonMissingLabel)
		if q == queryLatency || q == querySuccess {
			m.ignored.WithLabelValues(q, reasonUntrusted)
		}
	}
	stale := []string{queryLatency}
	if cfg.CallsQuery != DisableCalls {
		stale = append(stale, queryCalls)
	}
	for _, q := range append(stale, load...) {
		m.stale.WithLabelValues(q)
		m.vanished.WithLabelValues(q)
	}
	for _, q := range append([]string{queryLatency}, load...) {
		m.contested.WithLabelValues(q)
	}
	return m, nil
}
