package optimizer

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
)

// Options says how a Topology is read.
type Options struct {
	// DefaultLatencyMS, when set, is the latency of a node pair that has no entry in either
	// direction. When nil, a missing pair is an error.
	DefaultLatencyMS *float64
	// Unplaced accepts pods without a node and services given only by Replicas (for placement).
	// When false every pod must name its node (plan, serve).
	Unplaced bool
	// UtilizationCap is the highest utilisation ℓ/μ the lata-q policy loads a pod with a
	// service rate to, in (0, 1); 0 means DefaultUtilizationCap.
	UtilizationCap float64
	// MaxNodeUtilization, when positive, is the highest planned utilisation (Model.PodCPU
	// summed over a node's pods, over its cores) placement and rebalancing may give a node, in
	// (0, 1]; 0 means no limit. Nodes of unknown cores are not limited.
	MaxNodeUtilization float64
	// MinBandShare (lata-q, closed-loop), when positive, is the least share of a caller pod's
	// calls a latency band farther than its nearest may carry: a thinner one is folded into
	// the caller's other bands where the pods' caps allow (see foldThinBands), in [0, 0.5);
	// 0 folds nothing. The commands default to DefaultMinBandShare.
	MinBandShare float64
}

// DefaultMinBandShare is the least share of a caller pod's calls the commands let lata-q and
// closed-loop send to a band farther than the caller's nearest (Options.MinBandShare).
const DefaultMinBandShare = 0.05

// DefaultMaxNodeUtilization is the headroom limit the place and rebalance commands apply
// unless told otherwise (Options.MaxNodeUtilization).
const DefaultMaxNodeUtilization = 0.7

// DefaultUtilizationCap is the utilisation cap of lata-q when Options gives none.
const DefaultUtilizationCap = 0.9

// LatencyMatrix is the node-to-node latency in milliseconds, indexed by node index. It is
// dense (n × n values) when the latency is given per node, and zone-backed when it is given per
// zone (Topology.LatencyGranularity): each node's zone index and zones × zones values, so that
// At(u, v) is the latency between u's zone and v's zone and memory is O(n + zones²). Every
// reader (the policies, placement, PlanRebalance) uses At and works on either.
type LatencyMatrix struct {
	n  int
	ms []float64
	// Zone-backed only: zone[u] is node u's zone index, zones the zone names.
	zone  []int32
	zones []string
}

// NewLatencyMatrix returns an n×n matrix of zeros.
func NewLatencyMatrix(n int) LatencyMatrix { return LatencyMatrix{n: n, ms: make([]float64, n*n)} }

// NewZoneLatencyMatrix returns a zone-backed matrix of zeros over len(zoneOf) nodes, node u in
// zone zoneOf[u], an index into zones. It panics when an index is out of range.
func NewZoneLatencyMatrix(zoneOf []int, zones []string) LatencyMatrix {
	m := LatencyMatrix{n: len(zoneOf), ms: make([]float64, len(zones)*len(zones)), zone: make([]int32, len(zoneOf)), zones: zones}
	for u, z := range zoneOf {
		if z < 0 || z >= len(zones) {
			panic(fmt.Sprintf("optimizer: NewZoneLatencyMatrix: node %d in zone %d of %d", u, z, len(zones)))
		}
		m.zone[u] = int32(z)
	}
	return m
}

// At returns the latency from node u to node v in milliseconds. O(1).
func (m LatencyMatrix) At(u, v int) float64 {
	if m.zone != nil {
		return m.ms[int(m.zone[u])*len(m.zones)+int(m.zone[v])]
	}
	return m.ms[u*m.n+v]
}

// Set sets the latency from node u to node v; in a zone-backed matrix, from u's zone to v's
// zone (so for every node pair of those zones).
func (m LatencyMatrix) Set(u, v int, ms float64) {
	if m.zone != nil {
		m.SetZone(int(m.zone[u]), int(m.zone[v]), ms)
		return
	}
	m.ms[u*m.n+v] = ms
}

// Len returns the number of nodes.
func (m LatencyMatrix) Len() int { return m.n }

// Zoned says whether the matrix is zone-backed.
func (m LatencyMatrix) Zoned() bool { return m.zone != nil }

// Zones returns the zone names of a zone-backed matrix (nil when dense); the caller must not
// modify them.
func (m LatencyMatrix) Zones() []string { return m.zones }

// ZoneOf returns node u's zone index in a zone-backed matrix, -1 when dense.
func (m LatencyMatrix) ZoneOf(u int) int {
	if m.zone == nil {
		return -1
	}
	return int(m.zone[u])
}

// zoneIndex returns, for a zone-backed matrix, every node's zone index (shared: the caller
// must not modify it) and the number of zones; ok is false when the matrix is dense.
func (m LatencyMatrix) zoneIndex() (zoneOf []int32, zones int, ok bool) {
	return m.zone, len(m.zones), m.zone != nil
}

// ZoneAt returns the latency from zone g to zone h of a zone-backed matrix.
func (m LatencyMatrix) ZoneAt(g, h int) float64 { return m.ms[g*len(m.zones)+h] }

// SetZone sets the latency from zone g to zone h of a zone-backed matrix.
func (m LatencyMatrix) SetZone(g, h int, ms float64) { m.ms[g*len(m.zones)+h] = ms }

// clone returns a copy whose values can be set without touching m's (the zone index is shared:
// it never changes).
func (m LatencyMatrix) clone() LatencyMatrix {
	c := m
	c.ms = append([]float64(nil), m.ms...)
	return c
}

// PodRef is a pod as the optimizer sees it: its node index and capacity weight.
type PodRef struct {
	Name   string
	Node   int // index into Model.Nodes; -1 when unplaced
	Weight float64
	// CapacityRPS is the pod's service rate μ in requests/s (its own capacity_rps, else its
	// service's times Weight); 0 when the topology gives none.
	CapacityRPS float64
}

// ServiceModel is a validated service: its pods, in file order, and its load.
type ServiceModel struct {
	Name string
	Pods []PodRef
	Load float64 // Λ, requests/s into the service (ingress plus calls)
	// Ingress is λ⁰, the part of Load that comes from outside (not from call edges).
	Ingress float64
	CPU     int64
	Mem     int64
	// CPULimit is each pod's CPU limit in millicores (Service.CPULimit; 0: none): lata-q prices
	// its pods' queueing by podQueue's quota model.
	CPULimit int64
	// QueueScale is the share of the quota model's wait lata-q prices (Service.QueueScale; 1
	// when the service gives none).
	QueueScale float64
	Count      int // replicas to place (len(Pods) when placed)
}

// TotalWeight is Σ w_p over the service's pods.
func (s *ServiceModel) TotalWeight() float64 {
	var w float64
	for _, p := range s.Pods {
		w += p.Weight
	}
	return w
}

// CallEdge is a validated call edge between service indices.
type CallEdge struct {
	From, To int
	Rate     float64
}

// Model is a validated, indexed Topology: what the policies compute on. It is immutable and
// safe for concurrent readers.
type Model struct {
	Topology *Topology
	Nodes    []Node
	Latency  LatencyMatrix
	Services []ServiceModel
	Calls    []CallEdge
	Order    []int // services in topological order of the call graph
	// UtilizationCap is lata-q's utilisation cap (Options.UtilizationCap, defaulted).
	UtilizationCap float64
	// MaxNodeUtilization is the headroom limit of placement (Options.MaxNodeUtilization; 0:
	// none).
	MaxNodeUtilization float64
	// MinBandShare is lata-q's least band share (Options.MinBandShare; 0: none).
	MinBandShare float64

	nodeIndex    map[string]int
	serviceIndex map[string]int
	resolution   int // lata-q's pieces per μ; 0 means QueueResolution (tests set it)
}

// NodeIndex returns the index of the named node.
func (m *Model) NodeIndex(name string) (int, bool) { i, ok := m.nodeIndex[name]; return i, ok }

// ServiceIndex returns the index of the service with the given key (Service.Key); a service of
// the default namespace may also be named "NAME.default".
func (m *Model) ServiceIndex(key string) (int, bool) {
	if i, ok := m.serviceIndex[key]; ok {
		return i, true
	}
	i, ok := m.serviceIndex[CanonicalKey(key)]
	return i, ok
}

// MaxReplicas bounds a service's replica count, so a typo cannot exhaust memory.
const MaxReplicas = 100000

// maxNodeCores bounds a node's cores, so a typo cannot make an emulated node allocate millions.
const maxNodeCores = 1 << 16

// maxProblems bounds how many validation problems one error lists.
const maxProblems = 20

type problems struct{ errs []error }

func (p *problems) add(format string, args ...any) {
	p.errs = append(p.errs, invalidf(format, args...))
}

func (p *problems) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	if len(p.errs) > maxProblems {
		n := len(p.errs) - maxProblems
		p.errs = append(p.errs[:maxProblems], fmt.Errorf("… and %d more problems", n))
	}
	return errors.Join(p.errs...)
}

func badNumber(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 0):
		return "infinite"
	case v < 0:
		return "negative"
	}
	return ""
}

// Compile validates t and indexes it. Every problem found is reported (up to a bound), each
// wrapping ErrInvalidTopology and naming the offending item.
func Compile(t *Topology, opts Options) (*Model, error) {
	var bad problems
	m := &Model{
		Topology:     t,
		Nodes:        t.Nodes,
		nodeIndex:    make(map[string]int, len(t.Nodes)),
		serviceIndex: make(map[string]int, len(t.Services)),
	}
	if len(t.Nodes) == 0 {
		bad.add("no nodes")
	}
	for i, n := range t.Nodes {
		switch {
		case n.Name == "":
			bad.add("nodes[%d]: empty name", i)
		case m.hasNode(n.Name):
			bad.add("node %q: duplicate name", n.Name)
		default:
			m.nodeIndex[n.Name] = i
		}
		if n.CPU < 0 || n.Memory < 0 {
			bad.add("node %q: negative cpu or memory", n.Name)
		}
		if n.Cores < 0 || n.Cores > maxNodeCores {
			bad.add("node %q: cores %d outside [0, %d]", n.Name, n.Cores, maxNodeCores)
		}
	}
	m.Latency = compileLatency(t, m.nodeIndex, opts, &bad)
	m.UtilizationCap = opts.UtilizationCap
	if m.UtilizationCap == 0 {
		m.UtilizationCap = DefaultUtilizationCap
	}
	if !(m.UtilizationCap > 0 && m.UtilizationCap < 1) {
		bad.add("utilization cap %v: must be in (0, 1)", opts.UtilizationCap)
	}
	m.MinBandShare = opts.MinBandShare
	if !(m.MinBandShare >= 0 && m.MinBandShare < 0.5) {
		bad.add("min band share %v: must be in [0, 0.5)", opts.MinBandShare)
	}
	m.MaxNodeUtilization = opts.MaxNodeUtilization
	if !(m.MaxNodeUtilization >= 0 && m.MaxNodeUtilization <= 1) {
		bad.add("max node utilization %v: must be in (0, 1], or 0 for no limit", opts.MaxNodeUtilization)
	}

	podNames := map[string]string{} // pod → service
	for i, s := range t.Services {
		key := s.Key()
		switch {
		case s.Name == "":
			bad.add("services[%d]: empty name", i)
		case strings.Contains(s.Namespace, "."):
			bad.add("service %q: namespace %q contains a dot", s.Name, s.Namespace)
		default:
			if _, dup := m.serviceIndex[key]; dup {
				bad.add("service %q: duplicate name", key)
			} else {
				m.serviceIndex[key] = i
			}
		}
		checkPorts(&s, &bad)
		m.Services = append(m.Services, compileService(s, m.nodeIndex, podNames, opts, &bad))
	}
	if len(t.Services) == 0 {
		bad.add("no services")
	}

	calls := map[[2]int]bool{}
	for i, c := range t.Calls {
		from, okF := m.ServiceIndex(c.From)
		to, okT := m.ServiceIndex(c.To)
		if !okF {
			bad.add("calls[%d] %s → %s: unknown service %q", i, c.From, c.To, c.From)
		}
		if !okT {
			bad.add("calls[%d] %s → %s: unknown service %q", i, c.From, c.To, c.To)
		}
		r := c.CallRate()
		if why := badNumber(r); why != "" {
			bad.add("call %s → %s: rate is %s (%v)", c.From, c.To, why, r)
		}
		if !okF || !okT {
			continue
		}
		if calls[[2]int{from, to}] {
			bad.add("call %s → %s: duplicate call edge", c.From, c.To)
			continue
		}
		calls[[2]int{from, to}] = true
		m.Calls = append(m.Calls, CallEdge{From: from, To: to, Rate: r})
	}

	ingress := make([]float64, len(t.Services))
	for i, in := range t.Ingress {
		s, ok := m.ServiceIndex(in.Service)
		if !ok {
			bad.add("ingress[%d]: unknown service %q", i, in.Service)
			continue
		}
		if why := badNumber(in.RPS); why != "" {
			bad.add("ingress to %q: rps is %s (%v)", in.Service, why, in.RPS)
			continue
		}
		ingress[s] += in.RPS
	}
	if err := bad.err(); err != nil {
		return nil, err
	}

	order, cycle := topoOrder(len(m.Services), m.Calls)
	if cycle != nil {
		names := make([]string, len(cycle))
		for i, s := range cycle {
			names[i] = m.Services[s].Name
		}
		return nil, invalidf("calls form a cycle: %s", strings.Join(names, " → "))
	}
	m.Order = order
	for _, s := range order {
		m.Services[s].Ingress = ingress[s]
		m.Services[s].Load += ingress[s]
		for _, c := range m.Calls {
			if c.From == s {
				m.Services[c.To].Load += m.Services[s].Load * c.Rate
			}
		}
	}
	for i := range m.Services {
		if l := m.Services[i].Load; math.IsInf(l, 0) || math.IsNaN(l) {
			return nil, invalidf("service %q: load overflows (%v rps)", m.Services[i].Name, l)
		}
	}
	return m, nil
}

func (m *Model) hasNode(name string) bool { _, ok := m.nodeIndex[name]; return ok }

func compileLatency(t *Topology, nodes map[string]int, opts Options, bad *problems) LatencyMatrix {
	switch t.LatencyGranularity {
	case "", LatencyPerNode:
	case LatencyPerZone:
		return compileZoneLatency(t, opts, bad)
	default:
		bad.add("latency_granularity %q: want %q or %q", t.LatencyGranularity, LatencyPerNode, LatencyPerZone)
		return NewZoneLatencyMatrix(make([]int, len(t.Nodes)), []string{""}) // a placeholder: Compile fails
	}
	n := len(t.Nodes)
	lm := NewLatencyMatrix(n)
	names := make([]string, n)
	for i, nd := range t.Nodes {
		names[i] = nd.Name
	}
	fillLatency(t.Latency, "node", nodes, names, lm.Set, lm.At, opts, bad)
	return lm
}

// TopologyZones returns the zones of t's nodes (ZoneOf), sorted by name, and each node's zone
// index.
func TopologyZones(nodes []Node) (zones []string, zoneOf []int) {
	index := map[string]int{}
	for _, n := range nodes {
		index[ZoneOf(n)] = 0
	}
	zones = make([]string, 0, len(index))
	for z := range index {
		zones = append(zones, z)
	}
	sort.Strings(zones)
	for i, z := range zones {
		index[z] = i
	}
	zoneOf = make([]int, len(nodes))
	for u, n := range nodes {
		zoneOf[u] = index[ZoneOf(n)]
	}
	return zones, zoneOf
}

// compileZoneLatency compiles latency entries that name zones into a zone-backed matrix: the
// rules of the per-node entries, over zones.
func compileZoneLatency(t *Topology, opts Options, bad *problems) LatencyMatrix {
	zones, zoneOf := TopologyZones(t.Nodes)
	lm := NewZoneLatencyMatrix(zoneOf, zones)
	index := make(map[string]int, len(zones))
	for i, z := range zones {
		index[z] = i
	}
	fillLatency(t.Latency, "zone", index, zones, lm.SetZone, lm.ZoneAt, opts, bad)
	return lm
}

// fillLatency reads latency entries naming the items (nodes or zones, kind says which) of
// index into set, and applies the rules for what is not given: one direction given means
// both, an item to itself is 0, any other pair takes the default latency or is an error.
func fillLatency(entries []Latency, kind string, index map[string]int, names []string,
	set func(u, v int, ms float64), at func(u, v int) float64, opts Options, bad *problems) {
	n := len(names)
	given := make([]bool, n*n)
	for i, l := range entries {
		u, okU := index[l.From]
		v, okV := index[l.To]
		if !okU {
			bad.add("latency[%d] %s → %s: unknown %s %q", i, l.From, l.To, kind, l.From)
		}
		if !okV {
			bad.add("latency[%d] %s → %s: unknown %s %q", i, l.From, l.To, kind, l.To)
		}
		if why := badNumber(l.MS); why != "" {
			bad.add("latency %s → %s: ms is %s (%v)", l.From, l.To, why, l.MS)
			continue
		}
		if l.MS > MaxLatencyMS {
			bad.add("latency %s → %s: %v ms exceeds the maximum %v ms", l.From, l.To, l.MS, MaxLatencyMS)
			continue
		}
		if !okU || !okV {
			continue
		}
		if given[u*n+v] {
			bad.add("latency %s → %s: duplicate entry", l.From, l.To)
			continue
		}
		given[u*n+v] = true
		set(u, v, l.MS)
	}
	if opts.DefaultLatencyMS != nil {
		if d := *opts.DefaultLatencyMS; badNumber(d) != "" || d > MaxLatencyMS {
			bad.add("default latency %v ms: must be a finite number in [0, %v]", d, MaxLatencyMS)
		}
	}
	var missing []string
	for u := 0; u < n; u++ {
		for v := 0; v < n; v++ {
			switch {
			case given[u*n+v]:
			case given[v*n+u]:
				set(u, v, at(v, u))
			case u == v:
			case opts.DefaultLatencyMS != nil:
				set(u, v, *opts.DefaultLatencyMS)
			case u < v:
				missing = append(missing, names[u]+" ↔ "+names[v])
			}
		}
	}
	if len(missing) > 0 {
		more := ""
		if len(missing) > 5 {
			more = fmt.Sprintf(" and %d more pairs", len(missing)-5)
			missing = missing[:5]
		}
		of := "" // the per-node message as it always read
		if kind != "node" {
			of = kind + "s "
		}
		bad.add("latency: no entry for %s%s%s (give one, or a default latency)", of, strings.Join(missing, ", "), more)
	}
}

// checkPorts validates a service's ports: numbers in range, names unique.
func checkPorts(s *Service, bad *problems) {
	names := map[string]bool{}
	for i, p := range s.Ports {
		if p.Port < 1 || p.Port > 65535 || p.TargetPort < 0 || p.TargetPort > 65535 {
			bad.add("service %q: ports[%d]: port %d (target %d) out of range", s.Key(), i, p.Port, p.TargetPort)
		}
		if names[p.Name] {
			bad.add("service %q: ports[%d]: duplicate port name %q", s.Key(), i, p.Name)
		}
		names[p.Name] = true
	}
}

func compileService(s Service, nodes map[string]int, podNames map[string]string, opts Options, bad *problems) ServiceModel {
	sm := ServiceModel{Name: s.Key(), CPU: s.CPU, Mem: s.Memory, CPULimit: s.CPULimit, QueueScale: 1, Count: s.ReplicaCount()}
	svcName := s.Name
	s.Name = s.Key() // messages name the service as the topology refers to it
	if s.CPU < 0 || s.Memory < 0 {
		bad.add("service %q: negative cpu or memory request", s.Name)
	}
	if s.CPULimit < 0 {
		bad.add("service %q: cpu_limit %d: must not be negative", s.Name, s.CPULimit)
		sm.CPULimit = 0
	}
	switch q := s.QueueScale; {
	case q == 0:
	case !(q > 0 && q <= 1):
		bad.add("service %q: queue_scale %v: must be in (0, 1]", s.Name, q)
	default:
		sm.QueueScale = q
	}
	svcCapacity := 0.0
	if c := s.CapacityRPS; c != nil {
		if !(*c > 0) || math.IsInf(*c, 0) {
			bad.add("service %q: capacity_rps %v: must be a positive, finite number", s.Name, *c)
		} else {
			svcCapacity = *c
		}
	}
	var withCapacity, without []string // pods with and without a service rate
	if s.Replicas < 0 || s.Replicas > MaxReplicas {
		bad.add("service %q: replicas %d outside [0, %d]", s.Name, s.Replicas, MaxReplicas)
		s.Replicas = 0
	}
	pods := s.Pods
	if opts.Unplaced && len(pods) == 0 {
		for i := 0; i < s.Replicas; i++ {
			pods = append(pods, Pod{Name: fmt.Sprintf("%s-%d", svcName, i)})
		}
	}
	if opts.Unplaced && s.Replicas > 0 && len(s.Pods) > 0 && len(s.Pods) != s.Replicas {
		bad.add("service %q: %d pods listed but replicas is %d", s.Name, len(s.Pods), s.Replicas)
	}
	for i, p := range pods {
		empty := p.Name == ""
		p.Name = QualifiedName(p.Name, s.Namespace)
		ref := PodRef{Name: p.Name, Node: -1, Weight: p.CapacityWeight()}
		if empty {
			bad.add("service %q: pods[%d]: empty name", s.Name, i)
		} else if other, dup := podNames[p.Name]; dup {
			bad.add("pod %q: duplicate name (in services %q and %q)", p.Name, other, s.Name)
		} else {
			podNames[p.Name] = s.Name
		}
		switch {
		case p.Node == "" && !opts.Unplaced:
			bad.add("pod %q (service %q): no node", p.Name, s.Name)
		case p.Node != "":
			if u, ok := nodes[p.Node]; ok {
				ref.Node = u
			} else {
				bad.add("pod %q (service %q): unknown node %q", p.Name, s.Name, p.Node)
			}
		}
		if why := badNumber(ref.Weight); why != "" {
			bad.add("pod %q (service %q): weight is %s (%v)", p.Name, s.Name, why, ref.Weight)
			ref.Weight = 0
		}
		ref.CapacityRPS = svcCapacity * ref.Weight
		if c := p.CapacityRPS; c != nil {
			if !(*c > 0) || math.IsInf(*c, 0) {
				bad.add("pod %q (service %q): capacity_rps %v: must be a positive, finite number", p.Name, s.Name, *c)
			} else {
				ref.CapacityRPS = *c
			}
		}
		if p.CapacityRPS != nil || s.CapacityRPS != nil {
			withCapacity = append(withCapacity, p.Name)
		} else {
			without = append(without, p.Name)
		}
		sm.Pods = append(sm.Pods, ref)
	}
	if len(withCapacity) > 0 && len(without) > 0 {
		bad.add("service %q: pod %q has capacity_rps but pod %q has none (give every pod one, or the service)", s.Name, withCapacity[0], without[0])
	}
	if !(sm.TotalWeight() > 0) {
		if len(pods) == 0 {
			bad.add("service %q: no pods (total weight is zero)", s.Name)
		} else {
			bad.add("service %q: total pod weight is zero", s.Name)
		}
	} else if math.IsInf(sm.TotalWeight(), 0) {
		bad.add("service %q: total pod weight overflows", s.Name)
	}
	return sm
}

// topoOrder returns the services in a deterministic topological order (Kahn's algorithm,
// lowest index first), or, if the call graph has a cycle, one cycle (first service repeated
// at the end).
func topoOrder(n int, calls []CallEdge) (order, cycle []int) {
	indeg := make([]int, n)
	out := make([][]int, n)
	for _, c := range calls {
		indeg[c.To]++
		out[c.From] = append(out[c.From], c.To)
	}
	ready := []int{}
	for s := 0; s < n; s++ {
		if indeg[s] == 0 {
			ready = append(ready, s)
		}
	}
	for len(ready) > 0 {
		sort.Ints(ready)
		s := ready[0]
		ready = ready[1:]
		order = append(order, s)
		for _, t := range out[s] {
			if indeg[t]--; indeg[t] == 0 {
				ready = append(ready, t)
			}
		}
	}
	if len(order) == n {
		return order, nil
	}
	// Every remaining service has a remaining predecessor: walk backwards until a repeat.
	in := make([][]int, n)
	for _, c := range calls {
		if indeg[c.From] > 0 && indeg[c.To] > 0 {
			in[c.To] = append(in[c.To], c.From)
		}
	}
	start := -1
	for s := 0; s < n; s++ {
		if indeg[s] > 0 {
			start = s
			break
		}
	}
	seen := map[int]int{}
	var path []int
	for s := start; ; s = in[s][0] {
		if at, ok := seen[s]; ok {
			cyc := append([]int(nil), path[at:]...)
			// path runs against the call direction; reverse it so it reads caller → callee.
			for i, j := 0, len(cyc)-1; i < j; i, j = i+1, j-1 {
				cyc[i], cyc[j] = cyc[j], cyc[i]
			}
			// Start at the lowest index, so the message is the same however it was found.
			low := 0
			for i := range cyc {
				if cyc[i] < cyc[low] {
					low = i
				}
			}
			cyc = append(cyc[low:], cyc[:low]...)
			return nil, append(cyc, cyc[0])
		}
		seen[s] = len(path)
		path = append(path, s)
	}
}
