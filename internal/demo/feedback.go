package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/prom"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// The closed-loop row's control loop. In a cluster, edgeflow serve reads the pods' telemetry
// from Prometheus (watcher/prom's pod-load queries) and watcher.Live feeds it to the capacity
// estimator. The demo has no Prometheus: the loop reads every pod's /metrics itself, the same
// series (Istio's request metrics, cAdvisor's CPU usage, grpc-go's attempt durations by
// locality), and feeds the same estimators. It knows only what a cluster would tell it: the
// telemetry and each pod's CPU (its workers, the cores it runs on); never the slow pods or
// nodes, nor the L7 penalties (Config.PodSlowdown, NodeSpeed, L7Penalty).

// DefaultFeedbackWindow is the closed-loop row's estimator window in the demo: short, because a
// demo row has seconds of load, not minutes (a cluster's window is Prometheus's, 4 scrapes).
const DefaultFeedbackWindow = time.Second

// FeedbackEstimator is the estimator configuration of the demo's closed loop: the estimator's
// defaults but for the sample floor, which one-second windows of a demo pod (tens to hundreds
// of requests) would not reach.
var FeedbackEstimator = estimate.Config{MinRequests: 30}

// FeedbackBreaker is the model-error breaker of the demo's closed loop: the breaker's defaults
// but for the sample floor, FeedbackEstimator's.
var FeedbackBreaker = estimate.BreakerConfig{MinRequests: FeedbackEstimator.MinRequests}

// FeedbackLatency is the latency correction of the demo's closed loop: the corrector's
// defaults but for the sample floor, FeedbackEstimator's, and more windows: a demo window is a
// second, tens of attempts on a pair, and an attempt's time (a callee's queueing and downstream
// calls) varies by 5–10 ms. A pair's attempts sample their bands' inbound times, so an
// estimate from 4 windows (about 400 attempts) was off by 0.6 ms (one standard deviation, in
// TestClosedLoopRoutesAroundL7Penalty's world); and once a penalty is in force the plan moves
// the pair's traffic away and its windows thin, so the first estimate must rest on enough:
// 8 windows to measure, 16 to sum.
var FeedbackLatency = estimate.LatencyConfig{MinRequests: FeedbackEstimator.MinRequests, Windows: 16, MinWindows: 8}

// feedback is one closed-loop stack's loop: each window it reads the pods' counters, runs an
// estimator round, and when a pod's capacity in force moved (by watcher.CapacityHysteresis)
// hands the xDS server the topology with the capacities in force; the server's planner
// (closed-loop) steps toward lata-q's plan. After a window in which the server published a new
// plan, the next window's data mixes two plans: the loop holds that window (it observes but
// does not update), the hold-down of one estimator window.
//
// Each window that is not held, the model-error breaker compares, per service, the own time
// lata-q predicts for the plan in force (optimizer.PredictedOwnTimeMS on the publication's
// topology with the capacities in force) with the one measured in the window (Σ (inbound −
// downstream) / Σ requests over the service's pods, from the counters the estimator gets). A
// tripped service falls back to lata: the topology handed to the server gives its pods no
// capacity (all of them, as watcher.WithCapacity does), until the breaker resets it.
//
// Each window that is not held, the latency corrector (estimate.LatencyCorrector) takes the
// callers' attempt times by callee band (grpc_client_attempt_duration_seconds by
// grpc_lb_locality, whose zone is the callee's node under the bands policy) and the callees'
// inbound times, against the stack's topology's latencies (the ICMP RTTs the plan knows); the
// topology handed to the server carries the penalties in force (watcher.WithLatencyPenalty), so
// the closed-loop plan's cost is ICMP + penalty. Only the closed-loop row has this loop: the
// other rows plan on ICMP.
type feedback struct {
	srv     *xdsserver.Server
	base    *optimizer.Topology // the stack's topology, without capacities
	opts    optimizer.Options   // base's compile options (its default latency)
	icmp    *optimizer.Model    // base compiled: the latencies the plan knows
	urls    map[string]string   // pod → its /metrics
	pods    map[string]podFacts // pod → what the cluster knows of it
	targets map[string]string   // a callee's gRPC target (xds:///NAME) → its service key
	est     *estimate.Estimator
	breaker *estimate.Breaker
	latency *estimate.LatencyCorrector // nil: no correction (Scenario.NoLatencyCorrection)
	log     *slog.Logger
	window  time.Duration
	client  *http.Client

	capacity  map[string]float64            // in force, by pod: the lower confidence bound, requests/s
	sent      map[string]float64            // the capacities last handed to the server, by pod (tripped services' left out)
	penalty   map[estimate.NodePair]float64 // the L7 penalties in force, ms (positive ones only)
	sentPen   map[estimate.NodePair]float64 // the penalties last handed to the server
	counters  map[string]estimate.Sample    // by pod: the last counters read (the window's base)
	attempts  map[attemptKey]attemptCount   // by caller pod and series: the last attempt counters read
	published *optimizer.Allocation

	mu     sync.Mutex
	rounds []FeedbackRound
}

type podFacts struct {
	service, namespace, node string
	cores                    float64
}

// attemptKey is one series of a caller pod's attempt durations: the callee's target and
// locality (grpc_target, grpc_lb_locality).
type attemptKey struct{ pod, target, locality string }

// attemptCount is an attempt-duration histogram's count and sum (in ms).
type attemptCount struct{ n, ms float64 }

// podScrape is what one pod's /metrics gave: its estimator sample and its attempt counters.
type podScrape struct {
	sample   estimate.Sample
	attempts map[attemptKey]attemptCount
}

// FeedbackRound is one window of the demo's closed loop, for the report.
type FeedbackRound struct {
	At time.Duration // since the loop started
	// Estimate is the estimated service rate μ of each pod measured in this round (from its
	// own windows; requests/s). Lower is the lower confidence bound the plan uses, of every pod
	// with an estimate (measured, or its service's median).
	Estimate, Lower map[string]float64
	// Requests is the number of requests each measured pod's estimate rests on.
	Requests map[string]float64
	// Updated says the topology went to the server; Held that the window was held down (the
	// server had published in the window before).
	Updated, Held bool
	// Response is the window's own time per service, predicted for the plan in force and
	// measured (nil in a held window: the breaker does not judge a window of two plans).
	Response []estimate.ResponseTime
	// Breaker is every service's breaker after the window, sorted by service; Tripped names
	// the tripped ones (served as lata).
	Breaker []estimate.BreakerState
	Tripped []string
	// Plan is the allocation in force at the end of the window (the server's last
	// publication, before this window's update).
	Plan *optimizer.Allocation
	// Latency is the latency corrector's view after the window: every node pair it has data
	// or a penalty in force for. Penalty is the penalties in force (ms, positive ones only):
	// what the topology handed to the server adds to the ICMP RTTs.
	Latency []estimate.LatencyPenalty
	Penalty map[estimate.NodePair]float64
	// Err is the estimator's or a scrape's complaint ("" if none).
	Err string
}

func newFeedback(srv *xdsserver.Server, base *optimizer.Topology, opts optimizer.Options, c *Cluster, workers int, window time.Duration,
	logger *slog.Logger) (*feedback, error) {
	est, err := estimate.New(FeedbackEstimator)
	if err != nil {
		return nil, err
	}
	breaker, err := estimate.NewBreaker(FeedbackBreaker)
	if err != nil {
		return nil, err
	}
	latency, err := estimate.NewLatencyCorrector(FeedbackLatency)
	if err != nil {
		return nil, err
	}
	icmp, err := optimizer.Compile(base, opts)
	if err != nil {
		return nil, err
	}
	if window <= 0 {
		window = DefaultFeedbackWindow
	}
	f := &feedback{srv: srv, base: base, opts: opts, icmp: icmp, urls: c.MetricsURLs(), pods: map[string]podFacts{}, targets: map[string]string{},
		est: est, breaker: breaker, latency: latency, log: logger, window: window, client: &http.Client{Timeout: window},
		capacity: map[string]float64{}, sent: map[string]float64{}, penalty: map[estimate.NodePair]float64{},
		sentPen: map[estimate.NodePair]float64{}, counters: map[string]estimate.Sample{}, attempts: map[attemptKey]attemptCount{}}
	for _, s := range base.Services {
		f.targets["xds:///"+s.Key()] = s.Key() // the Listener is named after the service (xds.ListenerName)
		for _, p := range s.Pods {
			f.pods[p.Name] = podFacts{service: s.Key(), namespace: s.Namespace, node: p.Node, cores: float64(workers)}
		}
	}
	return f, nil
}

// run loops until ctx is done; it returns nil then. It is owned by the Stack.
func (f *feedback) run(ctx context.Context) error {
	start := time.Now()
	t := time.NewTicker(f.window)
	defer t.Stop()
	f.published = f.srv.Allocation()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			r := f.round(ctx, now, now.Sub(start))
			f.mu.Lock()
			f.rounds = append(f.rounds, r)
			f.mu.Unlock()
		}
	}
}

// Rounds returns the windows so far. Safe for concurrent use.
func (f *feedback) Rounds() []FeedbackRound {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.rounds)
}

// round is one window: scrape, estimate, judge the model (the breaker), update unless held.
func (f *feedback) round(ctx context.Context, now time.Time, at time.Duration) FeedbackRound {
	r := FeedbackRound{At: at}
	scrapes, err := f.scrape(ctx)
	if err != nil {
		r.Err = err.Error()
	}
	samples := make([]estimate.Sample, len(scrapes))
	for i, s := range scrapes {
		samples[i] = s.sample
	}
	paths := f.attemptWindows(scrapes)
	windows := f.podWindows(samples)
	own := ownTime(windows)
	caps, err := f.est.Observe(now, samples)
	if err != nil && r.Err == "" {
		r.Err = err.Error()
	}
	r.Estimate, r.Lower, r.Requests = map[string]float64{}, map[string]float64{}, map[string]float64{}
	next := watcher.CapacitiesInForce(caps, f.capacity)
	for pod, c := range caps {
		if _, usable := next[pod]; !usable {
			continue
		}
		r.Lower[pod] = c.Lower
		if c.Source == estimate.SourceMeasured {
			r.Estimate[pod], r.Requests[pod] = c.RPS, c.Requests
		}
	}
	_, topo, plan := f.srv.Publication()
	r.Plan = plan
	held := plan != f.published
	// A held window mixes two plans, and the callers opened the bands the new plan weights in
	// it (their first attempts wait for the connections): the corrector takes it as an idle
	// round, which changes nothing.
	bands := f.bandWindows(windows)
	if held {
		paths, bands = nil, nil
	}
	if f.latency != nil {
		r.Latency, err = f.latency.Observe(paths, bands, f.icmpRTT)
		if err != nil && r.Err == "" {
			r.Err = err.Error()
		}
	}
	penalty := map[estimate.NodePair]float64{}
	for _, lp := range r.Latency {
		if lp.PenaltyMS > 0 {
			penalty[lp.Pair] = lp.PenaltyMS
		}
	}
	f.penalty, r.Penalty = penalty, penalty
	if !held && topo != nil {
		// The plan in force ran the whole window: judge lata-q's model of it, on the
		// capacities in force in the window (a tripped service's too, so that the breaker can
		// see the model become right again).
		r.Response = watcher.ResponseTimes(topo, plan, keyed(f.capacity, f.pods), own)
		changed, err := f.breaker.Observe(r.Response)
		if err != nil && r.Err == "" {
			r.Err = err.Error()
		}
		logBreaker(f.log, changed)
	}
	r.Breaker, r.Tripped = f.breaker.States(), f.breaker.Tripped()
	f.capacity = next
	if held {
		f.published, r.Held = plan, true
		return r
	}
	send := withoutServices(next, f.pods, r.Tripped)
	if !maps.Equal(f.sent, send) || !maps.Equal(f.sentPen, f.penalty) {
		f.sent, f.sentPen = send, f.penalty
		f.srv.Update(watcher.WithLatencyPenalty(watcher.WithCapacity(f.base, keyed(send, f.pods)), f.opts.DefaultLatencyMS, f.penalty))
		r.Updated = true
	}
	return r
}

// icmpRTT is the latency the stack's topology gives a node pair: the ICMP RTT the plan knows.
func (f *feedback) icmpRTT(p estimate.NodePair) (float64, bool) {
	u, ok := f.icmp.NodeIndex(p.From)
	v, ok2 := f.icmp.NodeIndex(p.To)
	if !ok || !ok2 {
		return 0, false
	}
	return f.icmp.Latency.At(u, v), true
}

// attemptWindows takes one window's attempt counters: per caller pod and series, the attempts
// completed since the counters last read (the base), as a path from the caller's node to the
// callee band's node (the locality's zone) into the target's service; and makes these the
// base. A series read for the first time, or whose counters went down, has no window; so has
// one whose target is no service of the topology or whose locality names no node (the failover
// or all-pods locality).
func (f *feedback) attemptWindows(scrapes []podScrape) []estimate.PathWindow {
	var out []estimate.PathWindow
	for _, s := range scrapes {
		for k, c := range s.attempts {
			b, ok := f.attempts[k]
			f.attempts[k] = c
			n, ms := c.n-b.n, c.ms-b.ms
			if !ok || n <= 0 || ms < 0 {
				continue
			}
			svc, known := f.targets[k.target]
			loc, err := prom.ParseGRPCLocality(k.locality)
			if !known || err != nil || loc.Zone == "" {
				continue
			}
			out = append(out, estimate.PathWindow{Pair: estimate.NodePair{From: f.pods[k.pod].node, To: loc.Zone}, Service: svc,
				Attempts: n, AttemptMS: ms})
		}
	}
	return out
}

// bandWindows is one window's inbound requests of every pod with a window, as the latency
// corrector takes them (the pod's service and node).
func (f *feedback) bandWindows(windows []estimate.Sample) []estimate.BandWindow {
	out := make([]estimate.BandWindow, 0, len(windows))
	for _, w := range windows {
		out = append(out, estimate.BandWindow{Service: w.Service, Node: f.pods[w.Pod].node, Requests: w.Requests, InboundMS: w.InboundMS})
	}
	return out
}

// podWindows takes one window's counters: it returns each pod's requests, inbound and
// downstream time since the counters last read (the base), and makes these the base. A pod
// read for the first time, or whose counters went down (a restart), has no window.
func (f *feedback) podWindows(samples []estimate.Sample) []estimate.Sample {
	var out []estimate.Sample
	for _, s := range samples {
		b, ok := f.counters[s.Pod]
		f.counters[s.Pod] = s
		w := s
		w.Requests, w.InboundMS, w.DownstreamMS = s.Requests-b.Requests, s.InboundMS-b.InboundMS, s.DownstreamMS-b.DownstreamMS
		if !ok || w.Requests < 0 || w.InboundMS < 0 || w.DownstreamMS < 0 {
			continue
		}
		out = append(out, w)
	}
	return out
}

// ownTime returns, per service, the own time its pods spent on the requests of their windows.
func ownTime(windows []estimate.Sample) map[string]watcher.OwnTime {
	out := map[string]watcher.OwnTime{}
	for _, w := range windows {
		t := out[w.Service]
		t.Add(w.Requests, w.InboundMS, w.DownstreamMS)
		out[w.Service] = t
	}
	return out
}

// logBreaker logs each service that tripped or reset, once.
func logBreaker(log *slog.Logger, changed []estimate.BreakerState) {
	for _, st := range changed {
		if st.Tripped {
			log.Warn("closed loop: lata-q's model does not describe the service; serving it as lata", "service", st.Service, "reason", st.Reason)
		} else {
			log.Info("closed loop: lata-q's model describes the service again; planning it with its capacities", "service", st.Service,
				"relative_error", st.RelativeError)
		}
	}
}

// withoutServices returns the capacities of the pods whose service is not in services.
func withoutServices(c map[string]float64, pods map[string]podFacts, services []string) map[string]float64 {
	out := make(map[string]float64, len(c))
	for pod, v := range c {
		if !slices.Contains(services, pods[pod].service) {
			out[pod] = v
		}
	}
	return out
}

// keyed maps capacities by pod name to NAMESPACE/POD, as watcher.WithCapacity takes them.
func keyed(c map[string]float64, pods map[string]podFacts) map[string]float64 {
	out := make(map[string]float64, len(c))
	for pod, v := range c {
		ns := pods[pod].namespace
		if ns == "" {
			ns = optimizer.DefaultNamespace
		}
		out[ns+"/"+pod] = v
	}
	return out
}

// scrape reads every pod's counters, all pods at once (as Prometheus scrapes its targets: a round
// takes the slowest pod's time, not the sum); a pod whose /metrics fails is left out of the round
// (the estimator keeps its history) and named in the error.
func (f *feedback) scrape(ctx context.Context) ([]podScrape, error) {
	names := make([]string, 0, len(f.urls))
	for pod := range f.urls {
		names = append(names, pod)
	}
	sort.Strings(names)
	scrapes, errs := make([]podScrape, len(names)), make([]error, len(names))
	var wg sync.WaitGroup
	for i, pod := range names {
		wg.Go(func() { scrapes[i], errs[i] = f.scrapePod(ctx, pod) })
	}
	wg.Wait()
	var out []podScrape
	var failed []string
	for i, pod := range names {
		if errs[i] != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", pod, errs[i]))
			continue
		}
		out = append(out, scrapes[i])
	}
	if len(failed) > 0 {
		return out, fmt.Errorf("demo: closed loop: reading /metrics of %v", failed)
	}
	return out, nil
}

func (f *feedback) scrapePod(ctx context.Context, pod string) (podScrape, error) {
	facts := f.pods[pod]
	s := podScrape{sample: estimate.Sample{Pod: pod, Service: facts.service, Cores: facts.cores}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.urls[pod], nil)
	if err != nil {
		return s, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		return s, fmt.Errorf("HTTP %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return s, err
	}
	s.sample.Requests = sumWhere(mfs["istio_requests_total"], "reporter", "destination", counterValue)
	s.sample.InboundMS = sumWhere(mfs["istio_request_duration_milliseconds"], "reporter", "destination", histogramSum)
	s.sample.DownstreamMS = sumWhere(mfs["istio_request_duration_milliseconds"], "reporter", "source", histogramSum)
	s.sample.CPUSeconds = sumWhere(mfs["container_cpu_usage_seconds_total"], "", "", counterValue)
	s.attempts = map[attemptKey]attemptCount{}
	for _, m := range mfs["grpc_client_attempt_duration_seconds"].GetMetric() {
		if !hasLabel(m, "grpc_status", "OK") { // a failed attempt may never have reached the callee
			continue
		}
		k := attemptKey{pod: pod, target: labelValue(m, "grpc_target"), locality: labelValue(m, "grpc_lb_locality")}
		c := s.attempts[k]
		c.n += float64(m.GetHistogram().GetSampleCount())
		c.ms += 1000 * m.GetHistogram().GetSampleSum()
		s.attempts[k] = c
	}
	return s, nil
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func counterValue(m *dto.Metric) float64 { return m.GetCounter().GetValue() }
func histogramSum(m *dto.Metric) float64 { return m.GetHistogram().GetSampleSum() }

// sumWhere sums value over mf's series whose label name has the value want (name "": all).
func sumWhere(mf *dto.MetricFamily, name, want string, value func(*dto.Metric) float64) float64 {
	var sum float64
	for _, m := range mf.GetMetric() {
		if name != "" && !hasLabel(m, name, want) {
			continue
		}
		sum += value(m)
	}
	return sum
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}
