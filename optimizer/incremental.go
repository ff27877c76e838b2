package optimizer

import "math"

// Incremental recompute: what a Planner keeps from one recompute to the next, so that a change
// to one latency pair, pod or rate re-solves only the call edges it touches.
//
//   - Compile: when the new topology has the same structure as the previous one (the same
//     nodes, latency entries, services, calls and ingress entries, in the same order; the
//     latencies, call rates, ingress rates and the pods of some services may differ), its model
//     is the previous model with those numbers re-read and those services compiled again
//     (recompile). Anything else, or anything wrong, compiles in full (and so gets Compile's
//     error).
//   - Solve: when the services and call edges are the same (same keys, same order), a call
//     edge whose inputs are all equal — its caller service's load and its rate, both services'
//     pods (name, node, weight, capacity), and the latency between every caller node and every
//     callee node — keeps its allocation. Under lata-q a callee service with capacities is
//     solved as one unit with every edge into it, so the unit is re-solved when any of those
//     edges, its ingress or its capacities changed.
//
// The result is the allocation Plan would give (the tests compare them exactly).

// incremental is the Planner's memory of its last recompute (the compile's is a Compiler's).
type incremental struct {
	top     *Topology
	model   *Model
	alloc   *Allocation
	queue   *queueState // lata-q: per callee service (by index)
	key     uint64      // membershipKey(top), from the parts below
	head    uint64      // headKey(top)
	svcKeys []uint64    // serviceKey of each service of top
}

// compileState is a Compiler's memory of its last compile.
type compileState struct {
	top   *Topology
	model *Model
	opts  Options // those top was compiled with
	// latIdx[i] is (u, v) of top.Latency[i] (node indices; zone indices when the latency is per
	// zone); mirror[i] says it also sets (v, u) (the reverse is not given).
	latIdx [][2]int
	mirror []bool
	// owner maps every pod name of model to its service's name (for duplicate checks).
	owner map[string]string
	out   [][]int // call edges by caller service (the calls never change on a recompile)
}

// remember records a compile for the next one: after a full compile, the latency layout and
// every pod's service; after a recompile, the pods of the services it compiled again.
func (inc *compileState) remember(t *Topology, m *Model, full bool, podsChanged []int) {
	prev := inc.model
	inc.top, inc.model = t, m
	if !full {
		for _, s := range podsChanged {
			for _, p := range prev.Services[s].Pods {
				delete(inc.owner, p.Name)
			}
			for _, p := range m.Services[s].Pods {
				inc.owner[p.Name] = m.Services[s].Name
			}
		}
		return // the latency layout is the previous one
	}
	inc.out = nil // rebuilt on the next recompile
	inc.owner = map[string]string{}
	for _, s := range m.Services {
		for _, p := range s.Pods {
			inc.owner[p.Name] = s.Name
		}
	}
	inc.latIdx = make([][2]int, len(t.Latency))
	inc.mirror = make([]bool, len(t.Latency))
	given := make(map[[2]int]bool, len(t.Latency))
	index := m.NodeIndex
	if m.Latency.Zoned() { // the entries name zones; latIdx holds zone indices
		zones := map[string]int{}
		for i, z := range m.Latency.Zones() {
			zones[z] = i
		}
		index = func(z string) (int, bool) { i, ok := zones[z]; return i, ok }
	}
	for i, l := range t.Latency {
		u, _ := index(l.From)
		v, _ := index(l.To)
		inc.latIdx[i] = [2]int{u, v}
		given[[2]int{u, v}] = true
	}
	for i, uv := range inc.latIdx {
		inc.mirror[i] = !given[[2]int{uv[1], uv[0]}]
	}
}

// sameStructure says whether b differs from a at most in latencies, call rates, ingress rates
// and the pods of some services (their indices: podsChanged).
func sameStructure(a, b *Topology) (ok bool, podsChanged []int) {
	if a.LatencyGranularity != b.LatencyGranularity || len(a.Nodes) != len(b.Nodes) || len(a.Latency) != len(b.Latency) || len(a.Services) != len(b.Services) ||
		len(a.Calls) != len(b.Calls) || len(a.Ingress) != len(b.Ingress) {
		return false, nil
	}
	for i := range a.Nodes {
		if a.Nodes[i] != b.Nodes[i] {
			return false, nil
		}
	}
	for i := range a.Latency {
		if a.Latency[i].From != b.Latency[i].From || a.Latency[i].To != b.Latency[i].To {
			return false, nil
		}
	}
	for i := range a.Services {
		if !sameServiceHead(&a.Services[i], &b.Services[i]) {
			return false, nil
		}
		if !samePodList(&a.Services[i], &b.Services[i]) {
			podsChanged = append(podsChanged, i)
		}
	}
	for i := range a.Calls {
		if a.Calls[i].From != b.Calls[i].From || a.Calls[i].To != b.Calls[i].To {
			return false, nil
		}
	}
	for i := range a.Ingress {
		if a.Ingress[i].Service != b.Ingress[i].Service {
			return false, nil
		}
	}
	return true, podsChanged
}

// sameServiceHead compares everything of a service but its pods.
func sameServiceHead(a, b *Service) bool {
	if a.Name != b.Name || a.Namespace != b.Namespace || a.CPU != b.CPU || a.CPULimit != b.CPULimit || a.QueueScale != b.QueueScale || a.Memory != b.Memory ||
		a.Replicas != b.Replicas || len(a.Ports) != len(b.Ports) || !sameFloat(a.CapacityRPS, b.CapacityRPS) {
		return false
	}
	for i := range a.Ports {
		if a.Ports[i] != b.Ports[i] {
			return false
		}
	}
	return true
}

func samePodList(a, b *Service) bool {
	if len(a.Pods) != len(b.Pods) {
		return false
	}
	for i := range a.Pods {
		p, q := &a.Pods[i], &b.Pods[i]
		if p.Name != q.Name || p.Node != q.Node || p.IP != q.IP || p.Address != q.Address ||
			p.ServiceAccount != q.ServiceAccount || !sameFloat(p.Weight, q.Weight) || !sameFloat(p.CapacityRPS, q.CapacityRPS) {
			return false
		}
	}
	return true
}

func sameFloat(a, b *float64) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// recompile returns the model of t, which has the structure of inc.top (sameStructure): the
// previous model with the latencies, call rates, ingress rates and loads re-read, and the
// services in podsChanged compiled again; latencyChanged says a latency differs. ok is false
// when something is wrong (a bad number, a bad or duplicate pod): compile in full for the error.
func (inc *compileState) recompile(t *Topology, podsChanged []int, opts Options) (_ *Model, latencyChanged, ok bool) {
	prev := inc.model
	m := *prev
	m.Topology = t
	for i, l := range t.Latency {
		if badNumber(l.MS) != "" || l.MS > MaxLatencyMS {
			return nil, false, false
		}
		if l.MS == inc.top.Latency[i].MS {
			continue
		}
		if !latencyChanged { // copy on first write: the previous model stays intact
			latencyChanged = true
			m.Latency = prev.Latency.clone()
		}
		u, v := inc.latIdx[i][0], inc.latIdx[i][1]
		set := m.Latency.Set
		if m.Latency.Zoned() {
			set = m.Latency.SetZone
		}
		set(u, v, l.MS)
		if inc.mirror[i] {
			set(v, u, l.MS)
		}
	}
	m.Calls = append([]CallEdge(nil), prev.Calls...)
	for k, c := range t.Calls {
		r := c.CallRate()
		if badNumber(r) != "" {
			return nil, false, false
		}
		m.Calls[k].Rate = r
	}
	m.Services = append([]ServiceModel(nil), prev.Services...)
	if len(podsChanged) > 0 {
		var bad problems
		names := map[string]string{} // the changed services' pods; the others are in inc.owner
		changed := map[string]bool{}
		for _, s := range podsChanged {
			changed[prev.Services[s].Name] = true
		}
		for _, s := range podsChanged {
			sm := compileService(t.Services[s], m.nodeIndex, names, opts, &bad)
			if bad.err() != nil {
				return nil, false, false
			}
			for _, p := range sm.Pods {
				if owner, ok := inc.owner[p.Name]; ok && !changed[owner] {
					return nil, false, false // a duplicate pod name across services
				}
			}
			m.Services[s] = sm
		}
	}
	ingress := make([]float64, len(m.Services))
	for _, in := range t.Ingress {
		if badNumber(in.RPS) != "" {
			return nil, false, false
		}
		s, _ := m.ServiceIndex(in.Service)
		ingress[s] += in.RPS
	}
	for i := range m.Services {
		m.Services[i].Load = 0
	}
	if inc.out == nil {
		inc.out = make([][]int, len(m.Services))
		for k, c := range m.Calls {
			inc.out[c.From] = append(inc.out[c.From], k)
		}
	}
	// As Compile: in topological order, each service's calls in the order given.
	for _, s := range m.Order {
		m.Services[s].Ingress = ingress[s]
		m.Services[s].Load += ingress[s]
		for _, k := range inc.out[s] {
			c := m.Calls[k]
			m.Services[c.To].Load += m.Services[s].Load * c.Rate
		}
	}
	for i := range m.Services {
		if l := m.Services[i].Load; math.IsInf(l, 0) || math.IsNaN(l) {
			return nil, false, false
		}
	}
	return &m, latencyChanged, true
}

// sameShape says whether the per-edge comparison applies: the same services and call edges,
// in the same order.
func sameShape(a, b *Model) bool {
	if len(a.Services) != len(b.Services) || len(a.Calls) != len(b.Calls) || a.UtilizationCap != b.UtilizationCap {
		return false
	}
	for i := range a.Services {
		if a.Services[i].Name != b.Services[i].Name {
			return false
		}
	}
	for k := range a.Calls {
		if a.Calls[k].From != b.Calls[k].From || a.Calls[k].To != b.Calls[k].To {
			return false
		}
	}
	return true
}

// serviceNodes lists, per service, the distinct nodes of its pods.
func serviceNodes(m *Model) [][]int {
	out := make([][]int, len(m.Services))
	seen := make([]int, len(m.Nodes)) // service index + 1 that last saw the node
	for s := range m.Services {
		for _, p := range m.Services[s].Pods {
			if p.Node >= 0 && seen[p.Node] != s+1 {
				seen[p.Node] = s + 1
				out[s] = append(out[s], p.Node)
			}
		}
	}
	return out
}

// Edge changes, from none to a re-solve.
const (
	edgeSame   = iota
	edgeLoad   // only the caller's load or the rate differ
	edgeInputs // pods or latencies differ
)

// edgeChange says how call edge k's inputs in m differ from prev (sameShape holds); nodes is
// serviceNodes(m).
func edgeChange(prev, m *Model, k int, nodes [][]int) int {
	if edgeChanged(prev, m, k, nodes) {
		return edgeInputs
	}
	e, pe := m.Calls[k], prev.Calls[k]
	if e.Rate != pe.Rate || m.Services[e.From].Load != prev.Services[e.From].Load {
		return edgeLoad
	}
	return edgeSame
}

// splitsOf turns an edge's previous routes back into per-caller splits on m's pod indices
// (the pods are unchanged). Routes are ordered by caller, then callee, in pod order (see
// CallAllocation), so one walk matches them.
func splitsOf(m *Model, e CallEdge, prev *CallAllocation) [][]split {
	callers, callees := m.Services[e.From].Pods, m.Services[e.To].Pods
	out := make([][]split, len(callers))
	j := 0
	for i := range callers {
		c := 0
		for ; j < len(prev.Routes) && prev.Routes[j].Caller == callers[i].Name; j++ {
			for callees[c].Name != prev.Routes[j].Callee {
				c++
			}
			out[i] = append(out[i], split{callee: c, fraction: prev.Routes[j].Fraction})
		}
	}
	return out
}

// edgeChanged says whether call edge k's pods or latencies differ in m from prev; nodes nil
// means no latency changed.
func edgeChanged(prev, m *Model, k int, nodes [][]int) bool {
	e := m.Calls[k]
	a, b := m.Services[e.From].Pods, m.Services[e.To].Pods
	if !samePods(a, prev.Services[e.From].Pods) || !samePods(b, prev.Services[e.To].Pods) {
		return true
	}
	// The latency between every caller node and every callee node (pods are unchanged, so the
	// nodes are the same in both models).
	if nodes == nil {
		return false
	}
	for _, u := range nodes[e.From] {
		for _, v := range nodes[e.To] {
			if m.Latency.At(u, v) != prev.Latency.At(u, v) {
				return true
			}
		}
	}
	return false
}

func samePods(a, b []PodRef) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true // the same slice: a recompile keeps the pods of services it did not touch
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
