package kube

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/edgeflow/edgeflow/internal/metrics"
)

// The metrics' namespace and subsystem: every name starts edgeflow_kube_.
const (
	metricNamespace = "edgeflow"
	metricSubsystem = "kube"
)

// labelReason is the label name of edgeflow_kube_skipped.
const labelReason = "reason"

// newMetrics makes the Source's metrics and registers them with reg (nil: with none). A
// registration that fails (a name registered twice, say) is returned as an error.
func (s *Source) newMetrics(reg prometheus.Registerer) (err error) {
	defer func() { err = metrics.Registered("kube", recover()) }()
	f := promauto.With(reg)
	s.events = f.NewCounter(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "events_total",
		Help: "Informer events received (nodes, pods, services, endpointslices)."})
	s.rebuilds = f.NewCounter(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "rebuilds_total",
		Help: "Cluster states rebuilt from the informer caches (events are coalesced)."})
	s.skipped = f.NewGaugeVec(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "skipped",
		Help: "Endpoints (not_ready, terminating, no_address, no_node, unknown_node, bad_name, ambiguous_name) and managed services (no_ready_pods; over_cap: beyond --max-managed-services) left out of the current state."},
		[]string{labelReason})
	return nil
}
