package app

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The telemetry a pod in a stock mesh has, under the names and labels of the programs that
// export it there, so an estimator scraping these pods reads what it would read in a cluster:
//
//   - Istio's standard request metrics, istio_requests_total and
//     istio_request_duration_milliseconds, reported by the destination around the pod's
//     handler (from the request's arrival, after the network delay, to its response) and by the
//     source around each outbound call (network and callee included), with Istio's standard
//     label set (https://istio.io/latest/docs/reference/config/metrics/, "Labels"). The
//     duration histogram has Envoy's default buckets, Istio's default.
//   - cAdvisor's container_cpu_usage_seconds_total{container, pod, namespace}: a stand-in, the
//     pod's simulated busy time (Pod.BusyTime), since a simulated pod sleeps and uses no CPU.
//   - kube-state-metrics' kube_pod_container_resource_requests{resource="cpu", unit="core"}:
//     the pod's CPU request, when it has one.
//   - grpc-go's OpenTelemetry client metric grpc.client.attempt.duration with the optional
//     label grpc.lb.locality, as OpenTelemetry's Prometheus exporter names it:
//     grpc_client_attempt_duration_seconds{grpc_method, grpc_target, grpc_status,
//     grpc_lb_locality} (a histogram in seconds with grpc-go's default latency buckets;
//     grpc-go stats/opentelemetry client_metrics.go, processRPCEnd). A stand-in, when the pod has
//     a Config.Locality: the demo links no OpenTelemetry module, so the pod times each
//     downstream call itself and labels it with the locality grpc-go's xDS balancer would give
//     (internal/xds/balancer/clusterimpl/picker.go sets grpc.lb.locality to the picked
//     endpoint's locality, xdsinternal.LocalityString). A demo call makes one attempt (no
//     retries), so its time is the attempt's. The exporter's otel_scope_* labels are left out.
//
// In a cluster these come from three places (the sidecar, the kubelet's cAdvisor, kube-state-
// metrics), and Prometheus' scrape adds the pod label to Istio's; here every pod serves all of
// them on its own /metrics, Istio's without a pod label, as the sidecar exports them.

const (
	defaultNamespace = "default"
	defaultVersion   = "v1"
	// meshCluster is Istio's cluster id when none is configured (source_cluster,
	// destination_cluster).
	meshCluster = "Kubernetes"
	// clusterDomain is the cluster's DNS domain in destination_service.
	clusterDomain = "cluster.local"
	// unknown and latest are Istio's values for a peer it knows nothing of, and for a
	// workload without a canonical revision.
	unknown = "unknown"
	latest  = "latest"
)

// istioLabels are Istio's standard labels of istio_requests_total and
// istio_request_duration_milliseconds, in the order labelValues gives them.
var istioLabels = []string{
	"reporter",
	"source_workload", "source_workload_namespace", "source_principal", "source_app", "source_version",
	"source_cluster", "source_canonical_service", "source_canonical_revision",
	"destination_workload", "destination_workload_namespace", "destination_principal", "destination_app",
	"destination_version", "destination_service", "destination_service_name", "destination_service_namespace",
	"destination_cluster", "destination_canonical_service", "destination_canonical_revision",
	"request_protocol", "response_code", "grpc_response_status", "response_flags", "connection_security_policy",
}

// istioDurationBuckets are Envoy's default histogram buckets in milliseconds, which Istio's
// istio_request_duration_milliseconds has unless configured otherwise (Envoy
// source/common/stats/histogram_impl.cc, HistogramSettingsImpl::defaultBuckets).
var istioDurationBuckets = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
	300000, 600000, 1800000, 3600000}

// workload is one side of a request as Istio's peer metadata tells it; the zero value is a
// peer Istio knows nothing of (a client outside the mesh).
type workload struct {
	name, namespace, version string
}

// source returns the source_* label values.
func (w workload) source() []string {
	if w.name == "" {
		return []string{unknown, unknown, unknown, unknown, unknown, unknown, unknown, latest}
	}
	return []string{w.name, or(w.namespace, defaultNamespace), unknown, w.name, or(w.version, unknown),
		meshCluster, w.name, or(w.version, latest)}
}

// destination returns the destination_* label values. The principal is unknown: the
// simulated mesh has no mutual TLS.
func (w workload) destination() []string {
	ns := or(w.namespace, defaultNamespace)
	return []string{w.name, ns, unknown, w.name, or(w.version, unknown), w.name + "." + ns + ".svc." + clusterDomain,
		w.name, ns, meshCluster, w.name, or(w.version, latest)}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// grpcLatencyBounds are grpc-go's default buckets of its latency metrics, in seconds
// (stats/opentelemetry: DefaultLatencyBounds).
var grpcLatencyBounds = []float64{0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
	0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4,
	0.5, 0.65, 0.8, 1, 2, 5, 10, 20, 50, 100}

// attemptLabels are the labels of grpc_client_attempt_duration_seconds: grpc-go's per-attempt
// labels and the optional grpc.lb.locality, dots as the Prometheus exporter turns them.
var attemptLabels = []string{"grpc_method", "grpc_target", "grpc_status", "grpc_lb_locality"}

// podMetrics is a pod's registry and the metrics its handler and calls update.
type podMetrics struct {
	reg      *prometheus.Registry
	self     workload
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	attempts *prometheus.HistogramVec // nil without Config.Locality
}

func newPodMetrics(p *Pod) *podMetrics {
	m := &podMetrics{
		reg:  prometheus.NewRegistry(),
		self: workload{name: p.cfg.Workload, namespace: p.cfg.Namespace, version: p.cfg.Version},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_requests_total",
			Help: "Requests handled, as Istio's sidecar reports them (reporter=destination: served by this pod; source: sent by it).",
		}, istioLabels),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "istio_request_duration_milliseconds",
			Help:    "Request duration in milliseconds, as Istio's sidecar reports it (destination: arrival to response; source: the whole call).",
			Buckets: istioDurationBuckets,
		}, istioLabels),
	}
	container := prometheus.Labels{"container": p.cfg.Workload, "pod": p.cfg.Name, "namespace": p.cfg.Namespace}
	m.reg.MustRegister(m.requests, m.duration, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "container_cpu_usage_seconds_total",
		Help:        "Stand-in for cAdvisor's CPU usage: the pod's simulated busy time (service time held on a worker and a core), in seconds.",
		ConstLabels: container,
	}, func() float64 { return p.BusyTime().Seconds() }))
	if p.cfg.Locality != nil {
		m.attempts = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "grpc_client_attempt_duration_seconds",
			Help:    "Stand-in for grpc-go's OpenTelemetry grpc.client.attempt.duration: end-to-end time taken to complete a client call attempt, by the picked endpoint's locality.",
			Buckets: grpcLatencyBounds,
		}, attemptLabels)
		m.reg.MustRegister(m.attempts)
	}
	if p.cfg.CPURequest > 0 {
		req := prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kube_pod_container_resource_requests",
			Help: "The pod's CPU request in cores, as kube-state-metrics exports it.",
			ConstLabels: prometheus.Labels{"namespace": p.cfg.Namespace, "pod": p.cfg.Name, "container": p.cfg.Workload,
				"node": p.cfg.Node, "resource": "cpu", "unit": "core"},
		})
		req.Set(p.cfg.CPURequest)
		m.reg.MustRegister(req)
	}
	return m
}

// inbound records a request the pod answered (reporter=destination): from caller, taking d
// from arrival to response, with error err (nil: OK).
func (m *podMetrics) inbound(ctx context.Context, caller peer, d time.Duration, err error) {
	code, flags := "200", "-"
	if ctx.Err() != nil { // the caller went away (cancelled, or its deadline passed)
		code, flags = "0", "DC"
	}
	src := workload{name: caller.workload, namespace: caller.namespace, version: caller.version}
	m.observe("destination", src, m.self, code, err, flags, "none", d)
}

// outbound records a call the pod made to d's service (reporter=source), taking took.
func (m *podMetrics) outbound(ctx context.Context, d Downstream, took time.Duration, err error) {
	code, flags := "200", "-"
	switch {
	case ctx.Err() == context.DeadlineExceeded: // Envoy: upstream request timeout
		code, flags = "504", "UT"
	case ctx.Err() != nil:
		code, flags = "0", "DC"
	}
	// The source cannot know the security policy (Istio reports "unknown" there).
	m.observe("source", m.self, workload{name: d.Service, namespace: d.Namespace, version: defaultVersion}, code, err, flags, unknown, took)
}

// attempt records one call attempt to d at the callee's locality (grpc-go's label value),
// taking took, with error err (nil: OK), in grpc_client_attempt_duration_seconds.
func (m *podMetrics) attempt(d Downstream, locality string, took time.Duration, err error) {
	target := d.Target
	if target == "" {
		target = d.Service
	}
	m.attempts.WithLabelValues(strings.TrimPrefix(MethodCall, "/"), target, canonicalCode(status.Code(err)), locality).Observe(took.Seconds())
}

// canonicalCode is a status code as grpc-go's OpenTelemetry labels grpc.status: the canonical
// upper-case name (grpc-go codes/code_string.go, canonicalString).
func canonicalCode(c codes.Code) string {
	switch c {
	case codes.OK:
		return "OK"
	case codes.Canceled:
		return "CANCELLED"
	}
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

func (m *podMetrics) observe(reporter string, src, dst workload, code string, err error, flags, security string, d time.Duration) {
	values := make([]string, 0, len(istioLabels))
	values = append(values, reporter)
	values = append(values, src.source()...)
	values = append(values, dst.destination()...)
	values = append(values, "grpc", code, strconv.Itoa(int(status.Code(err))), flags, security)
	m.requests.WithLabelValues(values...).Inc()
	m.duration.WithLabelValues(values...).Observe(float64(d) / float64(time.Millisecond))
}

// Gatherer returns the pod's registry, for a /metrics that serves more than the pod's own
// telemetry (Metrics serves it alone).
func (p *Pod) Gatherer() prometheus.Gatherer { return p.metrics.reg }

// Metrics returns the handler of the pod's /metrics: its telemetry in Prometheus' text format
// (see the comment at the top of metrics.go). Safe for concurrent use.
func (p *Pod) Metrics() http.Handler {
	return promhttp.HandlerFor(p.metrics.reg, promhttp.HandlerOpts{})
}
