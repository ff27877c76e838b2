package watcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

// ClusterConfig configures a Cluster.
type ClusterConfig struct {
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
	// Check is validation beyond optimizer.Compile (e.g. xds.CheckTopology); nil means none.
	Check func(*optimizer.Topology) error
	// StartupGrace is how long the first topology waits for Prometheus to hold latency data
	// (a fresh Prometheus answers, with nothing, before its first scrapes); after it the first
	// topology is built with what there is. Zero means DefaultStartupGrace.
	StartupGrace time.Duration
	// Clock is the time source (nil means time.Now).
	Clock func() time.Time
	// Logger and Registerer as elsewhere.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// DefaultStartupGrace is ClusterConfig.StartupGrace's default.
const DefaultStartupGrace = 30 * time.Second

// Cluster merges the Kubernetes and Prometheus sources into one immutable Topology for a
// Listener.
//
// Rules:
//   - Nothing is delivered before the Kubernetes caches synced and, with Prometheus, before
//     its first answer holding latency data (or StartupGrace has passed): never a half-built
//     topology.
//   - Each source delivers into the Cluster without waiting for the other; the merge runs on
//     its own goroutine and delivers only a topology that differs from the last one.
//   - Latency: measured pairs as measured (RTT, ms); a pair never measured gets
//     DefaultLatencyMS, else the largest measured latency (edgeflow_latency_unmeasured_pairs
//     counts them). Stale series keep their last good value (the Prometheus source's rule).
//   - Call graph (measured): istio_requests_total rates by workload are mapped to managed
//     services through the pods' owners; a call from a workload that backs no managed
//     service is ingress to the callee; a call to one that backs none is ignored; a call that
//     would close a cycle is dropped. Rates become per-request rates r = R(a→b) / Λ(a), Λ(a)
//     measured over the calls kept, so each call kept carries its measured rate.
//   - Partial data never blocks the rest: services without ready endpoints are absent (the
//     Kubernetes source's rule) and calls naming them are dropped and counted. A topology that
//     still fails validation is logged and counted, and the last good one stays.
//   - Prometheus unreachable: its source delivers nothing, so the last good topology stays;
//     Checks reports it.
type Cluster struct {
	cfg ClusterConfig
	log *slog.Logger

	unmeasured prometheus.Gauge
	ignored    *prometheus.GaugeVec
	delivered  prometheus.Counter
	rejected   prometheus.Counter

	changed chan struct{}
	mu      sync.Mutex // guards kube, meas, current
	kube    *kube.State
	meas    *prom.Measurements
	current *optimizer.Topology
}

// Reasons a call is left out, the label values of edgeflow_cluster_calls_ignored.
const (
	CallUnmanaged = "unmanaged_callee"
	CallNoService = "no_service"
	CallCycle     = "cycle"
)

// NewCluster validates cfg and registers the metrics; it starts nothing.
func NewCluster(cfg ClusterConfig) (*Cluster, error) {
	if cfg.Kube == nil {
		return nil, errors.New("watcher: ClusterConfig.Kube is nil")
	}
	if cfg.Prom == nil && cfg.CallGraph == nil {
		return nil, errors.New("watcher: without Prometheus the call graph must be given")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.StartupGrace <= 0 {
		cfg.StartupGrace = DefaultStartupGrace
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger, changed: make(chan struct{}, 1),
		unmeasured: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgeflow_latency_unmeasured_pairs",
			Help: "Node pairs (unordered) with no latency measurement, given the default latency or the largest measured one."}),
		ignored: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "edgeflow_cluster_calls_ignored",
			Help: "Measured or configured call edges left out of the current topology, by reason."}, []string{"reason"}),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeflow_cluster_topologies_total",
			Help: "Topologies merged from the cluster sources and delivered."}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeflow_cluster_rejected_topologies_total",
			Help: "Merged topologies that failed validation; the last good one stayed."}),
	}
	if cfg.Registerer != nil {
		for _, m := range []prometheus.Collector{c.unmeasured, c.ignored, c.delivered, c.rejected} {
			if err := cfg.Registerer.Register(m); err != nil {
				return nil, fmt.Errorf("watcher: registering metrics: %w", err)
			}
		}
	}
	return c, nil
}

// Current returns the last topology delivered (nil before the first).
func (c *Cluster) Current() *optimizer.Topology {
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

// Checks reports each input's state.
func (c *Cluster) Checks() []Check {
	checks := []Check{{Name: "kubernetes", OK: c.cfg.Kube.Synced(), Message: "informer caches synced"}}
	if !checks[0].OK {
		checks[0].Message = "informer caches not synced yet"
	}
	if c.cfg.Prom != nil {
		st := c.cfg.Prom.Status()
		ck := Check{Name: "prometheus", OK: st.OK, Message: "last query " + st.LastSuccess.Format(time.RFC3339)}
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
	}
	return checks
}

func (c *Cluster) poke() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// Run runs the sources and delivers merged topologies to l until ctx is done (then it returns
// nil, after every goroutine it started has ended), or until a source fails (its error).
func (c *Cluster) Run(ctx context.Context, l Listener) error {
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
	graceEnd := c.cfg.Clock().Add(c.cfg.StartupGrace)
	grace := time.NewTimer(c.cfg.StartupGrace)
	defer grace.Stop()
	for {
		select {
		case <-ctx.Done():
			if parent.Err() != nil {
				return nil // the caller stopped us (cancelled, or its deadline passed)
			}
			return context.Cause(ctx) // a source failed
		case <-c.changed:
		case <-grace.C:
		}
		c.mu.Lock()
		ks, meas, last := c.kube, c.meas, c.current
		c.mu.Unlock()
		if ks == nil || (c.cfg.Prom != nil && meas == nil) {
			continue // never a half-built topology
		}
		if last == nil && c.cfg.Prom != nil && len(meas.Latency) == 0 {
			if c.cfg.Clock().Before(graceEnd) {
				continue // Prometheus answered, but holds no latency yet
			}
			c.log.Warn("watcher: Prometheus holds no latency data; starting with every node pair unmeasured", "waited", c.cfg.StartupGrace)
		}
		t := c.Merge(ks, meas)
		if last != nil && reflect.DeepEqual(last, t) {
			continue
		}
		if err := c.validate(t); err != nil {
			c.rejected.Inc()
			c.log.Error("watcher: merged cluster topology rejected; keeping the last good one", "error", err)
			continue
		}
		c.mu.Lock()
		c.current = t
		c.mu.Unlock()
		c.delivered.Inc()
		l.Update(t)
	}
}

func (c *Cluster) validate(t *optimizer.Topology) error {
	if _, err := optimizer.Compile(t, optimizer.Options{}); err != nil {
		return err
	}
	if c.cfg.Check != nil {
		return c.cfg.Check(t)
	}
	return nil
}

// Merge builds the topology from one Kubernetes state and one set of measurements (nil: none)
// by the rules of Cluster. It is pure apart from the metrics it sets.
//
// A pod that backs several services (a Service and its headless twin select the same pods)
// keeps its name in the first of them (by key) and is listed as "POD@SERVICE" in the others:
// pod names are unique in a topology, and a pod calls as the first service it backs (see
// measuredCalls) while it is called as each. '@' cannot occur in a Kubernetes name.
func (c *Cluster) Merge(ks *kube.State, meas *prom.Measurements) *optimizer.Topology {
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
	names := make([]string, len(t.Nodes))
	for i, n := range t.Nodes {
		names[i] = n.Name
	}
	var measured map[prom.Pair]float64
	if meas != nil {
		measured = meas.Latency
	}
	lat, unmeasured := prom.FillLatency(names, measured, c.cfg.DefaultLatencyMS)
	t.Latency = lat
	c.unmeasured.Set(float64(unmeasured))

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

func (c *Cluster) staticCalls(t *optimizer.Topology, ignored map[string]int) ([]optimizer.Call, []optimizer.Ingress) {
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
