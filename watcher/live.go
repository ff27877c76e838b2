package watcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/internal/metrics"
	"github.com/edgeflow/edgeflow/optimizer"
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
	// Clock is the time source (nil means time.Now).
	Clock func() time.Time
	// Logger and Registerer as elsewhere.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// LatencyAuto is LiveConfig.LatencyGranularity's default: per node up to MaxNodePairs ordered
// node pairs, else per zone.
const LatencyAuto = "auto"

// DefaultMaxNodePairs is LatencyAuto's default bound: 250,000 ordered node pairs, a cluster of
// 500 nodes (500 × 499 = 249,500). There one merge, compile and LATA plan per node took
// 0.12 s, allocated 42 MB and held 12 MiB on the shared 2-core machine of the README's
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
//     From then on a topology is always delivered, Prometheus or not (a cold start serves).
//   - Each source delivers into the Live source without waiting for the other; the merge runs on
//     its own goroutine and delivers only a topology that differs from the last one.
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
type Live struct {
	cfg LiveConfig
	log *slog.Logger

	unmeasured prometheus.Gauge
	ignored    *prometheus.GaugeVec
	delivered  prometheus.Counter
	rejected   prometheus.Counter
	unmatched  *prometheus.CounterVec
	noLatency  prometheus.Gauge

	changed  chan struct{}
	compiler optimizer.Compiler // Run's only
	mu       sync.Mutex         // guards kube, meas, current, latency
	kube     *kube.State
	meas     *prom.Measurements
	current  *optimizer.Topology
	latency  latencyState // of the last Merge
}

// latencyState is what the last Merge made of the measurements.
type latencyState struct {
	unmatched []string // node labels that name no node, sorted
	usable    bool     // at least one measured pair between known nodes
	merged    bool     // a Merge has run
	unreach   string   // prom.DescribeUnreachable of the measurements
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
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	c := &Live{cfg: cfg, log: cfg.Logger, changed: make(chan struct{}, 1), compiler: optimizer.Compiler{Options: cfg.Options},
		unmeasured: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgeflow_latency_unmeasured_pairs",
			Help: "Node pairs (unordered; zone pairs when the latency is per zone) with no latency measurement, given the default latency or the largest measured one."}),
		ignored: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "edgeflow_cluster_calls_ignored",
			Help: "Measured or configured call edges left out of the current topology, by reason."}, []string{"reason"}),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeflow_cluster_topologies_total",
			Help: "Topologies merged from the cluster sources and delivered."}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeflow_cluster_rejected_topologies_total",
			Help: "Merged topologies that failed validation; the last good one stayed."}),
		unmatched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edgeflow_watcher_unmatched_total",
			Help: "Names in the measurements that match no Kubernetes object, counted each time one appears, by kind (node)."}, []string{"kind"}),
		noLatency: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgeflow_watcher_degraded_plan",
			Help: "1 while the topology has no usable latency and the capacity-weighted plan (every node pair equal) is served."}),
	}
	c.unmatched.WithLabelValues("node")
	if err := metrics.Register("watcher", cfg.Registerer, c.unmeasured, c.ignored, c.delivered, c.rejected, c.unmatched, c.noLatency); err != nil {
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

// Check is the state of one input, for /readyz.
type Check struct {
	Name string
	OK   bool
	// Message says what is wrong (or, when OK, a short state).
	Message string
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

// Checks reports each input's state: kubernetes (synced, watches failing), prometheus (the
// last query round) and latency (names that match no node, the degraded plan, unreachable
// pairs). It is safe for concurrent use.
func (c *Live) Checks() []Check {
	k := Check{Name: "kubernetes", OK: c.cfg.Kube.Synced(), Message: "informer caches synced"}
	if !k.OK {
		k.Message = "informer caches not synced yet"
	}
	if fails := c.cfg.Kube.WatchFailures(); len(fails) > 0 {
		k.OK = false
		var parts []string
		for _, f := range fails {
			parts = append(parts, fmt.Sprintf("%s: failing since %s: %v", f.Informer, f.Since.Format(time.RFC3339), f.Err))
		}
		k.Message = strings.Join(parts, "; ") + "; serving the last known state"
	}
	checks := []Check{k}
	if c.cfg.Prom == nil {
		return checks
	}
	st := c.cfg.Prom.Status()
	ck := Check{Name: "prometheus", OK: st.OK, Message: fmt.Sprintf("%s: last query %s; window %v (scrape interval %v, %s)",
		c.cfg.Prom.URL(), st.LastSuccess.Format(time.RFC3339), st.Window, st.ScrapeInterval, st.ScrapeIntervalFrom)}
	if !st.OK {
		ck.Message = st.Reason
		if !st.Since.IsZero() {
			ck.Message += fmt.Sprintf(" (failing since %s", st.Since.Format(time.RFC3339))
			if st.Synced {
				ck.Message += "; serving the last good weights"
			}
			ck.Message += ")"
		}
	}
	checks = append(checks, ck)
	c.mu.Lock()
	ls := c.latency
	c.mu.Unlock()
	if !ls.merged {
		return checks
	}
	lat := Check{Name: "latency", OK: true, Message: "measured"}
	var problems []string
	if len(ls.unmatched) > 0 {
		problems = append(problems, fmt.Sprintf("latency labels naming no node (--node-match=%s): %s", c.cfg.NodeMatch, strings.Join(ls.unmatched, ", ")))
	}
	if !ls.usable {
		problems = append(problems, "no usable latency measurement: serving the capacity-weighted plan (every node pair equal) until one arrives")
	}
	if len(problems) > 0 {
		lat.OK, lat.Message = false, strings.Join(problems, "; ")
	}
	if ls.unreach != "" {
		lat.Message += "; unreachable pairs (at the unreachable latency): " + ls.unreach
	}
	lat.Message += "; " + ls.why
	return append(checks, lat)
}

func (c *Live) poke() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// Run runs the sources and delivers merged topologies to l until ctx is done (then it returns
// nil, after every goroutine it started has ended), or until a source fails (its error).
func (c *Live) Run(ctx context.Context, l Listener) error {
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := c.cfg.Kube.Run(ctx, func(st *kube.State) {
			c.mu.Lock()
			c.kube = st
			c.mu.Unlock()
			c.poke()
		})
		if err != nil {
			cancel(err)
		}
	}()
	if c.cfg.Prom != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.cfg.Prom.Run(ctx, func(m *prom.Measurements) {
				c.mu.Lock()
				c.meas = m
				c.mu.Unlock()
				c.poke()
			})
			if err != nil {
				cancel(err)
			}
		}()
	}
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			if parent.Err() != nil {
				return nil // the caller stopped us (cancelled, or its deadline passed)
			}
			return context.Cause(ctx) // a source failed
		case <-c.changed:
		}
		c.mu.Lock()
		ks, meas, last := c.kube, c.meas, c.current
		c.mu.Unlock()
		if ks == nil {
			continue // never a half-built topology
		}
		t := c.Merge(ks, meas)
		// Compiled once, here, with the consumers' options: the compile validates it, says
		// whether anything changed, and is published for the Planners downstream.
		cm, err := c.compiler.Compile(t)
		if err == nil && last != nil && !cm.Changed {
			continue
		}
		if err == nil && c.cfg.Check != nil {
			err = c.cfg.Check(t)
		}
		if err != nil {
			c.rejected.Inc()
			c.log.Error("watcher: merged cluster topology rejected; keeping the last good one", "error", err)
			continue
		}
		c.mu.Lock()
		c.current = t
		c.mu.Unlock()
		c.delivered.Inc()
		Deliver(l, t, cm)
	}
}

// Merge builds the topology from one Kubernetes state and one set of measurements (nil: none)
// by the rules of Live. It is pure apart from the metrics it sets.
//
// A pod that backs several services (a Service and its headless twin select the same pods)
// keeps its name in the first of them (by key) and is listed as "POD@SERVICE" in the others:
// pod names are unique in a topology, and a pod calls as the first service it backs (see
// measuredCalls) while it is called as each. '@' cannot occur in a Kubernetes name.
func (c *Live) Merge(ks *kube.State, meas *prom.Measurements) *optimizer.Topology {
	t := &optimizer.Topology{Nodes: append([]optimizer.Node(nil), ks.Nodes...)}
	listed := map[string]bool{} // pod keys
	for _, s := range ks.Services {
		s.Pods = append([]optimizer.Pod(nil), s.Pods...)
		for i := range s.Pods {
			if key := s.PodKey(&s.Pods[i]); listed[key] {
				s.Pods[i].Name += "@" + s.Name
			} else {
				listed[key] = true
			}
		}
		s.Ports = append([]optimizer.Port(nil), s.Ports...)
		t.Services = append(t.Services, s)
	}
	measured, ls := c.matchLatency(ks, meas)
	if c.cfg.Prom != nil && !ls.usable {
		measured = nil // every pair equal (prom.FillLatency), never a plan from unmatched names
	}
	var names []string
	ls.granularity, ls.why = c.granularity(t.Nodes)
	if ls.granularity == optimizer.LatencyPerZone {
		t.LatencyGranularity = optimizer.LatencyPerZone
		names, _ = optimizer.TopologyZones(t.Nodes)
		zone := make(map[string]string, len(t.Nodes))
		for _, n := range t.Nodes {
			zone[n.Name] = optimizer.ZoneOf(n)
		}
		measured = prom.AggregateLatency(measured, func(n string) (string, bool) { z, ok := zone[n]; return z, ok })
	} else {
		names = make([]string, len(t.Nodes))
		for i, n := range t.Nodes {
			names[i] = n.Name
		}
	}
	lat, unmeasured := prom.FillLatency(names, measured, c.latencyDefault(ls))
	t.Latency = lat
	c.unmeasured.Set(float64(unmeasured))
	c.noteLatency(ls)
	ignored := map[string]int{}
	var calls []optimizer.Call
	var ingress []optimizer.Ingress
	if c.cfg.CallGraph != nil {
		calls, ingress = c.staticCalls(t, ignored)
	} else if meas != nil {
		calls, ingress = measuredCalls(ks, meas.Calls, ignored)
	}
	t.Calls = dropCycles(calls, ignored)
	t.Ingress = ingress
	for _, r := range []string{CallUnmanaged, CallNoService, CallCycle} {
		c.ignored.WithLabelValues(r).Set(float64(ignored[r]))
	}
	return t
}

// matchLatency maps the measured pairs' node labels to node names by NodeMatch, and says what
// matched.
func (c *Live) matchLatency(ks *kube.State, meas *prom.Measurements) (map[prom.Pair]float64, latencyState) {
	ls := latencyState{merged: true}
	if meas == nil {
		return nil, ls
	}
	ls.unreach = prom.DescribeUnreachable(meas, 10)
	known := make(map[string]bool, len(ks.Nodes))
	for _, n := range ks.Nodes {
		known[n.Name] = true
	}
	resolve := func(label string) (string, bool) {
		if c.cfg.NodeMatch == NodeMatchName {
			return label, known[label]
		}
		host := label
		if h, _, err := net.SplitHostPort(label); err == nil {
			host = h
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return "", false
		}
		n, ok := ks.NodeAddresses[ip.Unmap().String()]
		return n, ok
	}
	unmatched := map[string]bool{}
	out := make(map[prom.Pair]float64, len(meas.Latency))
	for p, v := range meas.Latency {
		from, okF := resolve(p.From)
		to, okT := resolve(p.To)
		if !okF {
			unmatched[p.From] = true
		}
		if !okT {
			unmatched[p.To] = true
		}
		if okF && okT {
			out[prom.Pair{From: from, To: to}] = v
			ls.usable = true
		}
	}
	for n := range unmatched {
		ls.unmatched = append(ls.unmatched, n)
	}
	sort.Strings(ls.unmatched)
	return out, ls
}

// granularity decides the latency granularity of a topology of these nodes (LatencyGranularity)
// and says why.
func (c *Live) granularity(nodes []optimizer.Node) (string, string) {
	n := int64(len(nodes))
	pairs := n * (n - 1)
	zones := func() string {
		names, _ := optimizer.TopologyZones(nodes)
		return fmt.Sprintf("%s zones", thousands(int64(len(names))))
	}
	switch c.cfg.LatencyGranularity {
	case optimizer.LatencyPerNode:
		return optimizer.LatencyPerNode, fmt.Sprintf("latency per node (--latency-granularity=node): %s nodes, %s node pairs", thousands(n), thousands(pairs))
	case optimizer.LatencyPerZone:
		return optimizer.LatencyPerZone, fmt.Sprintf("latency per zone (--latency-granularity=zone): %s nodes, %s", thousands(n), zones())
	}
	if pairs <= int64(c.cfg.MaxNodePairs) {
		return optimizer.LatencyPerNode, fmt.Sprintf("latency per node: %s nodes, %s node pairs ≤ --max-node-pairs %d", thousands(n), thousands(pairs), c.cfg.MaxNodePairs)
	}
	return optimizer.LatencyPerZone, fmt.Sprintf("latency per zone: %s nodes, %s node pairs > --max-node-pairs %d; %s", thousands(n), thousands(pairs), c.cfg.MaxNodePairs, zones())
}

// thousands formats n with a comma every three digits.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// latencyDefault is the latency of unmeasured pairs: the configured default while some
// latency is usable; none (every pair equal) in the degraded plan.
func (c *Live) latencyDefault(ls latencyState) *float64 {
	if c.cfg.Prom != nil && !ls.usable {
		return nil
	}
	return c.cfg.DefaultLatencyMS
}

// noteLatency records what the last Merge made of the measurements, logging and counting
// changes of the unmatched names and of the degraded plan once per change.
func (c *Live) noteLatency(ls latencyState) {
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
	before := map[string]bool{}
	for _, n := range prev.unmatched {
		before[n] = true
	}
	var fresh []string
	for _, n := range ls.unmatched {
		if !before[n] {
			fresh = append(fresh, n)
		}
	}
	c.unmatched.WithLabelValues("node").Add(float64(len(fresh)))
	if !slices.Equal(prev.unmatched, ls.unmatched) {
		if len(ls.unmatched) > 0 {
			c.log.Error("watcher: latency labels name no node; their pairs are not used", "node_match", c.cfg.NodeMatch, "names", ls.unmatched)
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

func (c *Live) staticCalls(t *optimizer.Topology, ignored map[string]int) ([]optimizer.Call, []optimizer.Ingress) {
	have := map[string]bool{}
	for i := range t.Services {
		have[t.Services[i].Key()] = true
	}
	var calls []optimizer.Call
	for _, cl := range c.cfg.CallGraph.Calls {
		cl.From, cl.To = optimizer.CanonicalKey(cl.From), optimizer.CanonicalKey(cl.To)
		if !have[cl.From] || !have[cl.To] {
			ignored[CallNoService]++
			continue
		}
		calls = append(calls, cl)
	}
	var ingress []optimizer.Ingress
	for _, in := range c.cfg.CallGraph.Ingress {
		in.Service = optimizer.CanonicalKey(in.Service)
		if !have[in.Service] {
			ignored[CallNoService]++
			continue
		}
		ingress = append(ingress, in)
	}
	return calls, ingress
}

// measuredCalls maps workload rates to service calls. A workload backing several services
// calls as the first of them (by key) and is called as each, the rate split equally.
//
// Calls that would close a cycle are dropped before the rates are taken, and Λ(a) is the rate
// measured into a over the calls kept (plus its ingress), so that in the compiled topology
// every call kept carries its measured rate: Λ(a)·r(a→b) = R(a→b).
func measuredCalls(ks *kube.State, rates []prom.CallRate, ignored map[string]int) ([]optimizer.Call, []optimizer.Ingress) {
	type edge struct{ from, to string }
	rps := map[edge]float64{}
	ext := map[string]float64{} // service → rate into it from workloads backing no service
	for _, r := range rates {
		callees := ks.Workloads[kube.Workload{Name: r.To.Name, Namespace: r.To.Namespace}]
		if len(callees) == 0 {
			ignored[CallUnmanaged]++
			continue
		}
		callers := ks.Workloads[kube.Workload{Name: r.From.Name, Namespace: r.From.Namespace}]
		share := r.RPS / float64(len(callees))
		for _, to := range callees {
			switch {
			case len(callers) == 0:
				ext[to] += share
			case callers[0] == to:
				ignored[CallCycle]++
			default:
				rps[edge{callers[0], to}] += share
			}
		}
	}
	calls := make([]optimizer.Call, 0, len(rps))
	for e := range rps {
		calls = append(calls, optimizer.Call{From: e.from, To: e.to})
	}
	sort.Slice(calls, func(i, j int) bool {
		if calls[i].From != calls[j].From {
			return calls[i].From < calls[j].From
		}
		return calls[i].To < calls[j].To
	})
	calls = dropCycles(calls, ignored)
	in := map[string]float64{} // service → measured rate into it over ingress and the calls kept
	out := map[string]float64{}
	for s, r := range ext {
		in[s] += r
	}
	for _, cl := range calls {
		r := rps[edge{cl.From, cl.To}]
		in[cl.To] += r
		out[cl.From] = math.Max(out[cl.From], r)
	}
	for i := range calls {
		from := calls[i].From
		load := in[from]
		if load <= 0 { // a caller with no measured inbound load: its calls are its own ingress
			load = out[from]
			ext[from] = math.Max(ext[from], load)
		}
		rate := 0.0 // every call from a caller without load was measured at zero
		if load > 0 {
			rate = rps[edge{from, calls[i].To}] / load
		}
		calls[i].Rate = &rate
	}
	var ingress []optimizer.Ingress
	for s, r := range ext {
		ingress = append(ingress, optimizer.Ingress{Service: s, RPS: r})
	}
	sort.Slice(ingress, func(i, j int) bool { return ingress[i].Service < ingress[j].Service })
	return calls, ingress
}

// dropCycles keeps the calls in order, leaving out each one that would close a cycle.
func dropCycles(calls []optimizer.Call, ignored map[string]int) []optimizer.Call {
	out := map[string][]string{}
	reaches := func(from, to string) bool { // is there a path from → … → to?
		seen := map[string]bool{}
		stack := []string{from}
		for len(stack) > 0 {
			s := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if s == to {
				return true
			}
			if seen[s] {
				continue
			}
			seen[s] = true
			stack = append(stack, out[s]...)
		}
		return false
	}
	var kept []optimizer.Call
	for _, c := range calls {
		if c.From == c.To || reaches(c.To, c.From) {
			ignored[CallCycle]++
			continue
		}
		out[c.From] = append(out[c.From], c.To)
		kept = append(kept, c)
	}
	return kept
}
