package watcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/internal/latest"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// CallGraph is a call graph given by configuration instead of measured: calls and ingress as
// in a topology file, naming services by key (NAME, or NAME.NAMESPACE).
type CallGraph struct {
	Calls   []optimizer.Call    `json:"calls,omitempty" yaml:"calls,omitempty"`
	Ingress []optimizer.Ingress `json:"ingress,omitempty" yaml:"ingress,omitempty"`
}

// LiveConfig configures a Live source.
type LiveConfig struct {
	// Kube is the Kubernetes source (required).
	Kube *kube.Source
	// Prom is the Prometheus source; nil means no measurements: every node pair is unmeasured
	// and the call graph must be given (CallGraph).
	Prom *prom.Source
	// CallGraph, when non-nil, is the call graph, and Prometheus is asked only for latency.
	CallGraph *CallGraph
	// DefaultLatencyMS is the latency of a node pair never measured; nil means the largest
	// measured latency (prom.FillLatency).
	DefaultLatencyMS *float64
	// Options are how every topology is compiled: as its consumers compile it (the server's
	// options), so that a topology delivered is one they accept.
	Options optimizer.Options
	// Check is validation beyond optimizer.Compile (e.g. xds.CheckTopology); nil means none.
	Check func(*optimizer.Topology) error
	// NodeMatch is how a latency series' node labels name nodes: NodeMatchName (the default:
	// the label is the node's name) or NodeMatchInternalIP (the label is an address, "IP" or
	// "IP:PORT" as a probe's instance is, matched to the node's InternalIP).
	NodeMatch string
	// LatencyGranularity is what the topology's latency is given per: LatencyAuto (or ""): per
	// node while the cluster's ordered node pairs, nodes × (nodes − 1), are at most MaxNodePairs,
	// else per zone; optimizer.LatencyPerNode; or optimizer.LatencyPerZone (see Live's rules).
	LatencyGranularity string
	// MaxNodePairs is LatencyAuto's bound (0 means DefaultMaxNodePairs).
	MaxNodePairs int
	// Estimator, when non-nil with Prom, estimates each pod's capacity from the pod loads of
	// Prom's measurements (capacityFeed), and a pod's Pod.CapacityRPS is its estimate's lower
	// confidence bound (lata-q's utilisation cap applies to it). Run owns it: nothing else may
	// feed it.
	Estimator *estimate.Estimator
	// Breaker, when non-nil with an Estimator and Plan, is the closed loop's model-error
	// breaker: each window of pod loads, per service, lata-q's predicted own time for the plan
	// in force against the measured one; a tripped service's pods get no capacity (it falls
	// back to lata) until it resets (see Live's rules). Run owns its Observe; Checks and the
	// metrics read it.
	Breaker *estimate.Breaker
	// Plan returns the plan in force: the topology of the last publication and its allocation
	// (nil, nil before the first), as xds/server's Server.Publication gives them. Safe for
	// concurrent use; called from Run's merge loop.
	Plan func() (*optimizer.Topology, *optimizer.Allocation)
	// Latency, when non-nil with Prom, is the closed loop's latency correction: each window of
	// Prometheus's call attempts (prom.Config.AttemptsQuery) and pod loads is fed to it, and
	// every topology delivered carries the penalties in force (WithLatencyPenalty; see Live's
	// rules). With Plan, a window in which the plan in force changed is held. Run owns it.
	Latency *estimate.LatencyCorrector
	// CapacityHistoryWindows, with an Estimator and Prom, is how many windows of pod load Run
	// reads from Prometheus's history at start (prom.Source.LoadHistory, before Prom's first
	// round) and feeds the Estimator, oldest first, before the first live window: a process that
	// restarts or takes over starts with the estimates Prometheus's history gives instead of
	// none for the first windows. 0: none.
	CapacityHistoryWindows int
	// FirstRoundWait, with Prom, is how long Run's first topology waits, from Run's start, for
	// Prom's first round (prom.Source.FirstRound: answered, failed or timed out), so that a
	// process that starts does not deliver a topology without measurements in the moment
	// before Prometheus's first answer, which its consumers would act on (serve would push the
	// capacity-weighted plan, every node pair equal, to every client, and then the measured
	// one; or keep the first when the measured plan moves too little to pass its damping). 0:
	// DefaultFirstRoundWait; negative: no wait.
	FirstRoundWait time.Duration
	// Logger and Registerer as elsewhere.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// DefaultFirstRoundWait is LiveConfig.FirstRoundWait's default: a round of a Prometheus that
// answers takes well under a second, and one that hangs costs a query timeout per query.
const DefaultFirstRoundWait = 15 * time.Second

// LatencyAuto is LiveConfig.LatencyGranularity's default: per node up to MaxNodePairs ordered
// node pairs, else per zone.
const LatencyAuto = "auto"

// DefaultMaxNodePairs is LatencyAuto's default bound: 250,000 ordered node pairs, a cluster of
// 500 nodes (500 × 499 = 249,500). There one merge, compile and LATA plan per node took
// 0.12 s, allocated 42 MB and held 12 MiB on the shared 2-core machine of docs/benchmarks/measured.md's
// "Measured" section (BenchmarkZoneScale; at 1,000 nodes 0.88 s, 163 MB, 47 MiB), and the
// prober sends as many ICMP probes per scrape; both grow with nodes², per zone with zones².
const DefaultMaxNodePairs = 250000

// How latency labels name nodes (LiveConfig.NodeMatch).
const (
	NodeMatchName       = "name"
	NodeMatchInternalIP = "internal-ip"
)

// Live merges the Kubernetes and Prometheus sources into one immutable Topology for a
// Listener.
//
// Rules:
//   - Nothing is delivered before the Kubernetes caches synced: never a half-built topology.
//     From then on a topology is always delivered, Prometheus or not (a cold start serves). With
//     CapacityHistoryWindows the first also waits until Prometheus's history of pod load has
//     been read (LoadHistory gives up at the first query that fails: a Prometheus that hangs
//     delays it by a query timeout, two when the probe job's scrape interval is read first).
//     With Prom it also waits for Prometheus's first round, at most FirstRoundWait from Run's
//     start (then it is delivered without measurements, and they follow when they come).
//   - Each source delivers into the Live source without waiting for the other; the merge runs on
//     its own goroutine (Run's, apart from the sources') and delivers only a topology that
//     differs from the last one.
//   - Latency: a series' node labels name nodes by NodeMatch (the node's name, or an address
//     matched to the node's InternalIP). Measured pairs as measured (the mean RTT over answered
//     probes, ms; an unreachable pair at the unreachable latency); a pair never measured gets
//     DefaultLatencyMS, else the largest measured latency (edgeflow_latency_unmeasured_pairs
//     counts them). Stale series keep their last good value (the Prometheus source's rule).
//   - Granularity (LatencyGranularity): per node, the latency list holds every ordered node
//     pair. Per zone (optimizer.ZoneOf: the node's region/zone, or the node itself when it has
//     no zone), it holds every ordered zone pair and the model never holds a node × node
//     matrix: the measured node pairs (the series are still labelled by node — one
//     representative node per zone probes the others') are mapped to their nodes' zones and
//     each zone pair takes the median of its measured node pairs (prom.AggregateLatency; a zone
//     to itself: its pairs of distinct nodes, else its nodes to themselves, else 0); then the
//     missing-pair rule runs over zones. Auto switches at MaxNodePairs; the choice and why is
//     logged when it changes and shown in the latency check.
//   - A label that names no node is an error the operator sees: the latency check fails naming
//     it, edgeflow_watcher_unmatched_total{kind="node"} counts it, one log line per change of
//     the set; its pairs are not used.
//   - No usable latency (Prometheus down or not answered yet, nothing scraped, nothing
//     matched): the topology has every node pair, a node to itself included, at the same
//     latency (prom.FillLatency's rule), so LATA gives each callee pod its capacity share; the
//     latency check says the plan is degraded, and the first measurements replace it.
//   - Call graph (measured): istio_requests_total rates by workload are mapped to managed
//     services through the pods' owners; a call from a workload that backs no managed
//     service is ingress to the callee; a call to one that backs none is ignored; a call that
//     would close a cycle is dropped. Rates become per-request rates r = R(a→b) / Λ(a), Λ(a)
//     measured over the calls kept, so each call kept carries its measured rate.
//   - Partial data never blocks the rest: services without ready endpoints are absent (the
//     Kubernetes source's rule) and calls naming them are dropped and counted. A topology that
//     still fails validation is logged and counted, and the last good one stays.
//   - Prometheus unreachable after a good answer: its source delivers nothing, so the last
//     good topology stays; Checks reports it. A failing Kubernetes watch is reported the same
//     way, with the time it began.
//   - Capacity (with an Estimator): Prometheus's pod loads of managed pods (matched by namespace
//     and pod name; a load naming no such pod is left out and counted in
//     edgeflow_watcher_unmatched_total{kind="pod"}, not an error) feed the estimator one
//     window at a time, each pod's cores its CPU request (kube.State.PodCPU); a pod's
//     Pod.CapacityRPS is its estimate's lower confidence bound, changed only when it moved by
//     more than CapacityHysteresis, and set on a service's pods only when every one of them
//     has an estimate. Stale loads are not fed. Without pod loads the topology is what it is
//     without an estimator.
//   - Capacity history (CapacityHistoryWindows): the windows of pod load Prometheus's history
//     holds are fed, oldest first, with the first Kubernetes state, before the first live
//     snapshot (which the feed skips when it overlaps the last of them); a pod with enough of
//     them (estimate.Config's MinWindows after the first, which only sets the counters' base)
//     has its capacity in the first topology. The breaker judges none of them and none is held:
//     no plan of this process was in force then. One log line says how many windows were fed
//     and how many pods have a capacity.
//   - Model-error breaker (with a Breaker and Plan): each window of pod loads fed, unless the
//     plan in force changed since the last one (a window of two plans), per service, the own
//     time lata-q predicts for the plan in force (optimizer.PredictedOwnTimeMS, on the plan's
//     topology with the capacities in force during the window) against the measured one
//     (Σ (inbound − downstream) / Σ requests over its pods' fresh loads). A tripped service's
//     pods get no capacity, so the plan serves it as lata, until the breaker resets it; each
//     trip and reset is logged once, edgeflow_closed_loop_breaker_tripped{service} is 1 while
//     tripped, and the closed-loop check names the tripped services (readiness does not fail:
//     the plan still serves them, as lata). A window in which the plan in force changed is the
//     hold-down: the capacities in force stay until a window measured under one plan.
//     edgeflow_closed_loop_windows_total{held} counts the live windows fed, held or not.
//   - Latency correction (with Latency): each window of call attempts and pod loads is fed to
//     the corrector by latencyFeed's rules (a caller's attempts to a band's node, less the
//     band's inbound time, less the same-node baseline, less the pair's latency in the merged
//     topology); the topology delivered has each pair's latency plus its penalty in force
//     (WithLatencyPenalty; per-node latency only). edgeflow_closed_loop_latency_penalty_seconds
//     has the penalties in force; a change of the set is logged once. With CapacityHistoryWindows
//     the windows of Prometheus's history (their call attempts and pod loads) are fed first,
//     never held, on the first merged topology's latencies when they are measured: a serve that
//     restarts holds the penalties at once instead of MinWindows windows later.
type Live struct {
	cfg LiveConfig
	log *slog.Logger

	unmeasured prometheus.Gauge
	ignored    *prometheus.GaugeVec
	delivered  prometheus.Counter
	rejected   prometheus.Counter
	unmatched  *prometheus.CounterVec
	noLatency  prometheus.Gauge
	tripped    *prometheus.GaugeVec
	// podCapacity is edgeflow_closed_loop_pod_capacity_rps; capacityPods the NAMESPACE/POD keys
	// it has series of (Run's only).
	podCapacity  *prometheus.GaugeVec
	capacityPods map[string]bool
	// penalty is edgeflow_closed_loop_latency_penalty_seconds (Run's only).
	penalty *prometheus.GaugeVec
	// excess is edgeflow_closed_loop_latency_excess_seconds, set for the pairs in measured
	// (Run's only).
	excess   *prometheus.GaugeVec
	measured map[estimate.NodePair]bool
	// queueScale is edgeflow_closed_loop_queue_scale (Run's only).
	queueScale *prometheus.GaugeVec
	// windows is edgeflow_closed_loop_windows_total, by held (Run's only).
	windows *prometheus.CounterVec

	changed  latest.Signal      // an input changed: deliver merges again
	compiler optimizer.Compiler // Run's only
	capacity *capacityFeed      // Run's only; nil without an Estimator
	latFeed  *latencyFeed       // Run's only; nil without a LatencyCorrector
	podsOff  []string           // Run's only: the pod loads naming no pod of the last feed
	mu       sync.Mutex         // guards kube, meas, current, latency, history
	kube     *kube.State
	meas     *prom.Measurements
	current  *optimizer.Topology
	latency  latencyState // of the last Merge
	history  historyRead  // Prometheus's history of pod load, from Run's start until deliver fed it
	// awaiting: Run's first topology waits for Prometheus's first round (FirstRoundWait).
	awaiting bool
}

// historyRead is Prometheus's history of pod load on its way to the capacity feed
// (LiveConfig.CapacityHistoryWindows): being read, then read and not fed yet.
type historyRead struct {
	reading, read bool
	windows       []*prom.Measurements // oldest first
}

// latencyState is what the last Merge made of the measurements.
type latencyState struct {
	unmatched []string // node labels that name no node, sorted
	usable    bool     // at least one measured pair between known nodes
	merged    bool     // a Merge has run
	unreach   string   // prom.DescribeUnreachable of the measurements
	contested string   // prom.DescribeContested of the measurements
	// granularity is the topology's (optimizer.LatencyPerNode or LatencyPerZone), why says
	// why, as /readyz and the log show it.
	granularity, why string
}

// Reasons a call is left out, the label values of edgeflow_cluster_calls_ignored.
const (
	CallUnmanaged = "unmanaged_callee"
	CallNoService = "no_service"
	CallCycle     = "cycle"
)

// NewLive validates cfg and registers the metrics; it starts nothing.
func NewLive(cfg LiveConfig) (*Live, error) {
	if cfg.Kube == nil {
		return nil, errors.New("watcher: LiveConfig.Kube is nil")
	}
	if cfg.Prom == nil && cfg.CallGraph == nil {
		return nil, errors.New("watcher: without Prometheus the call graph must be given")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch cfg.NodeMatch {
	case "":
		cfg.NodeMatch = NodeMatchName
	case NodeMatchName, NodeMatchInternalIP:
	default:
		return nil, fmt.Errorf("watcher: node match %q: want %s or %s", cfg.NodeMatch, NodeMatchName, NodeMatchInternalIP)
	}
	switch cfg.LatencyGranularity {
	case "":
		cfg.LatencyGranularity = LatencyAuto
	case LatencyAuto, optimizer.LatencyPerNode, optimizer.LatencyPerZone:
	default:
		return nil, fmt.Errorf("watcher: latency granularity %q: want %s, %s or %s", cfg.LatencyGranularity, LatencyAuto, optimizer.LatencyPerNode, optimizer.LatencyPerZone)
	}
	switch {
	case cfg.MaxNodePairs == 0:
		cfg.MaxNodePairs = DefaultMaxNodePairs
	case cfg.MaxNodePairs < 0:
		return nil, fmt.Errorf("watcher: max node pairs %d: want a positive number", cfg.MaxNodePairs)
	}
	if cfg.CapacityHistoryWindows < 0 {
		return nil, fmt.Errorf("watcher: capacity history of %d windows: want 0 (none) or more", cfg.CapacityHistoryWindows)
	}
	if cfg.FirstRoundWait == 0 {
		cfg.FirstRoundWait = DefaultFirstRoundWait
	}
	c := &Live{cfg: cfg, log: cfg.Logger, compiler: optimizer.Compiler{Options: cfg.Options}}
	if cfg.Estimator != nil && cfg.Prom != nil {
		c.capacity = newCapacityFeed(cfg.Estimator, cfg.Breaker, cfg.Plan)
	}
	if cfg.Latency != nil && cfg.Prom != nil {
		c.latFeed = &latencyFeed{corr: cfg.Latency, plan: cfg.Plan}
	}
	if err := c.newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	return c, nil
}

// Current returns the last topology delivered (nil before the first).
func (c *Live) Current() *optimizer.Topology {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current
}

// LatencyUsable says whether the last topology was built from usable latency measurements
// (always true without Prometheus: the latency is then given). Safe for concurrent use.
func (c *Live) LatencyUsable() bool {
	if c.cfg.Prom == nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.latency.usable
}

// Measured returns the last topology delivered when it was built from usable latency (or the
// latency is given, without Prometheus), else nil: what a placement may be decided on (a
// capacity-weighted cold-start topology has every node pair equal, and no placement is better
// than another there). Safe for concurrent use.
func (c *Live) Measured() *optimizer.Topology {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cfg.Prom != nil && !c.latency.usable {
		return nil
	}
	return c.current
}

// Merge builds the topology from one Kubernetes state and one set of measurements (nil: none)
// by the rules of Live (merge, which is pure), then records what it made of them (record): the
// latency state Checks, LatencyUsable and Measured read, the metrics and the log lines. Run
// calls it for each change; it writes neither of its inputs.
//
// A pod that backs several services (a Service and its headless twin select the same pods)
// keeps its name in the first of them (by key) and is listed as "POD@SERVICE" in the others:
// pod names are unique in a topology, and a pod calls as the first service it backs (see
// measuredCalls) while it is called as each. '@' cannot occur in a Kubernetes name.
//
// Merge sets no capacity: Run merges with the capacities the Estimator gives (mergeWith).
func (c *Live) Merge(ks *kube.State, meas *prom.Measurements) *optimizer.Topology {
	return c.mergeWith(ks, meas, nil)
}

// mergeWith is Merge with the pods' estimated capacities (requests/s by NAMESPACE/POD).
func (c *Live) mergeWith(ks *kube.State, meas *prom.Measurements, capacity map[string]float64) *optimizer.Topology {
	t, notes := c.merge(ks, meas, capacity)
	c.record(notes)
	return t
}

// mergeFed feeds one pair of inputs to the capacity feed (feedCapacity) and merges them with the
// capacities and the wait scales in force. Run's only.
func (c *Live) mergeFed(ks *kube.State, meas *prom.Measurements) *optimizer.Topology {
	t := c.mergeWith(ks, meas, c.feedCapacity(ks, meas))
	if c.capacity != nil {
		setQueueScale(t, c.capacity.scale)
	}
	return t
}

// feedCapacity runs the capacity feed on one pair of inputs, and counts and logs its pod loads
// that name no pod of a managed service (edgeflow_watcher_unmatched_total{kind="pod"}, each
// time one appears; not an error: meshes have more servers than edgeflow manages), and logs
// and exports what the model-error breaker did. It returns the capacities in force, without
// the tripped services' (nil without an Estimator). Run's only.
func (c *Live) feedCapacity(ks *kube.State, meas *prom.Measurements) map[string]float64 {
	if c.capacity == nil {
		return nil
	}
	r := c.capacity.feed(ks, meas)
	if !r.fed && r.unmatched == nil {
		return c.capacity.inForce(ks)
	}
	if r.err != nil {
		c.log.Warn("watcher: the capacity estimator left samples out", "error", r.err)
	}
	if r.fed {
		c.windows.WithLabelValues(strconv.FormatBool(r.held)).Inc()
		c.recordCapacities(r.caps)
		c.recordQueueScale()
	}
	if r.judged {
		c.recordBreaker(r)
	}
	fresh := added(c.podsOff, r.unmatched)
	c.unmatched.WithLabelValues("pod").Add(float64(len(fresh)))
	if len(fresh) > 0 {
		c.log.Debug("watcher: pod loads naming no pod of a managed service; left out", "count", len(fresh), "pods", listed(fresh, maxListed))
	}
	c.podsOff = r.unmatched
	return c.capacity.inForce(ks)
}

// recordExcess sets edgeflow_closed_loop_latency_excess_seconds from a round's corrections: the
// estimate of each pair measured in it; the series of a pair no longer measured is deleted.
func (c *Live) recordExcess(round []estimate.LatencyPenalty) {
	now := make(map[estimate.NodePair]bool, len(round))
	for _, lp := range round {
		if lp.Measured {
			now[lp.Pair] = true
			c.excess.WithLabelValues(lp.Pair.From, lp.Pair.To).Set(lp.EstimateMS / 1000)
		}
	}
	for p := range c.measured {
		if !now[p] {
			c.excess.DeleteLabelValues(p.From, p.To)
		}
	}
	c.measured = now
}

// recordPenalties sets edgeflow_closed_loop_latency_penalty_seconds from the penalties in force
// (ms by pair), deleting the series of the pairs in before that have none now, and logs the set.
func (c *Live) recordPenalties(before, after map[estimate.NodePair]float64, held bool) {
	for p := range before {
		if _, ok := after[p]; !ok {
			c.penalty.DeleteLabelValues(p.From, p.To)
		}
	}
	pairs := make([]estimate.NodePair, 0, len(after))
	for p := range after {
		pairs = append(pairs, p)
	}
	slices.SortFunc(pairs, func(a, b estimate.NodePair) int { return strings.Compare(a.String(), b.String()) })
	text := make([]string, 0, len(pairs))
	for _, p := range pairs {
		c.penalty.WithLabelValues(p.From, p.To).Set(after[p] / 1000)
		text = append(text, fmt.Sprintf("%s=%.2fms", p, after[p]))
	}
	c.log.Info("watcher: latency penalties in force changed (ms beyond the pairs' ICMP RTT)", "pairs", listed(text, maxListed), "held", held)
}

// correctLatency runs the latency feed on one pair of inputs and the topology merged from them,
// records what it did (the penalty gauge, a log line when the set in force changed, the
// corrector's complaints), and returns t with the penalties in force. Run's only.
func (c *Live) correctLatency(ks *kube.State, meas *prom.Measurements, t *optimizer.Topology) *optimizer.Topology {
	if c.latFeed == nil {
		return t
	}
	before := c.latFeed.inForce()
	r := c.latFeed.feed(ks, meas, t)
	if r.err != nil {
		c.log.Warn("watcher: the latency corrector left windows out", "error", r.err)
	}
	if r.fed {
		c.recordExcess(r.penalties)
	}
	if r.fed && c.log.Enabled(context.Background(), slog.LevelDebug) {
		est := make([]string, 0, len(r.penalties))
		for _, lp := range r.penalties {
			if lp.Measured {
				est = append(est, fmt.Sprintf("%s=%.2f±%.2fms/%dw/%.0f", lp.Pair, lp.EstimateMS, lp.StdErrMS, lp.Windows, lp.Attempts))
			}
		}
		steps := make([]string, len(r.steps))
		for i, b := range r.steps {
			steps[i] = b.String()
		}
		c.log.Debug("watcher: latency corrector round (pair=estimate±standard error/windows/attempts)", "held", r.held,
			"measured", listed(est, 4*maxListed), "stepped", listed(steps, maxListed))
	}
	after := c.latFeed.inForce()
	if r.fed && !samePenalties(before, after) {
		c.recordPenalties(before, after, r.held)
	}
	if len(after) == 0 {
		return t
	}
	return WithLatencyPenalty(t, c.cfg.DefaultLatencyMS, after)
}

// feedLatencyHistory feeds the windows of Prometheus's history (oldest first) to the latency
// feed before its first live snapshot (latencyFeed.feedHistory: not held), on the first
// merged topology's latencies — only when they are measured (the degraded topology's every
// pair equal is no ICMP to subtract) — and logs how many windows it fed and the penalties in
// force after them. Run's only.
func (c *Live) feedLatencyHistory(ks *kube.State, windows []*prom.Measurements, t *optimizer.Topology) {
	if c.latFeed == nil || len(windows) == 0 {
		return
	}
	if !c.LatencyUsable() {
		c.log.Info("watcher: latency corrector not fed from Prometheus's history: no latency measured yet", "windows_read", len(windows))
		return
	}
	fed := 0
	for _, m := range windows {
		if r := c.latFeed.feedHistory(ks, m, t); r.fed {
			fed++
			if r.err != nil {
				c.log.Warn("watcher: the latency corrector left windows of Prometheus's history out", "at", m.At, "error", r.err)
			}
		}
	}
	c.recordPenalties(nil, c.latFeed.inForce(), false)
	c.log.Info("watcher: latency corrector fed from Prometheus's history", "windows", fed, "windows_read", len(windows),
		"pairs_with_penalty", len(c.latFeed.inForce()))
}

// feedHistory feeds Prometheus's history of pod load (windows, oldest first) to the capacity
// feed before its first live snapshot (capacityFeed.feedHistory: not judged, not held), sets
// edgeflow_closed_loop_pod_capacity_rps from the estimator's last round, and logs how many
// windows were fed and how many pods have a capacity in force. Run's only.
func (c *Live) feedHistory(ks *kube.State, windows []*prom.Measurements) {
	fed := 0
	var caps map[string]estimate.Capacity
	for _, m := range windows {
		r := c.capacity.feedHistory(ks, m)
		if r.err != nil {
			c.log.Warn("watcher: the capacity estimator left samples of Prometheus's history out", "at", m.At, "error", r.err)
		}
		if r.fed {
			fed++
			caps = r.caps
		}
	}
	if caps != nil {
		c.recordCapacities(caps)
		c.recordQueueScale()
	}
	c.log.Info("watcher: capacity estimator fed from Prometheus's history", "windows", fed, "windows_read", len(windows),
		"pods_with_capacity", len(c.capacity.capacity))
}

// recordCapacities sets edgeflow_closed_loop_pod_capacity_rps from one estimator round, and
// deletes the series of pods that no longer have an estimate. O(pods). Run's only.
func (c *Live) recordCapacities(caps map[string]estimate.Capacity) {
	now := make(map[string]bool, len(caps))
	for key, cp := range caps {
		ns, pod, ok := strings.Cut(key, "/")
		if !ok || cp.Source == estimate.SourceNone {
			continue
		}
		now[key] = true
		c.podCapacity.WithLabelValues(ns, pod, boundEstimate).Set(cp.RPS)
		c.podCapacity.WithLabelValues(ns, pod, boundLower).Set(cp.Lower)
	}
	for key := range c.capacityPods {
		if !now[key] {
			ns, pod, _ := strings.Cut(key, "/")
			c.podCapacity.DeleteLabelValues(ns, pod, boundEstimate)
			c.podCapacity.DeleteLabelValues(ns, pod, boundLower)
		}
	}
	c.capacityPods = now
}

// recordQueueScale sets edgeflow_closed_loop_queue_scale to the wait scales in force, and
// deletes the series of the services that have none. Run's only.
func (c *Live) recordQueueScale() {
	c.queueScale.Reset()
	for svc, v := range c.capacity.scale {
		c.queueScale.WithLabelValues(svc).Set(v)
	}
}

// recordBreaker logs each service that tripped or reset in a window, once, and its complaint
// about the window, and sets edgeflow_closed_loop_breaker_tripped of every service it knows.
func (c *Live) recordBreaker(r capacityRound) {
	if r.breakerErr != nil {
		c.log.Warn("watcher: the model-error breaker left response times out", "error", r.breakerErr)
	}
	for _, st := range r.changed {
		if st.Tripped {
			c.log.Warn("watcher: lata-q's model does not describe the service; serving it as lata", "service", st.Service, "reason", st.Reason)
		} else {
			c.log.Info("watcher: lata-q's model describes the service again; planning it with its capacities", "service", st.Service,
				"relative_error", st.RelativeError)
		}
	}
	for _, st := range c.cfg.Breaker.States() {
		v := 0.0
		if st.Tripped {
			v = 1
		}
		c.tripped.WithLabelValues(st.Service).Set(v)
	}
}

// added lists the names of now that are not in before, in now's order. O(len(before) +
// len(now)).
func added(before, now []string) []string {
	was := make(map[string]bool, len(before))
	for _, n := range before {
		was[n] = true
	}
	var fresh []string
	for _, n := range now {
		if !was[n] {
			fresh = append(fresh, n)
		}
	}
	return fresh
}

// record applies what a merge made of its inputs: it sets the latency state (under mu) and the
// metrics, and logs and counts changes of the granularity, of the unmatched names and of the
// degraded plan once per change.
func (c *Live) record(n mergeNotes) {
	c.unmeasured.Set(float64(n.unmeasured))
	for _, r := range []string{CallUnmanaged, CallNoService, CallCycle} {
		c.ignored.WithLabelValues(r).Set(float64(n.ignored[r]))
	}
	ls := n.latency
	c.mu.Lock()
	prev := c.latency
	c.latency = ls
	c.mu.Unlock()
	if prev.granularity != ls.granularity {
		c.log.Info("watcher: "+ls.why, "granularity", ls.granularity)
	}
	if c.cfg.Prom == nil {
		return
	}
	c.unmatched.WithLabelValues("node").Add(float64(len(added(prev.unmatched, ls.unmatched))))
	if !slices.Equal(prev.unmatched, ls.unmatched) {
		if len(ls.unmatched) > 0 {
			c.log.Error("watcher: latency labels name no node; their pairs are not used", "node_match", c.cfg.NodeMatch, "count", len(ls.unmatched), "names", listed(ls.unmatched, maxListed))
		} else if prev.merged {
			c.log.Info("watcher: every latency label names a node again")
		}
	}
	if ls.usable {
		c.noLatency.Set(0)
	} else {
		c.noLatency.Set(1)
	}
	if !prev.merged || prev.usable != ls.usable {
		if ls.usable {
			c.log.Info("watcher: latency measurements in use")
		} else {
			c.log.Warn("watcher: no usable latency measurement; serving the capacity-weighted plan (every node pair equal) until one arrives")
		}
	}
}
