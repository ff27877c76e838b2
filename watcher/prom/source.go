// Package prom reads what Prometheus knows about the cluster: node-to-node latency measured by
// blackbox-exporter ICMP probes, the call rates between workloads from Istio's
// istio_requests_total, and each pod's load over a window (requests, inbound and downstream
// time from Istio's metrics, CPU-seconds from cAdvisor's). A Source polls the queries and delivers an immutable Measurements
// snapshot only when something changed beyond hysteresis; FillLatency turns the measured pairs
// into the full latency list the optimizer takes. It knows nothing of Kubernetes or xDS.
package prom

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
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
)

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
	// LoadReason says why the pod-load queries failed in the last round (their failure does
	// not fail the round); empty when they succeeded or are off.
	LoadReason string
	// AttemptsReason says why the call-attempt queries failed in the last round (their
	// failure does not fail the round); empty when they succeeded or are off.
	AttemptsReason string
}

// Source polls Prometheus for latency and call rates. Create it with NewSource, run it with Run;
// LoadHistory, before Run, reads the pod loads of the last windows from Prometheus's history.
// Status may be called from any goroutine.
//
// Rules, per query round:
//   - Each signal stands alone: latency (the latency and success queries), call rates, and each
//     pod-load query. A query that fails (an HTTP or query error, not a vector, over the size or
//     series cap) fails only its signal: its last good values stay, stale, until StaleAfter, and
//     the other signals are read and delivered as usual. The round succeeds (Status.OK) when
//     the latency and calls queries answered; Status.Reason names the failing queries,
//     Status.LoadReason the failing pod-load ones, Status.AttemptsReason the call-attempt ones
//     (a round without them has Measurements.AttemptsRead false: no attempts are kept over).
//   - Inputs no pod can forge. Under a scrape job with honor_labels (a pushgateway, Istio's and
//     the community chart's kubernetes-pods jobs) whatever a pod exposes keeps its labels, job
//     included. So a probe series counts only when it carries every label of its pair's target
//     in Prometheus's own /api/v1/targets (ProbePins PinTargets; reason untrusted in
//     edgeflow_prometheus_ignored_samples_total otherwise), and a node pair with more than one
//     such series in the latency or success answer is contested: such a scrape can add a
//     series, not remove the real one. A contested pair keeps its last trusted value (not
//     stale, never forgotten while contested; absent if it was never measured), is listed in
//     Measurements.Contested and edgeflow_prometheus_contested_series{signal="latency"}, and
//     logged once per change of the set. Likewise a pod whose pod-load series come from more
//     than one scrape (job, instance) keeps its last trusted load (PodLoad.Contested, Stale).
//     A forger that copies every label of the real series exactly, where its job adds none,
//     merges into the real series and is not seen here: the jobs with honor_labels must drop
//     probe_* (docs/security.md).
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
//   - Pod loads (PodLoad) are keyed by the series' namespace and pod labels, several series of a
//     pod (from one scrape) summed; a pod has one while the requests query answers for it, and
//     the other queries' series of other pods are dropped uncounted; a pod without a series in
//     the inbound, downstream or CPU query has 0 there. They follow the rules above (bad
//     samples, stale series, hysteresis) per query, and while there are pod loads a snapshot is
//     delivered at least once per window, within hysteresis or not: each window of load is one
//     more sample for a capacity estimate.
//   - With Config.Namespaces, call edges with an end elsewhere and pods elsewhere are not read.
//   - The window is WindowScrapes scrape intervals of the probe job unless set.
type Source struct {
	cfg     Config
	log     *slog.Logger
	api     v1.API
	client  api.Client
	url     string // Config.URL, redacted
	running atomic.Bool
	// firstRound is closed once Run's first round has ended (FirstRound).
	firstRound chan struct{}

	sourceMetrics

	// Owned by the goroutine running rounds (Run).
	latency       map[Pair]lastGood
	calls         map[CallEdge]lastGood
	load          [loadSignals]map[PodRef]lastGood
	reported      map[string]bool // ignored series already logged, so each is logged once per streak
	delivered     *Measurements   // the last snapshot delivered (nil before the first)
	scrape        time.Duration   // the probe job's scrape interval in use
	scrapeFrom    string
	targetsWarned bool
	unreachLog    string // the set of unreachable pairs last logged
	contestedLog  string // the set of contested pairs last logged
	// pins are the labels of the probe job's active targets by node pair, read at pinsAt
	// (ProbePins PinTargets); namespaces is Config.Namespaces as a set.
	pins           map[Pair][]model.LabelSet
	pinsAt         time.Time
	namespaces     map[string]bool
	contestedPairs map[Pair]bool
	contestedLoad  [loadSignals]map[PodRef]bool

	mu     sync.Mutex // guards status
	status Status
}

// lastGood is a series' last good value, when a round last saw it (seen), and whether it is
// stale (absent from the latest round, or bad in it, and kept at that value).
type lastGood struct {
	value       float64
	loss        float64 // latency: share of probes lost; NaN when not measured
	unreachable bool
	window      time.Duration // pod load: the window the value was measured over
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
		firstRound: make(chan struct{}),
		latency:    map[Pair]lastGood{},
		calls:      map[CallEdge]lastGood{},
		reported:   map[string]bool{},
		scrape:     cfg.ScrapeInterval,
		scrapeFrom: "config",
		namespaces: map[string]bool{},
	}
	for _, ns := range cfg.Namespaces {
		s.namespaces[ns] = true
	}
	for sig := range s.load {
		s.load[sig] = map[PodRef]lastGood{}
	}
	if s.sourceMetrics, err = newSourceMetrics(cfg); err != nil {
		return nil, err
	}
	if s.scrape == 0 {
		s.scrape, s.scrapeFrom = DefaultScrapeInterval, "default"
	}
	s.status = Status{Reason: "prom: no query round has run yet", ScrapeInterval: s.scrape, ScrapeIntervalFrom: s.scrapeFrom, Window: s.windowFor()}
	return s, nil
}

// Run queries Prometheus at once and then every Config.Interval, on Config.Clock's ticker,
// until ctx is done; then it closes its idle connections and returns nil. It calls deliver, on
// its own goroutine, with a new Measurements when the first round succeeds, when the set of
// measured pairs, unreachable pairs, contested pairs or pods, or call edges changes (a new series, or a stale one
// forgotten), or when a value moved beyond hysteresis from the value last delivered (so slow
// drift accumulates and is delivered eventually); otherwise it delivers nothing. A series going
// stale or coming back at the same value is not a change. A round in which every query failed (Prometheus
// unreachable, an HTTP or query error, a result that is not a vector or is over a cap) delivers
// nothing, so the last good values stay in effect downstream; Status and the metrics report it.
// deliver must not block for long. Run may be called once; the caller stops it by cancelling
// ctx.
func (s *Source) Run(ctx context.Context, deliver func(*Measurements)) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("prom: Run called twice on one Source")
	}
	if ci, ok := s.client.(api.CloseIdler); ok {
		defer ci.CloseIdleConnections()
	}
	ticker := s.cfg.Clock.NewTicker(s.cfg.Interval)
	defer ticker.Stop()
	first := true
	for {
		if m := s.round(ctx); m != nil {
			deliver(m)
		}
		if first {
			first = false
			close(s.firstRound)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		}
	}
}

// FirstRound returns a channel closed once Run's first round has ended, after its snapshot, if
// it had one to deliver, was delivered: whether Prometheus answered, failed or timed out. A
// consumer that starts can wait for it rather than act on no measurements for the moment
// before the first answer.
func (s *Source) FirstRound() <-chan struct{} { return s.firstRound }

// Status reports whether the last query round succeeded, and if not, why and since when.
// It is safe for concurrent use.
func (s *Source) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// URL is Config.URL with its password redacted, for messages.
func (s *Source) URL() string { return s.url }

// round runs the queries once and returns the snapshot to deliver, or nil if nothing is to be
// delivered (every signal failed, no change, or a change within hysteresis). Only one
// goroutine may run rounds (Run; tests call it directly). Each signal stands alone: latency
// (the latency and success queries), calls, and each pod-load query; a failed one keeps its
// last good values (stale, forgotten after StaleAfter) and the others are read as usual.
func (s *Source) round(ctx context.Context) *Measurements {
	s.discoverTargets(ctx, s.cfg.Clock.Now())
	window := s.windowFor()
	s.window.Set(window.Seconds())
	latVec, latErr := s.query(ctx, queryLatency, s.expand(s.cfg.LatencyQuery, window), time.Time{})
	var sucVec, callVec model.Vector
	var sucErr, callErr error
	if s.cfg.SuccessQuery != DisableSuccess {
		sucVec, sucErr = s.query(ctx, querySuccess, s.expand(s.cfg.SuccessQuery, window), time.Time{})
	}
	if s.cfg.CallsQuery != DisableCalls {
		callVec, callErr = s.query(ctx, queryCalls, s.expand(s.cfg.CallsQuery, window), time.Time{})
	}
	loadVecs, loadErrs := s.queryLoad(ctx, window)
	attCount, attSecs, attOn, attErr := s.queryAttempts(ctx, window)
	if ctx.Err() != nil {
		return nil // shutting down: not a Prometheus failure
	}
	now := s.cfg.Clock.Now()
	s.mu.Lock()
	s.status.ScrapeInterval, s.status.ScrapeIntervalFrom, s.status.Window = s.scrape, s.scrapeFrom, window
	s.mu.Unlock()
	latOK, callsOK := latErr == nil && sucErr == nil, callErr == nil
	loadOK := false
	for sig, q := range loadQueries(&s.cfg) {
		loadOK = loadOK || (q != DisableLoad && loadErrs[sig] == nil)
	}
	roundErr := errors.Join(latErr, sucErr, callErr)
	if !latOK && (!callsOK || s.cfg.CallsQuery == DisableCalls) && !loadOK {
		s.fail(now, roundErr) // nothing read: nothing to deliver
		s.loadFailed(errors.Join(loadErrs[:]...))
		s.attemptsFailed(attErr)
		return nil
	}

	seen := map[string]bool{}
	for k := range s.reported { // the series of a failed query, not read this round, stay reported
		if !latOK && (strings.HasPrefix(k, queryLatency+" ") || strings.HasPrefix(k, querySuccess+" ")) ||
			!callsOK && strings.HasPrefix(k, queryCalls+" ") {
			seen[k] = true
		}
		if attErr != nil && (strings.HasPrefix(k, queryAttempts+" ") || strings.HasPrefix(k, queryAttemptSeconds+" ")) {
			seen[k] = true
		}
		for sig, name := range loadQueryNames {
			if loadErrs[sig] != nil && strings.HasPrefix(k, name+" ") {
				seen[k] = true
			}
		}
	}
	var staleLat, staleCalls int
	var contested map[Pair]bool
	if latOK {
		var lat map[Pair]lastGood
		lat, contested = s.parseLatency(latVec, sucVec, seen)
		for p := range contested { // the last trusted value stays, not stale
			if last, ok := s.latency[p]; ok {
				lat[p] = last
			}
		}
		staleLat = merge(s.log, s.vanished.WithLabelValues(queryLatency), queryLatency, s.latency, lat, now, s.cfg.StaleAfter)
		s.contested.WithLabelValues(queryLatency).Set(float64(len(contested)))
		s.reportContested(contested)
	} else {
		staleLat = age(s.log, queryLatency, s.latency, now, s.cfg.StaleAfter)
		contested = s.contestedPairs // as last read
	}
	s.contestedPairs = contested
	if callsOK {
		staleCalls = merge(s.log, s.vanished.WithLabelValues(queryCalls), queryCalls, s.calls, s.parseCalls(callVec, seen), now, s.cfg.StaleAfter)
	} else {
		staleCalls = age(s.log, queryCalls, s.calls, now, s.cfg.StaleAfter)
	}
	fresh, contestedLoad := s.parseLoad(loadVecs, window, seen)
	for sig := range loadSignals {
		if loadErrs[sig] != nil {
			fresh[sig] = nil // aged by mergeLoad
			contestedLoad[sig] = s.contestedLoad[sig]
		}
	}
	s.mergeLoad(fresh, contestedLoad, now)
	s.contestedLoad = contestedLoad
	s.loadFailed(errors.Join(loadErrs[:]...))
	s.reported = seen
	m := &Measurements{
		Latency:     map[Pair]float64{},
		Loss:        map[Pair]float64{},
		Unreachable: map[Pair]bool{},
		Stale:       map[Pair]bool{},
		Contested:   map[Pair]bool{},
		StaleCalls:  map[CallEdge]bool{},
		Window:      window,
		At:          now,
	}
	for p := range contested {
		m.Contested[p] = true
	}
	for p, last := range s.latency {
		m.Latency[p] = last.value
		if !math.IsNaN(last.loss) {
			m.Loss[p] = last.loss
		}
		if last.unreachable {
			m.Unreachable[p] = true
		}
		if last.stale {
			m.Stale[p] = true
		}
	}
	for e, last := range s.calls {
		m.Calls = append(m.Calls, CallRate{From: e.From, To: e.To, RPS: last.value})
		if last.stale {
			m.StaleCalls[e] = true
		}
	}
	sortCalls(m.Calls)
	m.Load = s.loads()
	if attOn && attErr == nil {
		m.Attempts, m.AttemptsRead = s.parseAttempts(attCount, attSecs, seen), true
	}
	s.attemptsFailed(attErr)
	s.stale.WithLabelValues(queryLatency).Set(float64(staleLat))
	if s.cfg.CallsQuery != DisableCalls {
		s.stale.WithLabelValues(queryCalls).Set(float64(staleCalls))
	}
	s.reportUnreachable(m)
	if !s.Status().Synced {
		s.log.Info("prom: first answer from Prometheus", "url", s.url, "pairs", len(m.Latency), "call_edges", len(m.Calls), "pod_loads", len(m.Load), "window", window)
	}
	if roundErr != nil {
		s.fail(now, roundErr)
		s.synced()
	} else {
		s.succeed(now)
	}

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

// reportContested logs the set of contested pairs when it changed.
func (s *Source) reportContested(contested map[Pair]bool) {
	pairs := make([]string, 0, len(contested))
	for p := range contested {
		pairs = append(pairs, p.String())
	}
	slices.Sort(pairs)
	set := strings.Join(pairs, ",")
	if set == s.contestedLog {
		return
	}
	s.contestedLog = set
	if set == "" {
		s.log.Info("prom: no node pair is contested any more")
		return
	}
	s.log.Warn("prom: node pairs with more than one probe series (another scrape claims the probe job's labels: a job with honor_labels that does not drop probe_*); they keep their last trusted latency",
		"count", len(pairs), "pairs", pairs[:min(len(pairs), maxLogged)], "job", s.cfg.ProbeJob)
}

// age is merge for a signal whose query failed this round: every value is kept, stale, and
// those last seen StaleAfter ago or more are forgotten (logged). It returns the number of
// stale series. Nothing counts as vanished.
func age[K comparable](log *slog.Logger, query string, known map[K]lastGood, now time.Time, staleAfter time.Duration) int {
	var forgotten []string
	for k, last := range known {
		if now.Sub(last.seen) >= staleAfter {
			delete(known, k)
			forgotten = append(forgotten, fmt.Sprint(k))
			continue
		}
		last.stale = true
		known[k] = last
	}
	logChange(log, slog.LevelWarn, "prom: forgetting stale series", query, forgotten)
	return len(known)
}

// fail records a round in which a latency or calls query failed (err names them).
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
		s.log.Error("prom: queries failed; their signals keep their last good values, the others are read as usual", "error", err)
	}
}

// synced records that a round read at least one signal (a snapshot was made) although
// another failed.
func (s *Source) synced() {
	s.mu.Lock()
	s.status.Synced = true
	s.mu.Unlock()
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

// maxLogged is how many series one log line about a round's changes names.
const maxLogged = 5

// merge folds a round's fresh values into known: present series take the new value, absent ones
// keep their last good value and turn stale, and stale ones older than staleAfter are
// forgotten. Each kind of change (back, vanished, forgotten) is logged as one line for the
// round, and vanishings are counted in vanishedTotal. It returns the number of stale series.
func merge[K comparable](log *slog.Logger, vanishedTotal prometheus.Counter, query string, known map[K]lastGood, fresh map[K]lastGood, now time.Time, staleAfter time.Duration) int {
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
	if len(prev.Latency) != len(next.Latency) || len(prev.Calls) != len(next.Calls) || !maps.Equal(prev.Unreachable, next.Unreachable) ||
		!maps.Equal(prev.Contested, next.Contested) {
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
	loadChanged, samePods := loadMoved(prev.Load, next.Load, beyond, &s.cfg)
	if !samePods || len(next.Load) > 0 && next.At.Sub(prev.At) >= next.Window {
		return true, true // a new pod set, or a window of load since the last delivery
	}
	return deliver || loadChanged, moved
}
