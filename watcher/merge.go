package watcher

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// mergeNotes is what one merge made of its inputs besides the topology, for the caller to
// record (Live.record): the latency state, the unmeasured pairs and the calls left out.
type mergeNotes struct {
	latency    latencyState
	unmeasured int            // pairs given the default latency (prom.FillLatency)
	ignored    map[string]int // calls left out, by reason (CallUnmanaged, …)
}

// merge builds the topology from one Kubernetes state, one set of measurements (nil: none) and
// the pods' estimated capacities (requests/s by NAMESPACE/POD; nil: none) by the rules of Live
// and Merge, and says what it made of them. It is pure: it reads only the configuration NewLive
// fixed and its inputs, and writes nothing (neither its inputs nor the Live's state, metrics or
// log).
func (c *Live) merge(ks *kube.State, meas *prom.Measurements, capacity map[string]float64) (*optimizer.Topology, mergeNotes) {
	t := &optimizer.Topology{Nodes: append([]optimizer.Node(nil), ks.Nodes...)}
	listed := map[string]bool{} // pod keys
	for _, s := range ks.Services {
		s.Pods = append([]optimizer.Pod(nil), s.Pods...)
		setCapacity(&s, capacity)
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
	notes := mergeNotes{latency: ls, ignored: map[string]int{}}
	t.Latency, notes.unmeasured = prom.FillLatency(names, measured, c.latencyDefault(ls))
	var calls []optimizer.Call
	var ingress []optimizer.Ingress
	if c.cfg.CallGraph != nil {
		calls, ingress = c.staticCalls(t, notes.ignored)
	} else if meas != nil {
		calls, ingress = measuredCalls(ks, meas.Calls, notes.ignored)
	}
	t.Calls = dropCycles(calls, notes.ignored)
	t.Ingress = ingress
	return t, notes
}

// WithCapacity returns a copy of t whose pods take their estimated capacity from capacity
// (requests/s by NAMESPACE/POD; the default namespace where a service names none), by Live's rule: a service's pods take theirs when every one of
// them has one, else none keeps one from capacity (their own capacity_rps stays). For a loop
// that estimates capacities itself (the demo's closed loop) as Live does from Prometheus.
func WithCapacity(t *optimizer.Topology, capacity map[string]float64) *optimizer.Topology {
	c := t.Clone()
	for i := range c.Services {
		setCapacity(&c.Services[i], capacity)
	}
	return c
}

// setCapacity gives each pod of s (its Pods already the caller's copy) its estimated capacity,
// when every pod of s has one; else none (a service with the rate of some pods and not of
// others is not a valid topology, and the estimator gives a pod without data its service's
// median once it knows the pod at all).
func setCapacity(s *optimizer.Service, capacity map[string]float64) {
	for _, p := range s.Pods {
		if _, ok := capacity[s.NamespaceOrDefault()+"/"+p.Name]; !ok {
			return
		}
	}
	for i := range s.Pods {
		v := capacity[s.NamespaceOrDefault()+"/"+s.Pods[i].Name]
		s.Pods[i].CapacityRPS = &v
	}
}

// matchLatency maps the measured pairs' node labels to node names by NodeMatch, and says what
// matched.
func (c *Live) matchLatency(ks *kube.State, meas *prom.Measurements) (map[prom.Pair]float64, latencyState) {
	ls := latencyState{merged: true}
	if meas == nil {
		return nil, ls
	}
	ls.unreach = prom.DescribeUnreachable(meas, 10)
	ls.contested = prom.DescribeContested(meas, 10)
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
