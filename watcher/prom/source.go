// Package prom reads what Prometheus knows about the cluster: node-to-node latency measured by
// blackbox-exporter ICMP probes, and the call rates between workloads from Istio's
// istio_requests_total. A Source polls both queries and delivers an immutable Measurements
// snapshot only when something changed beyond hysteresis; FillLatency turns the measured pairs
// into the full latency list the optimizer takes. It knows nothing of Kubernetes or xDS.
package prom

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
)

// Defaults for the zero fields of Config.
const (
	DefaultInterval            = 2 * time.Second
	DefaultWindow              = 10 * time.Second
	DefaultTimeout             = 5 * time.Second
	DefaultStaleAfter          = 10 * time.Minute
	DefaultLatencyQuery        = `avg_over_time(probe_icmp_duration_seconds{phase="rtt"}[$window])`
	DefaultSourceLabel         = "source_node"
	DefaultTargetLabel         = "target_node"
	DefaultLatencyUnit         = 1000.0 // seconds → ms
	DefaultCallsQuery          = `sum by (source_workload, source_workload_namespace, destination_workload, destination_workload_namespace) (rate(istio_requests_total{reporter="source"}[$window]))`
	DefaultHysteresisRelative  = 0.05
	DefaultHysteresisLatencyMS = 0.5
	DefaultHysteresisRPS       = 1.0
)

// DisableCalls as Config.CallsQuery turns the call-rate query off.
const DisableCalls = "-"

// WindowVar in a query is replaced by Config.Window in Prometheus duration syntax ("10s").
const WindowVar = "$window"

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
	// URL is the Prometheus base URL, e.g. http://prometheus.monitoring:9090 (required).
	URL string
	// RoundTripper carries the HTTP requests (nil means api.DefaultRoundTripper, shared by the
	// process; Run closes its idle connections when it returns).
	RoundTripper http.RoundTripper
	// Interval is how often both queries run (default 2s).
	Interval time.Duration
	// Window is the averaging window of both queries, substituted for $window (default 10s;
	// a whole number of milliseconds).
	Window time.Duration
	// Timeout bounds each query, on the client and as Prometheus's evaluation timeout (default 5s).
	Timeout time.Duration
	// LatencyQuery returns one series per measured (source node, target node) pair, labelled by
	// SourceLabel and TargetLabel, in the unit LatencyUnit converts to ms. Several series for
	// one pair are averaged. Default DefaultLatencyQuery.
	LatencyQuery string
	// SourceLabel and TargetLabel name the probing node and the probed node
	// (default "source_node", "target_node", the documented label convention).
	SourceLabel, TargetLabel string
	// LatencyUnit multiplies the query's values into milliseconds (default 1000: seconds → ms).
	LatencyUnit float64
	// CallsQuery returns requests per second by caller and callee workload, labelled with
	// LabelSourceWorkload, LabelSourceWorkloadNamespace, LabelDestinationWorkload and
	// LabelDestinationWorkloadNamespace; several series for one edge are summed. Default
	// DefaultCallsQuery; DisableCalls ("-") turns the query off.
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
	// value. Pass it to FillLatency for the full matrix.
	Latency map[Pair]float64
	// Stale holds the pairs whose series vanished from the query result (or carried a bad
	// value); their value is the last good answer, kept for Config.StaleAfter.
	Stale map[Pair]bool
	// Calls are the call rates, sorted by caller then callee (namespace, then name),
	// including stale edges kept at their last good rate.
	Calls []CallRate
	// StaleCalls holds the call edges kept at their last good rate.
	StaleCalls map[CallEdge]bool
	// At is when the query round answered (Config.Clock).
	At time.Time
}

// Status is the health of a Source, for readiness checks.
type Status struct {
	// OK says whether the last query round succeeded.
	OK bool
	// Reason says why it did not (the error, naming the query and the URL).
	Reason string
	// Since is when the current state (OK, or failing) began; zero before the first round.
	Since time.Time
	// LastSuccess is when a round last succeeded; zero if none has.
	LastSuccess time.Time
	// Synced says whether at least one round succeeded (and so was delivered).
	Synced bool
}

// Source polls Prometheus for latency and call rates. Create it with NewSource, run it with Run.
// Status may be called from any goroutine.
//
// Rules, per query round:
//   - A round succeeds only if every query answers with a vector; otherwise nothing changes
//     downstream (see Run) and Status says why.
//   - A sample that is NaN, infinite, negative or a histogram, or a series without its labels
//     (the node labels, or the four workload labels for calls), is ignored, counted in
//     edgeflow_prometheus_ignored_samples_total and logged once until it is good again. A node
//     pair with From == To is the intra-node latency and is kept.
//   - A series seen before and absent now (or ignored now) keeps its last good value and is
//     marked stale (edgeflow_prometheus_stale_series); Config.StaleAfter after it was last
//     seen it is forgotten: a pair then counts as never measured (see FillLatency), a call edge
//     is dropped.
type Source struct {
	cfg          Config
	log          *slog.Logger
	api          v1.API
	client       api.Client
	latencyQuery string // with $window substituted
	callsQuery   string // with $window substituted; "" when disabled
	running      atomic.Bool

	queries     *prometheus.CounterVec
	lastSuccess prometheus.Gauge
	up          prometheus.Gauge
	stale       *prometheus.GaugeVec
	ignored     *prometheus.CounterVec
	deliveries  prometheus.Counter
	suppressed  prometheus.Counter

	// Owned by the goroutine running rounds (Run).
	latency   map[Pair]kept
	calls     map[CallEdge]kept
	reported  map[string]bool // ignored series already logged, so each is logged once per streak
	delivered *Measurements   // the last snapshot delivered (nil before the first)

	mu     sync.Mutex // guards status
	status Status
}

// kept is a series' last good value and the round that last saw it.
type kept struct {
	value float64
	seen  time.Time
	stale bool
}

// NewSource validates cfg (an error wraps ErrInvalidConfig and names the field), applies the
// defaults and registers the metrics. It starts nothing.
func NewSource(cfg Config) (*Source, error) {
	if err := defaults(&cfg); err != nil {
		return nil, err
	}
	client, err := api.NewClient(api.Config{Address: cfg.URL, RoundTripper: cfg.RoundTripper})
	if err != nil {
		return nil, fmt.Errorf("%w: Config.URL %q: %w", ErrInvalidConfig, cfg.URL, err)
	}
	window := model.Duration(cfg.Window).String()
	s := &Source{
		cfg:          cfg,
		log:          cfg.Logger,
		api:          v1.NewAPI(client),
		client:       client,
		latencyQuery: strings.ReplaceAll(cfg.LatencyQuery, WindowVar, window),
		latency:      map[Pair]kept{},
		calls:        map[CallEdge]kept{},
		reported:     map[string]bool{},
		status:       Status{Reason: "prom: no query round has run yet"},
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeflow_prometheus_queries_total",
			Help: "Prometheus queries run, by query (latency, calls) and result (ok, error).",
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
			Help: "Samples ignored, by query and reason (bad_value: NaN, infinite, negative or a histogram; missing_label).",
		}, []string{"query", "reason"}),
		deliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeflow_prometheus_deliveries_total",
			Help: "Measurements delivered (first answer, a changed set of pairs or edges, or a change beyond hysteresis).",
		}),
		suppressed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeflow_prometheus_suppressed_changes_total",
			Help: "Query rounds whose values changed, but within hysteresis, so nothing was delivered.",
		}),
	}
	names := []string{queryLatency}
	if cfg.CallsQuery != DisableCalls {
		s.callsQuery = strings.ReplaceAll(cfg.CallsQuery, WindowVar, window)
		names = append(names, queryCalls)
	}
	for _, q := range names { // make every series visible at 0
		s.queries.WithLabelValues(q, "ok")
		s.queries.WithLabelValues(q, "error")
		s.stale.WithLabelValues(q)
		s.ignored.WithLabelValues(q, reasonBadValue)
		s.ignored.WithLabelValues(q, reasonMissingLabel)
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{s.queries, s.lastSuccess, s.up, s.stale, s.ignored, s.deliveries, s.suppressed} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("prom: registering metrics: %w", err)
			}
		}
	}
	return s, nil
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
		return bad("URL", "%v", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return bad("URL", "%q: scheme %q, want http or https", cfg.URL, u.Scheme)
	case u.Host == "":
		return bad("URL", "%q: no host", cfg.URL)
	}
	for _, d := range []struct {
		field string
		v     *time.Duration
		def   time.Duration
	}{
		{"Interval", &cfg.Interval, DefaultInterval},
		{"Window", &cfg.Window, DefaultWindow},
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
	if cfg.LatencyQuery == "" {
		cfg.LatencyQuery = DefaultLatencyQuery
	}
	if strings.TrimSpace(cfg.LatencyQuery) == "" || cfg.LatencyQuery == DisableCalls {
		return bad("LatencyQuery", "%q is not a query", cfg.LatencyQuery)
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
		if !model.UTF8Validation.IsValidLabelName(l) {
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

// Run queries Prometheus at once and then every Config.Interval until ctx is done; then it
// closes its idle connections and returns nil. It calls deliver, on its own goroutine, with a
// new Measurements when the first round succeeds, when the set of measured pairs or call edges
// changes (a new series, or a stale one forgotten), or when a value moved beyond hysteresis
// from the value last delivered (so slow drift accumulates and is delivered eventually);
// otherwise it delivers nothing. A series going stale or coming back at the same value is not
// a change. A failed round (Prometheus unreachable, an HTTP or query error, a result that is
// not a vector) delivers nothing, so the last good values stay in effect downstream; Status
// and the metrics report it. deliver must not block for long. Run may be called once; the
// caller stops it by cancelling ctx.
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

// Query names, as in the metrics' query label.
const (
	queryLatency = "latency"
	queryCalls   = "calls"
)

// Reasons for ignoring a sample, as in the ignored-samples metric's reason label.
const (
	reasonBadValue     = "bad_value"
	reasonMissingLabel = "missing_label"
)

// round runs both queries once and returns the snapshot to deliver, or nil if nothing is to be
// delivered (a failed round, no change, or a change within hysteresis). Only one goroutine
// may run rounds (Run; tests call it directly).
func (s *Source) round(ctx context.Context) *Measurements {
	latVec, latErr := s.query(ctx, queryLatency, s.latencyQuery)
	var callVec model.Vector
	var callErr error
	if s.callsQuery != "" {
		callVec, callErr = s.query(ctx, queryCalls, s.callsQuery)
	}
	if ctx.Err() != nil {
		return nil // shutting down: not a Prometheus failure
	}
	now := s.cfg.Clock()
	if err := errors.Join(latErr, callErr); err != nil {
		s.fail(now, err)
		return nil
	}

	seen := map[string]bool{}
	lat := s.parseLatency(latVec, seen)
	calls := s.parseCalls(callVec, seen)
	s.reported = seen
	m := &Measurements{
		Latency:    map[Pair]float64{},
		Stale:      map[Pair]bool{},
		StaleCalls: map[CallEdge]bool{},
		At:         now,
	}
	staleLat := merge(s.log, queryLatency, s.latency, lat, now, s.cfg.StaleAfter)
	staleCalls := merge(s.log, queryCalls, s.calls, calls, now, s.cfg.StaleAfter)
	for p, k := range s.latency {
		m.Latency[p] = k.value
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
	if s.callsQuery != "" {
		s.stale.WithLabelValues(queryCalls).Set(float64(staleCalls))
	}
	if !s.Status().Synced {
		s.log.Info("prom: first answer from Prometheus", "url", s.cfg.URL, "pairs", len(m.Latency), "call_edges", len(m.Calls))
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
		if !ok {
			typ := "none"
			if v != nil {
				typ = v.Type().String()
			}
			err = fmt.Errorf("result type %s, want vector", typ)
		} else {
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
	return nil, fmt.Errorf("%w: %s query %q at %s: %w", ErrQuery, name, q, s.cfg.URL, err)
}

// maxDetail bounds how much of an HTTP error's body goes into an error message.
const maxDetail = 200

// fail records a failed round.
func (s *Source) fail(now time.Time, err error) {
	s.up.Set(0)
	s.mu.Lock()
	if s.status.OK || s.status.Since.IsZero() {
		s.status.Since = now
	}
	reason := strings.ReplaceAll(err.Error(), "\n", "; ") // both queries may have failed
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
			s.log.Info("prom: queries succeed again", "url", s.cfg.URL)
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

// sampleValue returns a sample's value, or false (having counted and logged it) if the value
// is NaN, infinite, negative or a histogram.
func (s *Source) sampleValue(seen map[string]bool, query string, smp *model.Sample, scale float64) (float64, bool) {
	v := float64(smp.Value) * scale
	if smp.Histogram != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		s.ignore(seen, query, reasonBadValue, smp.Metric, "prom: ignoring a sample that is NaN, infinite, negative or a histogram", "value", smp.Value.String())
		return 0, false
	}
	return v, true
}

// parseLatency turns the latency vector into ms per pair, averaging several series of a pair.
func (s *Source) parseLatency(vec model.Vector, seen map[string]bool) map[Pair]float64 {
	sum := map[Pair]float64{}
	n := map[Pair]int{}
	for _, smp := range vec {
		from := string(smp.Metric[model.LabelName(s.cfg.SourceLabel)])
		to := string(smp.Metric[model.LabelName(s.cfg.TargetLabel)])
		if from == "" || to == "" {
			s.ignore(seen, queryLatency, reasonMissingLabel, smp.Metric, "prom: ignoring a latency series without its node labels",
				"source_label", s.cfg.SourceLabel, "target_label", s.cfg.TargetLabel)
			continue
		}
		v, ok := s.sampleValue(seen, queryLatency, smp, s.cfg.LatencyUnit)
		if !ok {
			continue
		}
		p := Pair{From: from, To: to}
		sum[p] += v
		n[p]++
	}
	for p := range sum {
		sum[p] /= float64(n[p])
	}
	return sum
}

// parseCalls turns the calls vector into requests/s per edge, summing several series of an edge.
func (s *Source) parseCalls(vec model.Vector, seen map[string]bool) map[CallEdge]float64 {
	rates := map[CallEdge]float64{}
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
		v, ok := s.sampleValue(seen, queryCalls, smp, 1)
		if !ok {
			continue
		}
		rates[e] += v
	}
	return rates
}

// merge folds a round's fresh values into known: present series take the new value, absent ones
// keep their last good value and turn stale, and stale ones older than staleAfter are
// forgotten. It returns the number of stale series.
func merge[K comparable](log *slog.Logger, query string, known map[K]kept, fresh map[K]float64, now time.Time, staleAfter time.Duration) int {
	for k, v := range fresh {
		if old, ok := known[k]; ok && old.stale {
			log.Info("prom: a stale series is back", "query", query, "series", fmt.Sprint(k))
		}
		known[k] = kept{value: v, seen: now}
	}
	stale := 0
	for k, old := range known {
		if _, ok := fresh[k]; ok {
			continue
		}
		if now.Sub(old.seen) >= staleAfter {
			delete(known, k)
			log.Warn("prom: forgetting a stale series", "query", query, "series", fmt.Sprint(k), "last_seen", old.seen)
			continue
		}
		if !old.stale {
			old.stale = true
			known[k] = old
			log.Warn("prom: a series vanished; keeping its last good value", "query", query, "series", fmt.Sprint(k), "value", old.value)
		}
		stale++
	}
	return stale
}

// changed says whether next must be delivered, given the snapshot last delivered, and whether
// any value moved at all (to count rounds suppressed by hysteresis).
func (s *Source) changed(prev, next *Measurements) (deliver, moved bool) {
	if prev == nil {
		return true, true
	}
	if len(prev.Latency) != len(next.Latency) || len(prev.Calls) != len(next.Calls) {
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
