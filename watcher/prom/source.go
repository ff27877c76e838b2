// Package prom reads what Prometheus knows about the cluster: node-to-node latency measured by
// blackbox-exporter ICMP probes, and the call rates between workloads from Istio's
// istio_requests_total. A Source polls both queries and delivers an immutable Measurements
// snapshot only when something changed beyond hysteresis; FillLatency turns the measured pairs
// into the full latency list the optimizer takes. It knows nothing of Kubernetes or xDS.
package prom

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/config"
	"github.com/prometheus/common/model"

	"github.com/edgeflow/edgeflow/internal/metrics"
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
	// DefaultLatencyQuery is the median RTT over the answered probes of the window, per pair:
	// blackbox-exporter reports phase="rtt" 0 for a lost probe, so only samples above 0 count
	// (a pair that answered nothing has no series: its success ratio of 0 makes it unreachable,
	// never 0 ms). The median, not the mean: an RTT spike on a busy node (one probe read 20–60
	// ms late) would move a mean of 4 samples by a quarter of itself, and with it the plan. The
	// samples are taken by a subquery at the probe job's scrape interval, so the newest probe
	// counts up to one interval later than in a plain range; several series of a pair (more
	// than one exporter) give the median of their medians.
	DefaultLatencyQuery = `quantile by ($source_label, $target_label) (0.5, quantile_over_time(0.5,` +
		` (probe_icmp_duration_seconds{job="$job",phase="rtt"} > 0)[$window:$scrape_interval]))`
	// DefaultSuccessQuery is the share of the window's probes that were answered, per pair.
	DefaultSuccessQuery = `avg by ($source_label, $target_label) (avg_over_time(probe_success{job="$job"}[$window]))`
	DefaultSourceLabel  = "source_node"
	DefaultTargetLabel  = "target_node"
	DefaultLatencyUnit  = 1000.0 // seconds → ms
	// DefaultCallsQuery reads both reporters; the Source keeps, per caller → callee pair, the
	// caller's own report (reporter="source": the caller has a sidecar) when there is one, else
	// the callee's (reporter="destination": a caller without a sidecar, proxyless or ambient).
	DefaultCallsQuery = `sum by (reporter, source_workload, source_workload_namespace, destination_workload, destination_workload_namespace)` +
		` (rate(istio_requests_total{reporter=~"source|destination"}[$window]))`
	DefaultHysteresisRelative  = 0.05
	DefaultHysteresisLatencyMS = 0.5
	DefaultHysteresisRPS       = 1.0
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
	// answered. Several series for one pair are averaged.
	// Default DefaultLatencyQuery.
	LatencyQuery string
	// SuccessQuery returns the share of answered probes (0 to 1) per pair, labelled as
	// LatencyQuery. Default DefaultSuccessQuery; DisableSuccess ("-") turns it off.
	SuccessQuery string
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
	// Hysteresis: a value is delivered when it moved, from the value last delivered, by more
	// than the relative threshold (fraction of the old value) AND more than the absolute one
	// (ms for latency, requests/s for call rates). Zero means the default (0.05, 0.5 ms,
	// 1 rps); a negative value means no threshold of that kind.
	HysteresisRelative  float64
	HysteresisLatencyMS float64
	HysteresisRPS       float64
	// StaleAfter is how long a vanished series is kept at its last good value before it is
	// forgotten (default 10 minutes).
	StaleAfter time.Duration
	// MaxResponseBytes and MaxSeries bound one query's answer; beyond them the round fails
	// with an error naming the query (defaults DefaultMaxResponseBytes, DefaultMaxSeries).
	MaxResponseBytes int64
	MaxSeries        int
	// Clock is the time source for timestamps, Status and StaleAfter (nil means time.Now).
	// The query interval itself runs on a real ticker.
	Clock func() time.Time
	// Logger receives query failures and ignored series (nil means slog.Default()).
	Logger *slog.Logger
	// Registerer receives the source's metrics (nil means they are not registered).
	Registerer prometheus.Registerer
}

// Pair is an ordered pair of node names: From is the probing node, To the probed one.
type Pair struct{ From, To string }

func (p Pair) String() string { return p.From + "→" + p.To }

// Workload is an Istio workload (a Deployment, StatefulSet… by name) in its namespace.
type Workload struct{ Name, Namespace string }

func (w Workload) String() string { return w.Namespace + "/" + w.Name }

// CallEdge is a caller workload and a callee workload.
type CallEdge struct{ From, To Workload }

func (e CallEdge) String() string { return e.From.String() + "→" + e.To.String() }

// CallRate is the rate of requests (per second) on one call edge.
type CallRate struct {
	From, To Workload
	RPS      float64
}

// Measurements is one immutable snapshot of what Prometheus says. The Source never touches a
// snapshot again once delivered; receivers must not modify it either.
type Measurements struct {
	// Latency is in ms, for measured pairs only, including stale pairs kept at their last good
	// value; an unreachable pair holds Config.UnreachableMS. It never holds a value made up for
	// a pair without an answered probe. Pass it to FillLatency for the full matrix.
	Latency map[Pair]float64
	// Loss is the share of the window's probes lost, per pair of Latency whose success was
	// measured (absent with DisableSuccess).
	Loss map[Pair]float64
	// Unreachable holds the pairs that lost more than Config.MaxProbeLoss of their probes.
	Unreachable map[Pair]bool
	// Stale holds the pairs whose series vanished from the query result (or carried a bad
	// value); their value is the last good answer, kept for Config.StaleAfter.
	Stale map[Pair]bool
	// Calls are the call rates, sorted by caller then callee (namespace, then name),
	// including stale edges kept at their last good rate.
	Calls []CallRate
	// StaleCalls holds the call edges kept at their last good rate.
	StaleCalls map[CallEdge]bool
	// Window is the window the queries used.
	Window time.Duration
	// At is when the query round answered (Config.Clock).
	At time.Time
}

// Status is the health of a Source, for readiness checks.
type Status struct {
	// OK says whether the last query round succeeded.
	OK bool
	// Reason says why it did not (the error, naming the query and the URL, password redacted).
	Reason string
	// Since is when the current state (OK, or failing) began; zero before the first round.
	Since time.Time
	// LastSuccess is when a round last succeeded; zero if none has.
	LastSuccess time.Time
	// Synced says whether at least one round succeeded (and so was delivered).
	Synced bool
	// ScrapeInterval is the probe job's scrape interval in use, and ScrapeIntervalFrom where it
	// came from: "config", "prometheus" (its targets API) or "default" (not known yet).
	ScrapeInterval     time.Duration
	ScrapeIntervalFrom string
	// Window is the queries' window in use.
	Window time.Duration
}

// Source polls Prometheus for latency and call rates. Create it with NewSource, run it with Run.
// Status may be called from any goroutine.
//
// Rules, per query round:
//   - A round succeeds only if every query answers with a vector within the size and series
//     caps; otherwise nothing changes downstream (see Run) and Status says why.
//   - Latency is the median RTT over the window's answered probes, the loss ratio beside it
//     (SuccessQuery). A pair that lost more than MaxProbeLoss is unreachable and gets
//     UnreachableMS (reported in the log once per change and in edgeflow_prometheus_unreachable_pairs);
//     a pair without an answered probe and without a success ratio, or without an RTT while its
//     probes were answered, is not measured this round. Nothing missing or failed ever reads 0 ms.
//   - Call rates: per caller → callee pair, the caller's own report (reporter="source") when
//     there is one, else the callee's (reporter="destination"); never the sum of both.
//   - A sample that is infinite, negative or a histogram (or a success ratio above 1, or a NaN
//     where NaN means nothing), or a series without its labels (the node labels, or the four
//     workload labels for calls), is ignored, counted in
//     edgeflow_prometheus_ignored_samples_total and logged once until it is good again. A node
//     pair with From == To is the intra-node latency and is kept.
//   - A series seen before and absent now (or ignored now) keeps its last good value and is
//     marked stale (edgeflow_prometheus_stale_series); Config.StaleAfter after it was last
//     seen it is forgotten: a pair then counts as never measured (see FillLatency), a call edge
//     is dropped. Vanishing, returning and forgetting are logged as one line per round and kind
//     of change, naming the first few series: a flapping series never logs per evaluation.
//   - The window is WindowScrapes scrape intervals of the probe job unless set.
type Source struct {
	cfg     Config
	log     *slog.Logger
	api     v1.API
	client  api.Client
	url     string // Config.URL, redacted
	running atomic.Bool

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

	// Owned by the goroutine running rounds (Run).
	latency      map[Pair]kept
	calls        map[CallEdge]kept
	reported     map[string]bool // ignored series already logged, so each is logged once per streak
	delivered    *Measurements   // the last snapshot delivered (nil before the first)
	scrape       time.Duration   // the probe job's scrape interval in use
	scrapeFrom   string
	scrapeWarned bool
	unreachLog   string // the set of unreachable pairs last logged

	mu     sync.Mutex // guards status
	status Status
}

// kept is a series' last good value and the round that last saw it.
type kept struct {
	value       float64
	loss        float64 // latency: share of probes lost; NaN when not measured
	unreachable bool
	seen        time.Time
	stale       bool
}

// NewSource validates cfg (an error wraps ErrInvalidConfig and names the field), applies the
// defaults and registers the metrics. It starts nothing.
func NewSource(cfg Config) (*Source, error) {
	if err := defaults(&cfg); err != nil {
		return nil, err
	}
	redacted := redact(cfg.URL)
	rt := cfg.RoundTripper
	if rt == nil {
		var err error
		if rt, err = config.NewRoundTripperFromConfig(cfg.HTTP, "edgeflow"); err != nil {
			return nil, fmt.Errorf("%w: Config.HTTP: %w", ErrInvalidConfig, err)
		}
	}
	client, err := api.NewClient(api.Config{Address: cfg.URL, RoundTripper: limitedTransport{rt: rt, max: cfg.MaxResponseBytes}})
	if err != nil {
		return nil, fmt.Errorf("%w: Config.URL %s: %w", ErrInvalidConfig, redacted, err)
	}
	s := &Source{
		cfg:        cfg,
		log:        cfg.Logger,
		api:        v1.NewAPI(client),
		client:     client,
		url:        redacted,
		latency:    map[Pair]kept{},
		calls:      map[CallEdge]kept{},
		reported:   map[string]bool{},
		scrape:     cfg.ScrapeInterval,
		scrapeFrom: "config",
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
	if s.scrape == 0 {
		s.scrape, s.scrapeFrom = DefaultScrapeInterval, "default"
	}
	s.status = Status{Reason: "prom: no query round has run yet", ScrapeInterval: s.scrape, ScrapeIntervalFrom: s.scrapeFrom, Window: s.windowFor()}
	names := []string{queryLatency}
	if cfg.SuccessQuery != DisableSuccess {
		names = append(names, querySuccess)
	}
	if cfg.CallsQuery != DisableCalls {
		names = append(names, queryCalls)
	}
	for _, q := range names { // make every series visible at 0
		s.queries.WithLabelValues(q, "ok")
		s.queries.WithLabelValues(q, "error")
		s.ignored.WithLabelValues(q, reasonBadValue)
		s.ignored.WithLabelValues(q, reasonMissingLabel)
	}
	s.stale.WithLabelValues(queryLatency)
	s.vanished.WithLabelValues(queryLatency)
	if cfg.CallsQuery != DisableCalls {
		s.stale.WithLabelValues(queryCalls)
		s.vanished.WithLabelValues(queryCalls)
	}
	if err := metrics.Register("prom", cfg.Registerer, s.queries, s.lastSuccess, s.up, s.stale, s.ignored, s.deliveries, s.suppressed, s.unreachable, s.window, s.vanished); err != nil {
		return nil, err
	}
	return s, nil
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
		cfg.Clock = time.Now
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

// windowFor is the window of the queries given the scrape interval in use.
func (s *Source) windowFor() time.Duration {
	if s.cfg.Window > 0 {
		return s.cfg.Window
	}
	return WindowScrapes * s.scrape
}

// expand substitutes the placeholders of a query.
func (s *Source) expand(q string, window time.Duration) string {
	return strings.NewReplacer(WindowVar, model.Duration(window).String(), ScrapeIntervalVar, model.Duration(s.scrape).String(), JobVar, s.cfg.ProbeJob,
		SourceLabelVar, s.cfg.SourceLabel, TargetLabelVar, s.cfg.TargetLabel).Replace(q)
}

// Run queries Prometheus at once and then every Config.Interval until ctx is done; then it
// closes its idle connections and returns nil. It calls deliver, on its own goroutine, with a
// new Measurements when the first round succeeds, when the set of measured pairs, unreachable
// pairs or call edges changes (a new series, or a stale one forgotten), or when a value moved
// beyond hysteresis from the value last delivered (so slow drift accumulates and is delivered
// eventually); otherwise it delivers nothing. A series going stale or coming back at the same
// value is not a change. A failed round (Prometheus unreachable, an HTTP or query error, a
// result that is not a vector or is over a cap) delivers nothing, so the last good values stay
// in effect downstream; Status and the metrics report it. deliver must not block for long. Run
// may be called once; the caller stops it by cancelling ctx.
func (s *Source) Run(ctx context.Context, deliver func(*Measurements)) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("prom: Run called twice on one Source")
	}
	if ci, ok := s.client.(api.CloseIdler); ok {
		defer ci.CloseIdleConnections()
	}
	ticker := time.NewTicker(s.cfg.Interval)
	defer ticker.Stop()
	for {
		if m := s.round(ctx); m != nil {
			deliver(m)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// Status reports whether the last query round succeeded, and if not, why and since when.
// It is safe for concurrent use.
func (s *Source) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// URL is Config.URL with its password redacted, for messages.
func (s *Source) URL() string { return s.url }

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

// discoverScrape reads the probe job's scrape interval from Prometheus's targets API, unless it
// is configured or already known.
func (s *Source) discoverScrape(ctx context.Context) {
	if s.scrapeFrom != "default" {
		return
	}
	d, err := s.targetsInterval(ctx)
	if err != nil {
		if !s.scrapeWarned && ctx.Err() == nil {
			s.scrapeWarned = true
			s.log.Warn("prom: the probe job's scrape interval is not known yet; assuming the default", "job", s.cfg.ProbeJob,
				"scrape_interval", s.scrape, "window", s.windowFor(), "reason", err)
		}
		return
	}
	s.scrape, s.scrapeFrom = d, "prometheus"
	s.log.Info("prom: the probe job's scrape interval, from Prometheus's targets", "job", s.cfg.ProbeJob, "scrape_interval", d, "window", s.windowFor())
}

// targetsInterval is the largest scrape interval of the probe job's active targets.
func (s *Source) targetsInterval(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	u := s.client.URL("/api/v1/targets", nil)
	u.RawQuery = url.Values{"state": {"active"}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, err
	}
	resp, body, err := s.client.Do(ctx, req)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /api/v1/targets: %s", resp.Status)
	}
	var r struct {
		Data struct {
			ActiveTargets []struct {
				Labels         map[string]string `json:"labels"`
				ScrapeInterval string            `json:"scrapeInterval"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return 0, fmt.Errorf("GET /api/v1/targets: %w", err)
	}
	var longest time.Duration
	for _, t := range r.Data.ActiveTargets {
		if t.Labels["job"] != s.cfg.ProbeJob || t.ScrapeInterval == "" {
			continue
		}
		d, err := model.ParseDuration(t.ScrapeInterval)
		if err != nil {
			return 0, fmt.Errorf("GET /api/v1/targets: scrapeInterval %q: %w", t.ScrapeInterval, err)
		}
		longest = max(longest, time.Duration(d))
	}
	if longest <= 0 {
		return 0, fmt.Errorf("no active target of job %q with a scrapeInterval", s.cfg.ProbeJob)
	}
	return longest, nil
}

// round runs the queries once and returns the snapshot to deliver, or nil if nothing is to be
// delivered (a failed round, no change, or a change within hysteresis). Only one goroutine
// may run rounds (Run; tests call it directly).
func (s *Source) round(ctx context.Context) *Measurements {
	s.discoverScrape(ctx)
	window := s.windowFor()
	s.window.Set(window.Seconds())
	latVec, latErr := s.query(ctx, queryLatency, s.expand(s.cfg.LatencyQuery, window))
	var sucVec, callVec model.Vector
	var sucErr, callErr error
	if s.cfg.SuccessQuery != DisableSuccess {
		sucVec, sucErr = s.query(ctx, querySuccess, s.expand(s.cfg.SuccessQuery, window))
	}
	if s.cfg.CallsQuery != DisableCalls {
		callVec, callErr = s.query(ctx, queryCalls, s.expand(s.cfg.CallsQuery, window))
	}
	if ctx.Err() != nil {
		return nil // shutting down: not a Prometheus failure
	}
	now := s.cfg.Clock()
	s.mu.Lock()
	s.status.ScrapeInterval, s.status.ScrapeIntervalFrom, s.status.Window = s.scrape, s.scrapeFrom, window
	s.mu.Unlock()
	if err := errors.Join(latErr, sucErr, callErr); err != nil {
		s.fail(now, err)
		return nil
	}

	seen := map[string]bool{}
	lat := s.parseLatency(latVec, sucVec, seen)
	calls := s.parseCalls(callVec, seen)
	s.reported = seen
	m := &Measurements{
		Latency:     map[Pair]float64{},
		Loss:        map[Pair]float64{},
		Unreachable: map[Pair]bool{},
		Stale:       map[Pair]bool{},
		StaleCalls:  map[CallEdge]bool{},
		Window:      window,
		At:          now,
	}
	staleLat := merge(s.log, s.vanished.WithLabelValues(queryLatency), queryLatency, s.latency, lat, now, s.cfg.StaleAfter)
	staleCalls := merge(s.log, s.vanished.WithLabelValues(queryCalls), queryCalls, s.calls, calls, now, s.cfg.StaleAfter)
	for p, k := range s.latency {
		m.Latency[p] = k.value
		if !math.IsNaN(k.loss) {
			m.Loss[p] = k.loss
		}
		if k.unreachable {
			m.Unreachable[p] = true
		}
		if k.stale {
			m.Stale[p] = true
		}
	}
	for e, k := range s.calls {
		m.Calls = append(m.Calls, CallRate{From: e.From, To: e.To, RPS: k.value})
		if k.stale {
			m.StaleCalls[e] = true
		}
	}
	sortCalls(m.Calls)
	s.stale.WithLabelValues(queryLatency).Set(float64(staleLat))
	if s.cfg.CallsQuery != DisableCalls {
		s.stale.WithLabelValues(queryCalls).Set(float64(staleCalls))
	}
	s.reportUnreachable(m)
	if !s.Status().Synced {
		s.log.Info("prom: first answer from Prometheus", "url", s.url, "pairs", len(m.Latency), "call_edges", len(m.Calls), "window", window)
	}
	s.succeed(now)

	deliver, moved := s.changed(s.delivered, m)
	if !deliver {
		if moved {
			s.suppressed.Inc()
		}
		return nil
	}
	s.delivered = m
	s.deliveries.Inc()
	return m
}

// reportUnreachable sets the unreachable-pairs gauge and logs the set when it changed.
func (s *Source) reportUnreachable(m *Measurements) {
	s.unreachable.Set(float64(len(m.Unreachable)))
	pairs := make([]string, 0, len(m.Unreachable))
	for p := range m.Unreachable {
		pairs = append(pairs, p.String())
	}
	slices.Sort(pairs)
	set := strings.Join(pairs, ",")
	if set == s.unreachLog { // logged once per change of the set, not of the loss
		return
	}
	s.unreachLog = set
	desc := DescribeUnreachable(m, 0)
	if desc == "" {
		s.log.Info("prom: no node pair is unreachable any more")
		return
	}
	s.log.Warn("prom: node pairs unreachable (probe loss above the limit); they get the unreachable latency",
		"pairs", desc, "max_probe_loss", s.cfg.MaxProbeLoss, "latency_ms", s.cfg.UnreachableMS)
}

// DescribeUnreachable lists m's unreachable pairs with their loss, sorted ("a→b (loss 60%), …"),
// at most limit of them (0: all) followed by how many more there are; "" when there are none.
func DescribeUnreachable(m *Measurements, limit int) string {
	if m == nil || len(m.Unreachable) == 0 {
		return ""
	}
	pairs := make([]Pair, 0, len(m.Unreachable))
	for p := range m.Unreachable {
		pairs = append(pairs, p)
	}
	slices.SortFunc(pairs, func(a, b Pair) int { return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To)) })
	var b strings.Builder
	for i, p := range pairs {
		if limit > 0 && i == limit {
			fmt.Fprintf(&b, " and %d more", len(pairs)-limit)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (loss %.0f%%)", p, 100*m.Loss[p])
	}
	return b.String()
}

// query runs one instant query and returns its vector.
// A query cut short because ctx is done (shutdown) is not counted.
func (s *Source) query(ctx context.Context, name, q string) (model.Vector, error) {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	v, warnings, _, err := s.api.Query(qctx, q, time.Time{}, v1.WithTimeout(s.cfg.Timeout))
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err == nil {
		vec, ok := v.(model.Vector)
		switch {
		case !ok:
			typ := "none"
			if v != nil {
				typ = v.Type().String()
			}
			err = fmt.Errorf("result type %s, want vector", typ)
		case len(vec) > s.cfg.MaxSeries:
			err = fmt.Errorf("%d series, more than the cap of %d (--prometheus-max-series)", len(vec), s.cfg.MaxSeries)
		default:
			if len(warnings) > 0 {
				s.log.Warn("prom: Prometheus warned about a query", "query", name, "promql", q, "warnings", []string(warnings))
			}
			s.queries.WithLabelValues(name, "ok").Inc()
			return vec, nil
		}
	}
	s.queries.WithLabelValues(name, "error").Inc()
	var apiErr *v1.Error
	if errors.As(err, &apiErr) && strings.TrimSpace(apiErr.Detail) != "" { // the body of an HTTP error
		detail := strings.TrimSpace(apiErr.Detail)
		if len(detail) > maxDetail {
			detail = strings.ToValidUTF8(detail[:maxDetail], "") + "…"
		}
		err = fmt.Errorf("%w (response: %s)", err, detail)
	}
	return nil, fmt.Errorf("%w: %s query %q at %s: %w", ErrQuery, name, q, s.url, err)
}

// maxDetail bounds how much of an HTTP error's body goes into an error message.
const maxDetail = 200

// ErrResponseTooLarge is wrapped by the error of a response over Config.MaxResponseBytes.
var ErrResponseTooLarge = errors.New("prom: response too large")

// limitedTransport cuts every response body at max bytes: reading past it fails with
// ErrResponseTooLarge.
type limitedTransport struct {
	rt  http.RoundTripper
	max int64
}

func (l limitedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.rt.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = &limitedBody{rc: resp.Body, left: l.max, max: l.max}
	return resp, nil
}

// CloseIdleConnections closes the wrapped transport's idle connections.
func (l limitedTransport) CloseIdleConnections() {
	if ci, ok := l.rt.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

type limitedBody struct {
	rc        io.ReadCloser
	left, max int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		if n, err := b.rc.Read(one[:]); n > 0 {
			return 0, fmt.Errorf("%w: more than %d bytes (--prometheus-max-response-bytes)", ErrResponseTooLarge, b.max)
		} else if err != nil {
			return 0, err
		}
		return 0, nil
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }

// fail records a failed round.
func (s *Source) fail(now time.Time, err error) {
	s.up.Set(0)
	s.mu.Lock()
	if s.status.OK || s.status.Since.IsZero() {
		s.status.Since = now
	}
	reason := strings.ReplaceAll(err.Error(), "\n", "; ") // several queries may have failed
	repeated := !s.status.OK && s.status.Reason == reason
	s.status.OK = false
	s.status.Reason = reason
	s.mu.Unlock()
	if !repeated { // logged once per failure streak and reason; the metrics count every round
		s.log.Error("prom: query round failed; the last good measurements stay in effect", "error", err)
	}
}

// succeed records a successful round.
func (s *Source) succeed(now time.Time) {
	s.up.Set(1)
	s.lastSuccess.Set(float64(now.UnixNano()) / 1e9)
	s.mu.Lock()
	if !s.status.OK {
		s.status.Since = now
		if s.status.Synced {
			s.log.Info("prom: queries succeed again", "url", s.url)
		}
	}
	s.status.OK = true
	s.status.Reason = ""
	s.status.LastSuccess = now
	s.status.Synced = true
	s.mu.Unlock()
}

// ignore counts an ignored sample and logs it the first time in a row that the series is bad.
func (s *Source) ignore(seen map[string]bool, query, reason string, metric model.Metric, msg string, args ...any) {
	s.ignored.WithLabelValues(query, reason).Inc()
	key := query + " " + metric.String()
	seen[key] = true
	if !s.reported[key] {
		s.log.Warn(msg, append([]any{"query", query, "series", metric.String()}, args...)...)
	}
}

// pairOf reads a series' node labels; ok is false (the sample counted and logged) without them.
func (s *Source) pairOf(seen map[string]bool, query string, smp *model.Sample) (Pair, bool) {
	from := string(smp.Metric[model.LabelName(s.cfg.SourceLabel)])
	to := string(smp.Metric[model.LabelName(s.cfg.TargetLabel)])
	if from == "" || to == "" {
		s.ignore(seen, query, reasonMissingLabel, smp.Metric, "prom: ignoring a latency series without its node labels",
			"source_label", s.cfg.SourceLabel, "target_label", s.cfg.TargetLabel)
		return Pair{}, false
	}
	return Pair{From: from, To: to}, true
}

// parseLatency combines the RTT and success vectors into one kept value per measured pair (see
// Source's rules). Several series of a pair are averaged.
func (s *Source) parseLatency(latVec, sucVec model.Vector, seen map[string]bool) map[Pair]kept {
	rtt, n := map[Pair]float64{}, map[Pair]int{}
	noAnswer := map[Pair]bool{} // an RTT series that is NaN: no answered probe in the window
	for _, smp := range latVec {
		p, ok := s.pairOf(seen, queryLatency, smp)
		if !ok {
			continue
		}
		v := float64(smp.Value) * s.cfg.LatencyUnit
		switch {
		case smp.Histogram == nil && math.IsNaN(v):
			noAnswer[p] = true
			continue
		case smp.Histogram != nil || math.IsInf(v, 0) || v < 0:
			s.ignore(seen, queryLatency, reasonBadValue, smp.Metric, "prom: ignoring an RTT that is infinite, negative or a histogram", "value", smp.Value.String())
			continue
		}
		rtt[p] += v
		n[p]++
	}
	out := map[Pair]kept{}
	if s.cfg.SuccessQuery == DisableSuccess {
		for p := range rtt {
			out[p] = kept{value: rtt[p] / float64(n[p]), loss: math.NaN()}
		}
		for p := range noAnswer {
			if n[p] == 0 {
				s.ignore(seen, queryLatency, reasonIncomplete, model.Metric{model.LabelName(s.cfg.SourceLabel): model.LabelValue(p.From), model.LabelName(s.cfg.TargetLabel): model.LabelValue(p.To)},
					"prom: a pair has no RTT (NaN) and no success query is configured to say why; not measured")
			}
		}
		return out
	}
	ok, cnt := map[Pair]float64{}, map[Pair]int{}
	for _, smp := range sucVec {
		p, good := s.pairOf(seen, querySuccess, smp)
		if !good {
			continue
		}
		v := float64(smp.Value)
		if smp.Histogram != nil || math.IsNaN(v) || v < 0 || v > 1 {
			s.ignore(seen, querySuccess, reasonBadValue, smp.Metric, "prom: ignoring a probe success ratio outside [0, 1]", "value", smp.Value.String())
			continue
		}
		ok[p] += v
		cnt[p]++
	}
	pairMetric := func(p Pair) model.Metric {
		return model.Metric{model.LabelName(s.cfg.SourceLabel): model.LabelValue(p.From), model.LabelName(s.cfg.TargetLabel): model.LabelValue(p.To)}
	}
	for p, sum := range ok {
		loss := 1 - sum/float64(cnt[p])
		switch {
		case loss > s.cfg.MaxProbeLoss:
			out[p] = kept{value: s.cfg.UnreachableMS, loss: loss, unreachable: true}
		case n[p] > 0:
			out[p] = kept{value: rtt[p] / float64(n[p]), loss: loss}
		default:
			s.ignore(seen, querySuccess, reasonIncomplete, pairMetric(p),
				"prom: a pair answered its probes but has no RTT; not measured this round", "loss", loss)
		}
	}
	for p := range rtt {
		if _, measured := ok[p]; !measured {
			s.ignore(seen, queryLatency, reasonIncomplete, pairMetric(p),
				"prom: a pair has an RTT but no probe success ratio; not measured this round")
		}
	}
	return out
}

// parseCalls turns the calls vector into requests/s per edge, summing several series of an
// edge and reporter, and keeping, of the two reporters, the source's when it reports the edge.
func (s *Source) parseCalls(vec model.Vector, seen map[string]bool) map[CallEdge]kept {
	bySource, byDest, other := map[CallEdge]float64{}, map[CallEdge]float64{}, map[CallEdge]float64{}
	for _, smp := range vec {
		e := CallEdge{
			From: Workload{Name: string(smp.Metric[LabelSourceWorkload]), Namespace: string(smp.Metric[LabelSourceWorkloadNamespace])},
			To:   Workload{Name: string(smp.Metric[LabelDestinationWorkload]), Namespace: string(smp.Metric[LabelDestinationWorkloadNamespace])},
		}
		if e.From.Name == "" || e.From.Namespace == "" || e.To.Name == "" || e.To.Namespace == "" {
			s.ignore(seen, queryCalls, reasonMissingLabel, smp.Metric, "prom: ignoring a call series without its workload labels",
				"labels", []string{LabelSourceWorkload, LabelSourceWorkloadNamespace, LabelDestinationWorkload, LabelDestinationWorkloadNamespace})
			continue
		}
		v := float64(smp.Value)
		if smp.Histogram != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			s.ignore(seen, queryCalls, reasonBadValue, smp.Metric, "prom: ignoring a call rate that is NaN, infinite, negative or a histogram", "value", smp.Value.String())
			continue
		}
		switch r, has := smp.Metric[LabelReporter]; {
		case !has:
			other[e] += v
		case r == "source":
			bySource[e] += v
		case r == "destination":
			byDest[e] += v
		default:
			s.ignore(seen, queryCalls, reasonBadValue, smp.Metric, "prom: ignoring a call series of an unknown reporter (want source or destination)")
		}
	}
	rates := map[CallEdge]kept{}
	add := func(e CallEdge, v float64) {
		k := rates[e]
		k.value += v
		rates[e] = k
	}
	for e, v := range bySource {
		add(e, v)
	}
	for e, v := range byDest {
		if _, dup := bySource[e]; !dup {
			add(e, v)
		}
	}
	for e, v := range other {
		add(e, v)
	}
	return rates
}

// maxLogged is how many series one log line about a round's changes names.
const maxLogged = 5

// merge folds a round's fresh values into known: present series take the new value, absent ones
// keep their last good value and turn stale, and stale ones older than staleAfter are
// forgotten. Each kind of change (back, vanished, forgotten) is logged as one line for the
// round, and vanishings are counted in vanishedTotal. It returns the number of stale series.
func merge[K comparable](log *slog.Logger, vanishedTotal prometheus.Counter, query string, known map[K]kept, fresh map[K]kept, now time.Time, staleAfter time.Duration) int {
	var back, vanished, forgotten []string
	for k, v := range fresh {
		if old, ok := known[k]; ok && old.stale {
			back = append(back, fmt.Sprint(k))
		}
		v.seen, v.stale = now, false
		known[k] = v
	}
	stale := 0
	for k, old := range known {
		if _, ok := fresh[k]; ok {
			continue
		}
		if now.Sub(old.seen) >= staleAfter {
			delete(known, k)
			forgotten = append(forgotten, fmt.Sprint(k))
			continue
		}
		if !old.stale {
			old.stale = true
			known[k] = old
			vanished = append(vanished, fmt.Sprint(k))
		}
		stale++
	}
	vanishedTotal.Add(float64(len(vanished)))
	logChange(log, slog.LevelInfo, "prom: stale series are back", query, back)
	logChange(log, slog.LevelWarn, "prom: series vanished; keeping their last good values", query, vanished)
	logChange(log, slog.LevelWarn, "prom: forgetting stale series", query, forgotten)
	return stale
}

// logChange logs one line for a round's series that changed state, naming the first few.
func logChange(log *slog.Logger, level slog.Level, msg, query string, series []string) {
	if len(series) == 0 {
		return
	}
	slices.Sort(series)
	shown := series[:min(len(series), maxLogged)]
	log.Log(context.Background(), level, msg, "query", query, "count", len(series), "series", shown)
}

// changed says whether next must be delivered, given the snapshot last delivered, and whether
// any value moved at all (to count rounds suppressed by hysteresis).
func (s *Source) changed(prev, next *Measurements) (deliver, moved bool) {
	if prev == nil {
		return true, true
	}
	if len(prev.Latency) != len(next.Latency) || len(prev.Calls) != len(next.Calls) || !maps.Equal(prev.Unreachable, next.Unreachable) {
		return true, true
	}
	beyond := func(old, cur, abs float64) bool {
		d := math.Abs(cur - old)
		if d != 0 {
			moved = true
		}
		return d > abs && d > s.cfg.HysteresisRelative*math.Abs(old)
	}
	for p, cur := range next.Latency {
		old, ok := prev.Latency[p]
		if !ok {
			return true, true
		}
		if beyond(old, cur, s.cfg.HysteresisLatencyMS) {
			deliver = true
		}
	}
	for i, cur := range next.Calls { // both sorted: equal edge sets line up
		old := prev.Calls[i]
		if old.From != cur.From || old.To != cur.To {
			return true, true
		}
		if beyond(old.RPS, cur.RPS, s.cfg.HysteresisRPS) {
			deliver = true
		}
	}
	return deliver, moved
}
