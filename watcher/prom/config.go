package prom

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/config"
	"github.com/prometheus/common/model"
	"k8s.io/utils/clock"

	"github.com/edgeflow/edgeflow/optimizer"
)

// Defaults for the zero fields of Config.
const (
	DefaultInterval = 2 * time.Second
	// DefaultScrapeInterval is the probe job's scrape interval assumed when Prometheus does not
	// say it (its /api/v1/targets has no active target of the job): stock Prometheus's 15 s.
	DefaultScrapeInterval = 15 * time.Second
	// WindowScrapes is the default window in scrape intervals: a window of 4 intervals holds at
	// least 3 samples of every series, so rate() and the per-window means never come back empty.
	WindowScrapes     = 4
	DefaultTimeout    = 5 * time.Second
	DefaultStaleAfter = 10 * time.Minute
	// DefaultProbeJob is the job label of the blackbox-exporter ICMP probes, as edgeflow's
	// scrape configuration names it (e2e/testbed's ScrapeConfig, the install's Prometheus
	// configuration). The default queries read only this job's series.
	DefaultProbeJob = "edgeflow-icmp"
	// DefaultLatencyQuery is the median RTT over the answered probes of the window, per probe
	// series: blackbox-exporter reports phase="rtt" 0 for a lost probe, so only samples above 0
	// count (a pair that answered nothing has no series: its success ratio of 0 makes it
	// unreachable, never 0 ms). The median, not the mean: an RTT spike on a busy node (one probe
	// read 20–60 ms late) would move a mean of 4 samples by a quarter of itself, and with it the
	// plan. The samples are taken by a subquery at the probe job's scrape interval, so the newest
	// probe counts up to one interval later than in a plain range. No aggregation across series:
	// each series keeps its labels (job, instance, the node labels), which the Source checks
	// against the probe job's targets, and a pair with more than one series is contested (see
	// Source).
	DefaultLatencyQuery = `quantile_over_time(0.5, (probe_icmp_duration_seconds{job="$job",phase="rtt"} > 0)[$window:$scrape_interval])`
	// DefaultSuccessQuery is the share of the window's probes that were answered, per probe
	// series (labels kept, as DefaultLatencyQuery's).
	DefaultSuccessQuery = `avg_over_time(probe_success{job="$job"}[$window])`
	DefaultSourceLabel  = "source_node"
	DefaultTargetLabel  = "target_node"
	DefaultLatencyUnit  = 1000.0 // seconds → ms
	// DefaultCallsQuery reads both reporters; the Source keeps, per caller → callee pair, the
	// caller's own report (reporter="source": the caller has a sidecar) when there is one, else
	// the callee's (reporter="destination": a caller without a sidecar, proxyless or ambient).
	DefaultCallsQuery = `sum by (reporter, source_workload, source_workload_namespace, destination_workload, destination_workload_namespace)` +
		` (rate(istio_requests_total{reporter=~"source|destination"}[$window]))`
	// DefaultPodRequestsQuery is the requests each pod completed in the window: its own
	// sidecar's count (reporter="destination"), by the scrape's pod and namespace labels, as
	// Istio's sample scrape job (kubernetes-pods) adds them. The pod-load queries keep the
	// scrape's job and instance: a pod's series from more than one scrape are contested (see
	// Source).
	DefaultPodRequestsQuery = `sum by (namespace, pod, job, instance) (increase(istio_requests_total{reporter="destination"}[$window]))`
	// DefaultPodInboundQuery is the summed duration, in ms, of the requests each pod completed in
	// the window (arrival to response, as its sidecar measures it). A sum, divided by the
	// requests for a mean, not a quantile from the buckets: Envoy's default buckets are too
	// coarse for hops of 1–10 ms.
	DefaultPodInboundQuery = `sum by (namespace, pod, job, instance) (increase(istio_request_duration_milliseconds_sum{reporter="destination"}[$window]))`
	// DefaultPodDownstreamQuery is the summed duration, in ms, of the calls each pod made in the
	// window, as its own sidecar measured them (reporter="source", by the calling pod): the time
	// the pod spent waiting on its callees.
	DefaultPodDownstreamQuery = `sum by (namespace, pod, job, instance) (increase(istio_request_duration_milliseconds_sum{reporter="source"}[$window]))`
	// DefaultPodCPUQuery is the CPU-seconds each pod's application containers used in the
	// window, from cAdvisor's per-container series: container!="" leaves out the pod's own
	// cgroup (which would count its containers twice), and the sidecar is not the application.
	DefaultPodCPUQuery = `sum by (namespace, pod, job, instance) (increase(container_cpu_usage_seconds_total{container!="",container!="istio-proxy"}[$window]))`

	// The hysteresis thresholds (Config.Hysteresis…).
	DefaultHysteresisRelative  = 0.05
	DefaultHysteresisLatencyMS = 0.5
	DefaultHysteresisRPS       = 1.0
	// DefaultHysteresisCores is the pod-load threshold of CPU use, in cores (CPU-seconds per
	// second of the window): 10 millicores.
	DefaultHysteresisCores = 0.01
	// DefaultMaxProbeLoss is the share of lost probes above which a pair is unreachable.
	DefaultMaxProbeLoss = 0.5
	// DefaultUnreachableMS is the latency an unreachable pair gets: high enough that LATA
	// routes around it wherever the balance allows, finite so that balance still holds.
	DefaultUnreachableMS = 1000.0
	// DefaultMaxResponseBytes bounds one query's response body.
	DefaultMaxResponseBytes = 64 << 20
	// DefaultMaxSeries bounds the series of one query's answer (a full mesh of 316 nodes).
	DefaultMaxSeries = 100_000
)

// DisableCalls as Config.CallsQuery turns the call-rate query off.
const DisableCalls = "-"

// DisableLoad as one of Config's pod-load queries turns that query off.
const DisableLoad = "-"

// The labels a pod-load query must return on every series: the pod's namespace and name, as
// Istio's sample scrape job and cAdvisor name them.
const (
	LabelNamespace = "namespace"
	LabelPod       = "pod"
)

// The labels Prometheus gives every scraped series: the scrape job and the target.
const (
	LabelJob      = "job"
	LabelInstance = "instance"
)

// ProbePins says which probe series the Source trusts (Config.ProbePins).
const (
	// PinTargets: a probe series counts only if it carries every label of an active target of
	// the probe job, as Prometheus's /api/v1/targets lists them (job, instance, the node
	// labels): the scrape that should produce it.
	PinTargets = "targets"
	// PinOff trusts every series of the probe job (for a Prometheus-compatible API without
	// /api/v1/targets, or latency queries that aggregate the labels away). A pair with more
	// than one series is still contested.
	PinOff = "off"
)

// Placeholders in a query, replaced before it is sent.
const (
	// WindowVar is replaced by the window in Prometheus duration syntax ("1m").
	WindowVar = "$window"
	// ScrapeIntervalVar is replaced by the probe job's scrape interval in use ("15s"), the step
	// of a subquery that takes every sample once.
	ScrapeIntervalVar = "$scrape_interval"
	// JobVar is replaced by Config.ProbeJob.
	JobVar = "$job"
	// SourceLabelVar and TargetLabelVar are replaced by Config.SourceLabel and TargetLabel.
	SourceLabelVar = "$source_label"
	TargetLabelVar = "$target_label"
)

// DisableSuccess as Config.SuccessQuery turns the probe-success query off: every RTT the
// latency query returns then counts as answered (for a latency query that is not blackbox's).
const DisableSuccess = "-"

// LabelReporter is Istio's reporter label ("source" or "destination").
const LabelReporter = "reporter"

// The labels a calls query must return on every series (Istio's standard labels).
const (
	LabelSourceWorkload               = "source_workload"
	LabelSourceWorkloadNamespace      = "source_workload_namespace"
	LabelDestinationWorkload          = "destination_workload"
	LabelDestinationWorkloadNamespace = "destination_workload_namespace"
)

var (
	// ErrInvalidConfig is wrapped by every NewSource validation error; the message names the field.
	ErrInvalidConfig = errors.New("prom: invalid config")
	// ErrQuery is wrapped by every failed query round; the message names the query and the URL.
	ErrQuery = errors.New("prom: query failed")
)

// Config configures a Source. Zero fields take the defaults above.
type Config struct {
	// URL is the Prometheus base URL, e.g. http://prometheus.monitoring:9090 (required). A
	// password in it is sent (HTTP basic auth) but never printed: logs, errors and Status show
	// url.URL.Redacted().
	URL string
	// HTTP configures the client as Prometheus's own scrape and remote-read clients are
	// configured (bearer token file, CA file, client certificate…; prometheus/common/config).
	// It is used when RoundTripper is nil.
	HTTP config.HTTPClientConfig
	// RoundTripper carries the HTTP requests (nil means one made from HTTP; Run closes its
	// idle connections when it returns).
	RoundTripper http.RoundTripper
	// Interval is how often the queries run (default 2s).
	Interval time.Duration
	// ScrapeInterval is the probe job's scrape interval. Zero means: read it from Prometheus's
	// /api/v1/targets (the largest scrapeInterval of the job's active targets), asked at each
	// round until it answers; DefaultScrapeInterval until then.
	ScrapeInterval time.Duration
	// Window is the window of the queries, substituted for $window. Zero means WindowScrapes ×
	// the scrape interval (so it follows a discovered interval); a whole number of milliseconds.
	Window time.Duration
	// Timeout bounds each query, on the client and as Prometheus's evaluation timeout (default 5s).
	Timeout time.Duration
	// ProbeJob is the job of the probe series, substituted for $job (default DefaultProbeJob);
	// it also names the job whose scrape interval is read.
	ProbeJob string
	// LatencyQuery returns one series per measured (source node, target node) pair, labelled by
	// SourceLabel and TargetLabel, in the unit LatencyUnit converts to ms: the RTT over the
	// answered probes (the default takes their median), NaN or no series when none was
	// answered. With ProbePins PinTargets it must keep each series' target labels (job,
	// instance): a series without them is not trusted. A pair with more than one (trusted)
	// series is contested and keeps its last trusted value (see Source).
	// Default DefaultLatencyQuery.
	LatencyQuery string
	// SuccessQuery returns the share of answered probes (0 to 1) per pair, labelled as
	// LatencyQuery. Default DefaultSuccessQuery; DisableSuccess ("-") turns it off.
	SuccessQuery string
	// ProbePins is PinTargets (the default) or PinOff: which probe series are trusted.
	ProbePins string
	// Namespaces are the managed namespaces: call edges whose caller or callee is elsewhere,
	// and pod loads of pods elsewhere, are not read (dropped uncounted). Empty means all.
	Namespaces []string
	// SourceLabel and TargetLabel name the probing node and the probed node
	// (default "source_node", "target_node", the documented label convention).
	SourceLabel, TargetLabel string
	// LatencyUnit multiplies the query's values into milliseconds (default 1000: seconds → ms).
	LatencyUnit float64
	// MaxProbeLoss: a pair that lost more than this share of its probes in the window is
	// unreachable (default DefaultMaxProbeLoss; in [0, 1)).
	MaxProbeLoss float64
	// UnreachableMS is the latency given to an unreachable pair (default DefaultUnreachableMS).
	UnreachableMS float64
	// CallsQuery returns requests per second by caller and callee workload, labelled with
	// LabelSourceWorkload, LabelSourceWorkloadNamespace, LabelDestinationWorkload and
	// LabelDestinationWorkloadNamespace, and optionally LabelReporter; several series for one
	// edge and reporter are summed, and of an edge's two reporters only "source" is kept when
	// both report it. Default DefaultCallsQuery; DisableCalls ("-") turns the query off.
	CallsQuery string
	// PodRequestsQuery, PodInboundQuery, PodDownstreamQuery and PodCPUQuery return, per pod
	// (labelled LabelNamespace and LabelPod; several series of a pod are summed), what it did in
	// the window: the requests it completed, their summed inbound time in ms, the summed time
	// in ms of the calls it made, and the CPU-seconds its containers used (see PodLoad). A pod
	// has a load when PodRequestsQuery returns it; the other queries' series of other pods are
	// dropped. Defaults DefaultPodRequestsQuery, DefaultPodInboundQuery,
	// DefaultPodDownstreamQuery, DefaultPodCPUQuery; DisableLoad ("-") turns one off (all off
	// with PodRequestsQuery). A failing pod-load query fails only its signal: the pods keep
	// its last good values, stale, and Status.LoadReason says why. Keep the series' job and
	// instance labels (as the defaults do) for the contested check (see Source).
	PodRequestsQuery   string
	PodInboundQuery    string
	PodDownstreamQuery string
	PodCPUQuery        string
	// AttemptsQuery and AttemptSecondsQuery return, per caller pod (LabelNamespace, LabelPod),
	// gRPC target (LabelGRPCTarget) and picked locality (LabelGRPCLocality), the call attempts
	// it completed in the window and their summed duration in seconds (see Attempt): what a
	// proxyless gRPC caller's requests to each latency band took. Unlike the other queries they
	// are off unless AttemptsQuery is set (empty or DisableAttempts, "-": off; the latency
	// correction of serve --policy closed-loop sets DefaultAttemptsQuery); an empty
	// AttemptSecondsQuery is then DefaultAttemptSecondsQuery. A failing one leaves the round without attempts (Measurements.
	// AttemptsRead false) and Status.AttemptsReason says why; nothing else fails with it.
	AttemptsQuery       string
	AttemptSecondsQuery string
	// Hysteresis: a value is delivered when it moved, from the value last delivered, by more
	// than the relative threshold (fraction of the old value) AND more than the absolute one
	// (ms for latency and for a pod's mean inbound and downstream time per request, requests/s
	// for call rates and a pod's request rate, cores for a pod's CPU use). Zero means the
	// default (0.05, 0.5 ms, 1 rps, 0.01 cores); a negative value means no threshold of that
	// kind.
	HysteresisRelative  float64
	HysteresisLatencyMS float64
	HysteresisRPS       float64
	HysteresisCores     float64
	// StaleAfter is how long a vanished series is kept at its last good value before it is
	// forgotten (default 10 minutes).
	StaleAfter time.Duration
	// MaxResponseBytes and MaxSeries bound one query's answer; beyond them the round fails
	// with an error naming the query (defaults DefaultMaxResponseBytes, DefaultMaxSeries).
	MaxResponseBytes int64
	MaxSeries        int
	// Clock is the time source for timestamps, Status and StaleAfter, and Run's query
	// interval ticks on its ticker (nil means clock.RealClock{}).
	Clock clock.WithTicker
	// Logger receives query failures and ignored series (nil means slog.Default()).
	Logger *slog.Logger
	// Registerer receives the source's metrics (nil means they are not registered).
	Registerer prometheus.Registerer
}

// redact is a URL with its password replaced by "xxxxx" (url.URL.Redacted); a URL that does
// not parse is not printed at all.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}

// defaults validates cfg and fills in its zero fields.
func defaults(cfg *Config) error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: Config.%s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	u, err := url.Parse(cfg.URL)
	switch {
	case cfg.URL == "":
		return bad("URL", "empty; want the Prometheus base URL, e.g. http://prometheus.monitoring:9090")
	case err != nil:
		return bad("URL", "does not parse (%s)", redactErr(err, cfg.URL))
	case u.Scheme != "http" && u.Scheme != "https":
		return bad("URL", "%s: scheme %q, want http or https", u.Redacted(), u.Scheme)
	case u.Host == "":
		return bad("URL", "%s: no host", u.Redacted())
	}
	for _, d := range []struct {
		field string
		v     *time.Duration
		def   time.Duration
	}{
		{"Interval", &cfg.Interval, DefaultInterval},
		{"ScrapeInterval", &cfg.ScrapeInterval, 0},
		{"Window", &cfg.Window, 0},
		{"Timeout", &cfg.Timeout, DefaultTimeout},
		{"StaleAfter", &cfg.StaleAfter, DefaultStaleAfter},
	} {
		if *d.v < 0 {
			return bad(d.field, "negative (%v)", *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.Window%time.Millisecond != 0 {
		return bad("Window", "%v is not a whole number of milliseconds (Prometheus duration syntax)", cfg.Window)
	}
	if cfg.ScrapeInterval%time.Millisecond != 0 {
		return bad("ScrapeInterval", "%v is not a whole number of milliseconds (Prometheus duration syntax)", cfg.ScrapeInterval)
	}
	if cfg.ProbeJob == "" {
		cfg.ProbeJob = DefaultProbeJob
	}
	if strings.ContainsAny(cfg.ProbeJob, "\"\\\n") {
		return bad("ProbeJob", "%q: a job name with a quote, backslash or newline cannot go into a label matcher", cfg.ProbeJob)
	}
	switch cfg.ProbePins {
	case "":
		cfg.ProbePins = PinTargets
	case PinTargets, PinOff:
	default:
		return bad("ProbePins", "%q, want %q or %q", cfg.ProbePins, PinTargets, PinOff)
	}
	for _, ns := range cfg.Namespaces {
		if ns == "" {
			return bad("Namespaces", "an empty namespace name")
		}
	}
	if cfg.LatencyQuery == "" {
		cfg.LatencyQuery = DefaultLatencyQuery
	}
	if strings.TrimSpace(cfg.LatencyQuery) == "" || cfg.LatencyQuery == DisableCalls {
		return bad("LatencyQuery", "%q is not a query", cfg.LatencyQuery)
	}
	if cfg.SuccessQuery == "" {
		cfg.SuccessQuery = DefaultSuccessQuery
	}
	if strings.TrimSpace(cfg.SuccessQuery) == "" {
		return bad("SuccessQuery", "blank; leave it empty for the default or set %q to disable", DisableSuccess)
	}
	if cfg.CallsQuery == "" {
		cfg.CallsQuery = DefaultCallsQuery
	}
	if strings.TrimSpace(cfg.CallsQuery) == "" {
		return bad("CallsQuery", "blank; leave it empty for the default or set %q to disable", DisableCalls)
	}
	for _, q := range []struct {
		field string
		v     *string
		def   string
	}{
		{"PodRequestsQuery", &cfg.PodRequestsQuery, DefaultPodRequestsQuery},
		{"PodInboundQuery", &cfg.PodInboundQuery, DefaultPodInboundQuery},
		{"PodDownstreamQuery", &cfg.PodDownstreamQuery, DefaultPodDownstreamQuery},
		{"PodCPUQuery", &cfg.PodCPUQuery, DefaultPodCPUQuery},
	} {
		if *q.v == "" {
			*q.v = q.def
		}
		if strings.TrimSpace(*q.v) == "" {
			return bad(q.field, "blank; leave it empty for the default or set %q to disable", DisableLoad)
		}
	}
	switch {
	case cfg.AttemptsQuery == "":
		cfg.AttemptsQuery = DisableAttempts
	case strings.TrimSpace(cfg.AttemptsQuery) == "":
		return bad("AttemptsQuery", "blank; leave it empty (or set %q) for none", DisableAttempts)
	}
	if cfg.AttemptsQuery != DisableAttempts {
		if cfg.AttemptSecondsQuery == "" {
			cfg.AttemptSecondsQuery = DefaultAttemptSecondsQuery
		}
		if strings.TrimSpace(cfg.AttemptSecondsQuery) == "" || cfg.AttemptSecondsQuery == DisableAttempts {
			return bad("AttemptSecondsQuery", "%q is not a query (the call-attempt queries are turned off by AttemptsQuery)", cfg.AttemptSecondsQuery)
		}
	}
	if cfg.SourceLabel == "" {
		cfg.SourceLabel = DefaultSourceLabel
	}
	if cfg.TargetLabel == "" {
		cfg.TargetLabel = DefaultTargetLabel
	}
	for field, l := range map[string]string{"SourceLabel": cfg.SourceLabel, "TargetLabel": cfg.TargetLabel} {
		if !model.LegacyValidation.IsValidLabelName(l) {
			return bad(field, "%q is not a label name", l)
		}
	}
	if cfg.SourceLabel == cfg.TargetLabel {
		return bad("TargetLabel", "%q is also the SourceLabel", cfg.TargetLabel)
	}
	if cfg.LatencyUnit == 0 {
		cfg.LatencyUnit = DefaultLatencyUnit
	}
	if !(cfg.LatencyUnit > 0) || math.IsInf(cfg.LatencyUnit, 0) {
		return bad("LatencyUnit", "%v, want a positive finite multiplier to ms", cfg.LatencyUnit)
	}
	if cfg.MaxProbeLoss == 0 {
		cfg.MaxProbeLoss = DefaultMaxProbeLoss
	}
	if !(cfg.MaxProbeLoss > 0 && cfg.MaxProbeLoss < 1) {
		return bad("MaxProbeLoss", "%v, want a share of lost probes in (0, 1)", cfg.MaxProbeLoss)
	}
	if cfg.UnreachableMS == 0 {
		cfg.UnreachableMS = DefaultUnreachableMS
	}
	if !(cfg.UnreachableMS > 0) || cfg.UnreachableMS > optimizer.MaxLatencyMS {
		return bad("UnreachableMS", "%v, want a latency in (0, %v] ms", cfg.UnreachableMS, optimizer.MaxLatencyMS)
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.MaxResponseBytes < 0 {
		return bad("MaxResponseBytes", "negative (%d)", cfg.MaxResponseBytes)
	}
	if cfg.MaxSeries == 0 {
		cfg.MaxSeries = DefaultMaxSeries
	}
	if cfg.MaxSeries < 0 {
		return bad("MaxSeries", "negative (%d)", cfg.MaxSeries)
	}
	for _, h := range []struct {
		field string
		v     *float64
		def   float64
	}{
		{"HysteresisRelative", &cfg.HysteresisRelative, DefaultHysteresisRelative},
		{"HysteresisLatencyMS", &cfg.HysteresisLatencyMS, DefaultHysteresisLatencyMS},
		{"HysteresisRPS", &cfg.HysteresisRPS, DefaultHysteresisRPS},
		{"HysteresisCores", &cfg.HysteresisCores, DefaultHysteresisCores},
	} {
		switch {
		case math.IsNaN(*h.v) || math.IsInf(*h.v, 0):
			return bad(h.field, "%v, want a finite number", *h.v)
		case *h.v == 0:
			*h.v = h.def
		case *h.v < 0:
			*h.v = 0
		}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return nil
}

// redactErr is a URL parse error's message without the URL (which may hold a password).
func redactErr(err error, raw string) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return strings.ReplaceAll(err.Error(), raw, "…")
}
