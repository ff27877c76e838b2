package optimizer

import (
	"fmt"
	"math"
)

// PlacementPolicy names a replica-placement policy.
type PlacementPolicy string

// The placement policies (docs/architecture.md, "The policies").
const (
	// LARP is edgeflow's placement (the shipped default): the paper's greedy from every start
	// node and the Kubernetes spread as starts, the best improved by local search (pod moves,
	// swaps, and on small clusters exchanges of node contents) scored by the exact LATA cost of
	// the placement plus its queueing (Placement.Queueing) where pods have a service rate.
	LARP PlacementPolicy = "larp"
	// LARPGreedy is the paper's greedy: pods dealt round-robin into
	// round(mean replicas) groups, largest group first on the node with the most free capacity,
	// every later group on the free node closest to the nodes already chosen.
	LARPGreedy PlacementPolicy = "larp-greedy"
	// K8sSpread is what the default scheduler does: each service's replicas spread over the
	// nodes, the least-allocated node first. It is the baseline.
	K8sSpread PlacementPolicy = "k8s-spread"
)

// PlacementPolicies lists the placement policies in the order reports show them.
func PlacementPolicies() []PlacementPolicy { return []PlacementPolicy{K8sSpread, LARPGreedy, LARP} }

// ParsePlacementPolicy returns the named placement policy.
func ParsePlacementPolicy(s string) (PlacementPolicy, error) {
	for _, p := range PlacementPolicies() {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("optimizer: unknown placement policy %q (want one of larp, larp-greedy, k8s-spread)", s)
}

// ErrInfeasible is wrapped by the error of a placement that cannot satisfy the constraints (node
// cpu, node memory, the spread cap). It wraps ErrInvalidTopology in turn, so errors.Is matches
// both: an infeasible topology is bad input. The message names the service that cannot fit and
// the constraint that stops it.
var ErrInfeasible = fmt.Errorf("%w: infeasible", ErrInvalidTopology)

func infeasiblef(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInfeasible}, args...)...)
}

// Placement is the result of a placement policy: the node of every pod, and the LATA cost of
// the topology with the pods so placed.
type Placement struct {
	Policy PlacementPolicy `json:"policy" yaml:"policy"`
	// Placement maps each pod name to its node name.
	Placement map[string]string `json:"placement" yaml:"placement"`
	// Cost is the optimal LATA cost under this placement (what Plan(…, LATA) reports for the
	// placed topology): Σ rps × latency over all routes, in ms·req/s.
	Cost float64 `json:"cost" yaml:"cost"`
	// Queueing is the predicted queueing under this placement, in ms·req/s: M/M/1 per pod with
	// a service rate, its rate shared with its node's other pods (LoadSplit); 0 when no pod has
	// one. Cost + Queueing is what larp minimises.
	Queueing float64 `json:"queueing" yaml:"queueing"`
	// Utilization is every node's planned use under this placement (Model.PodCPU), in node
	// order.
	Utilization []NodeUse `json:"utilization,omitempty" yaml:"utilization,omitempty"`
	// Truncated says a budget (PlaceOptions) cut the search short: the placement is the best
	// found by then, valid but possibly not what an unlimited search gives, and, if the
	// wall-time budget cut it, dependent on the machine and its load.
	Truncated bool `json:"truncated,omitempty" yaml:"truncated,omitempty"`
	// Cut says how much of the search ran; set exactly when Truncated.
	Cut *PlacementCut `json:"cut,omitempty" yaml:"cut,omitempty"`
}

// Place computes the placement of every pod of m under policy p. m is normally compiled with
// Options{Unplaced: true}; every pod is placed afresh, whatever node the topology names for it.
//
// Constraints, exactly: on every node the pods' cpu and memory requests sum to at most its
// allocatable (a node whose cpu or memory is 0, i.e. not given, is not limited in it), and no
// node holds more than ceil(replicas/|nodes|) pods of one service. If no placement satisfies
// them, the error wraps ErrInfeasible (and so ErrInvalidTopology) and names the service that
// cannot fit and why. Should the constructive step of a policy fail where a placement exists,
// the pods are packed by an exhaustive search instead; it is bounded (packBudget steps), and
// an error from a search that gave up says so.
//
// The objective is the LATA cost of the placement under the optimal allocation, plus, when some
// pod has a service rate, its queueing with shared cores (Placement.Queueing; larp only: the
// constructive policies ignore it). Place bounds
// larp's search by DefaultPlaceBudget of wall time (see PlaceWithOptions); unless the result
// says Truncated, Place is deterministic: the same model gives the same placement for any
// GOMAXPROCS. It is safe for concurrent use (m is only read).
func Place(m *Model, p PlacementPolicy) (*Placement, error) {
	return PlaceWithOptions(m, p, PlaceOptions{Budget: DefaultPlaceBudget})
}

// PlaceWithOptions is Place with the search bounded by opts (the zero value: no bound). Only
// larp searches; the other policies are single constructive passes and ignore opts. A result
// cut short by opts.Budget says Truncated and is not deterministic; one cut by opts.Steps
// alone says Truncated and is.
func PlaceWithOptions(m *Model, p PlacementPolicy, opts PlaceOptions) (*Placement, error) {
	budget := newLarpBudget(opts) // the clock starts now: indexing the problem counts
	if _, err := ParsePlacementPolicy(string(p)); err != nil {
		return nil, err
	}
	prob, err := newPlaceProblem(m)
	if err != nil {
		return nil, err
	}
	var nodes []int
	var cut *PlacementCut
	switch p {
	case K8sSpread:
		nodes, err = prob.k8sSpreadOrPack()
	case LARPGreedy:
		nodes, err = prob.greedyOrPack(prob.mostFreeNode())
	case LARP:
		nodes, cut, err = prob.larpWithin(larpDefault, budget)
	}
	if err != nil {
		return nil, err
	}
	pl, err := prob.placement(p, nodes)
	if err != nil {
		return nil, err
	}
	pl.Truncated, pl.Cut = cut != nil, cut
	return pl, nil
}

// Apply returns a copy of t with the pods placed: every service lists its pods (generated from
// Replicas as Compile names them, svc-0 … svc-(n-1), when the file gives none) with their nodes,
// and Replicas is dropped, so the result is a valid input of plan. Pods are looked up by their
// PodKey (POD.NS outside the default namespace, as Place names them); pods the placement does
// not name keep the node t gives them. t is not modified.
func (p *Placement) Apply(t *Topology) *Topology {
	c := t.Clone()
	for i := range c.Services {
		s := &c.Services[i]
		if len(s.Pods) == 0 {
			for k := 0; k < s.Replicas; k++ {
				s.Pods = append(s.Pods, Pod{Name: fmt.Sprintf("%s-%d", s.Name, k)})
			}
		}
		for k := range s.Pods {
			if node, ok := p.Placement[s.PodKey(&s.Pods[k])]; ok { // named as Compile names it
				s.Pods[k].Node = node
			}
		}
		s.Replicas = 0
	}
	return c
}

// placement builds the result from per-pod node indices, costing it with Plan (LATA), so the
// cost is exactly what `edgeflow plan` reports for the placed topology.
func (pp *placeProblem) placement(policy PlacementPolicy, nodes []int) (*Placement, error) {
	m := pp.m
	placed := *m
	placed.Services = make([]ServiceModel, len(m.Services))
	out := &Placement{Policy: policy, Placement: make(map[string]string, len(pp.pods))}
	for s, sm := range m.Services {
		sm.Pods = append([]PodRef(nil), sm.Pods...)
		for k := range sm.Pods {
			u := nodes[pp.svcs[s].first+k]
			sm.Pods[k].Node = u
			out.Placement[sm.Pods[k].Name] = m.Nodes[u].Name
		}
		placed.Services[s] = sm
	}
	alloc, err := Plan(&placed, LATA)
	if err != nil {
		return nil, err
	}
	out.Cost = alloc.Cost
	cpu := m.podCPUs()
	out.Queueing, out.Utilization = m.queueing(cpu, nodes), m.nodeUses(cpu, nodes)
	return out, nil
}

// maxServiceUnits bounds the integer weight total of one service in the node-level transport,
// so that a caller's total times a callee's total stays within mcf.MaxTotal (2^30).
const maxServiceUnits = 1 << 15

// placeProblem is the immutable, indexed placement problem shared by every search of one Place
// call. Pods are numbered globally, service by service, in the model's order.
type placeProblem struct {
	m   *Model
	n   int // nodes
	lat placeLatency
	cpu []int64 // allocatable cpu per node; unlimited when not given
	mem []int64
	// load is every pod's planned cpu (Model.PodCPU) in utilizationUnits, loadCap every node's
	// headroom in those units (Model.MaxNodeUtilization of its cores; unlimited when none):
	// a third resource beside cpu and memory requests.
	load    []int64
	loadCap []int64
	// queued says the objective has a queueing part (some pod has a service rate): the search
	// then minimises network + queueing (LoadSplit), with, per pod, rho = ℓ/μ (0 without μ)
	// and cpuUse its planned cpu in millicores (Model.PodCPU), and per node coreM = 1000·cores
	// (0: unknown). A copy with queued false is the network-only search (larpWithin).
	queued bool
	rho    []float64
	cpuUse []float64
	coreM  []float64
	svcs   []placeService
	edges  []placeEdge
	pods   []placePod
	groups []greedyGroup // the paper's groups, largest first (see greedy)
	// zobrist holds two random 64-bit keys per node; a service's mass vector hashes to
	// Σ_u mass(u)·key(u), updated as pods move (see placeState.hash).
	zobrist [][2]uint64
}

type placeService struct {
	cpu, mem     int64
	load         int64 // the largest planned cpu of its pods (the packing search's per-pod demand)
	cap          int   // spread cap: ceil(replicas/|nodes|)
	first, count int   // the service's pods are pods[first : first+count]
	total        int64 // Σ integer weights of its pods (≤ maxServiceUnits)
	edges        []int // incident call edges, ascending
}

type placeEdge struct {
	from, to int
	// factor turns the edge's integer transport cost into ms·req/s: Λ_from·rate·CostQuantumMS
	// / (total_from · total_to).
	factor float64
}

type placePod struct {
	svc int
	w   int64 // integer capacity weight
}

const unlimited = math.MaxInt64

func newPlaceProblem(m *Model) (*placeProblem, error) {
	n := len(m.Nodes)
	pp := &placeProblem{m: m, n: n, lat: newPlaceLatency(m.Latency),
		cpu: make([]int64, n), mem: make([]int64, n), load: m.podLoadUnits(), loadCap: make([]int64, n)}
	pp.cpuUse, pp.coreM = m.podCPUs(), make([]float64, n)
	for s, sm := range m.Services {
		for k, p := range sm.Pods {
			r := 0.0
			if p.CapacityRPS > 0 {
				r = m.podLoad(s, k) / p.CapacityRPS
				pp.queued = true
			}
			pp.rho = append(pp.rho, r)
		}
	}
	for u := 0; u < n; u++ {
		pp.coreM[u] = m.coreMillis(u)
		pp.cpu[u], pp.mem[u], pp.loadCap[u] = m.Nodes[u].CPU, m.Nodes[u].Memory, m.nodeLoadCap(u)
		if pp.cpu[u] == 0 {
			pp.cpu[u] = unlimited
		}
		if pp.mem[u] == 0 {
			pp.mem[u] = unlimited
		}
	}
	pp.zobrist = make([][2]uint64, n)
	seed := uint64(0x9e3779b97f4a7c15)
	for u := range pp.zobrist {
		for k := range pp.zobrist[u] {
			seed = splitmix64(seed)
			pp.zobrist[u][k] = seed
		}
	}
	for s, sm := range m.Services {
		count := len(sm.Pods)
		ps := placeService{cpu: sm.CPU, mem: sm.Mem, cap: (count + n - 1) / n, first: len(pp.pods), count: count}
		w := make([]float64, count)
		for k, p := range sm.Pods {
			w[k] = p.Weight
		}
		iw, total := serviceUnits(w)
		ps.total = total
		for _, x := range iw {
			ps.load = max(ps.load, pp.load[len(pp.pods)])
			pp.pods = append(pp.pods, placePod{svc: s, w: x})
		}
		pp.svcs = append(pp.svcs, ps)
	}
	for e, c := range m.Calls {
		a, b := &pp.svcs[c.From], &pp.svcs[c.To]
		pe := placeEdge{from: c.From, to: c.To}
		if a.total > 0 && b.total > 0 {
			pe.factor = m.Services[c.From].Load * c.Rate * CostQuantumMS / (float64(a.total) * float64(b.total))
		}
		pp.edges = append(pp.edges, pe)
		a.edges = append(a.edges, e)
		b.edges = append(b.edges, e)
	}
	if err := pp.checkAlone(); err != nil {
		return nil, err
	}
	pp.groups = pp.makeGroups()
	return pp, nil
}

// placeLatency is the latency of every node pair as the placement search reads it. When the
// model's latency is per node, it is two n×n tables, node u on row and column u; when it is
// per zone, two zones×zones tables, node u on row and column zone[u] (the model's own index),
// so 5,000 nodes in 50 zones take 2,500 entries per table instead of 25 million. The loops
// that read it test zone once and run the per-node loop of old unchanged, or its per-zone
// twin; both read the same values, so a placement does not depend on the granularity.
type placeLatency struct {
	q    []int64   // L(u,v) quantised to CostQuantumMS, w×w row-major (from, to)
	sym  []float64 // L(u,v)+L(v,u), w×w: the greedy's distance
	w    int       // rows (and columns): nodes, or zones
	zone []int32   // node → row and column; nil when per node
}

func newPlaceLatency(lm LatencyMatrix) placeLatency {
	zoneOf, k, zoned := lm.zoneIndex()
	if !zoned {
		k = lm.Len()
	}
	at := lm.At
	if zoned {
		at = lm.ZoneAt
	}
	lat := placeLatency{q: make([]int64, k*k), sym: make([]float64, k*k), w: k, zone: zoneOf}
	for g := 0; g < k; g++ {
		for h := 0; h < k; h++ {
			lat.q[g*k+h] = int64(math.Round(at(g, h) / CostQuantumMS))
			lat.sym[g*k+h] = at(g, h) + at(h, g)
		}
	}
	return lat
}

// zonesOf appends to dst the zone of each node in nodes (per zone only).
func (lat *placeLatency) zonesOf(nodes, dst []int) []int {
	for _, u := range nodes {
		dst = append(dst, int(lat.zone[u]))
	}
	return dst
}

// symRow returns L(u,v)+L(v,u) for every node v: a row of sym when per node; when per zone,
// buf (n long) filled from u's zone's row.
func (lat *placeLatency) symRow(u int, buf []float64) []float64 {
	if lat.zone == nil {
		return lat.sym[u*lat.w : u*lat.w+lat.w]
	}
	g := int(lat.zone[u])
	row := lat.sym[g*lat.w : g*lat.w+lat.w]
	for v, h := range lat.zone {
		buf[v] = row[h]
	}
	return buf
}

// splitmix64 is one step of the SplitMix64 generator (a fixed sequence: no randomness).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// serviceUnits turns a service's pod weights into integers with a total of at most
// maxServiceUnits: exactly when they are integers after scaling by a power of ten (default
// weight 1), else by largest remainder (a relative error of at most 2^-15 per pod, which only
// steers the search; the reported cost is computed by Plan).
func serviceUnits(w []float64) ([]int64, int64) {
	if iw, total, ok := integerWeights(w, maxServiceUnits); ok {
		return iw, total
	}
	iw := LargestRemainder(w, maxServiceUnits)
	var total int64
	for _, x := range iw {
		total += x
	}
	return iw, total
}

// fits says how many pods of service s fit in free cpu c, memory r and headroom l (capped at
// limit), each taking the service's largest planned cpu.
func (pp *placeProblem) fits(s int, c, r, l int64, limit int) int {
	ps := &pp.svcs[s]
	k := int64(limit)
	if ps.cpu > 0 && c != unlimited {
		k = min(k, c/ps.cpu)
	}
	if ps.mem > 0 && r != unlimited {
		k = min(k, r/ps.mem)
	}
	if ps.load > 0 && l != unlimited {
		k = min(k, l/ps.load)
	}
	return int(k)
}

// mostFreeNode is the node with the most allocatable capacity, cpu and memory each relative to
// the largest node's (an unlimited resource counts as the largest); ties go to the lower index.
// It is where the paper's greedy puts its first group.
func (pp *placeProblem) mostFreeNode() int {
	maxC, maxM := int64(0), int64(0)
	for u := 0; u < pp.n; u++ {
		if pp.cpu[u] != unlimited {
			maxC = max(maxC, pp.cpu[u])
		}
		if pp.mem[u] != unlimited {
			maxM = max(maxM, pp.mem[u])
		}
	}
	best, bestScore := 0, math.Inf(-1)
	for u := 0; u < pp.n; u++ {
		score := relative(pp.cpu[u], maxC) + relative(pp.mem[u], maxM)
		if score > bestScore {
			best, bestScore = u, score
		}
	}
	return best
}

func relative(v, of int64) float64 {
	if v == unlimited || of == 0 {
		return 1
	}
	return float64(v) / float64(of)
}

// placeState is one candidate placement with the bookkeeping the searches need: per-(service,
// node) pod counts and weight, free capacity, and the integer transport cost of every edge.
// It is owned by one goroutine.
type placeState struct {
	pp       *placeProblem
	node     []int   // per pod; -1 while unplaced
	count    []int32 // [s*n+u] pods of s on u
	mass     []int64 // [s*n+u] Σ integer weight of s's pods on u
	occ      [][]int // per service, the nodes holding its pods, ascending
	freeCPU  []int64
	freeMem  []int64
	freeLoad []int64   // headroom left (see placeProblem.load)
	podsOn   [][]int   // per node, its pods
	edgeCost []int64   // per edge, the node-level transport cost in integer units
	nodeQ    []float64 // per node, the queueing of its pods (placeProblem.queued only)
	eval     transportEval
	// hash[s] is the pair of Zobrist hashes of service s's mass vector; memo caches edge costs
	// by the hashes of both ends, so the placements local search revisits are not re-solved.
	// Two independent 64-bit hashes per end make a wrong hit (≈ 2^-128 per pair of vectors)
	// practically impossible.
	hash []([2]uint64)
	memo []memoEntry // nil: no cache (a state costed once)
	// duals[e] are optimal duals of edge e under the current placement (nil: not kept).
	duals []edgeDual

	bounds      []float64 // scratch of trial
	swapEdges   []int     // scratch of trySwap
	scratchPods []int     // scratch of exchange
	zoneSrc     []int     // scratch of price: the zones of an edge's nodes
	zoneDst     []int
}

func (pp *placeProblem) newState() *placeState {
	n := pp.n
	st := &placeState{
		pp:       pp,
		node:     make([]int, len(pp.pods)),
		count:    make([]int32, len(pp.svcs)*n),
		mass:     make([]int64, len(pp.svcs)*n),
		occ:      make([][]int, len(pp.svcs)),
		freeCPU:  append([]int64(nil), pp.cpu...),
		freeMem:  append([]int64(nil), pp.mem...),
		freeLoad: append([]int64(nil), pp.loadCap...),
		podsOn:   make([][]int, n),
		edgeCost: make([]int64, len(pp.edges)),
		nodeQ:    make([]float64, n),
		eval:     newTransportEval(),
		hash:     make([][2]uint64, len(pp.svcs)),
	}
	for i := range st.node {
		st.node[i] = -1
	}
	return st
}

// reset empties the state (every pod unplaced), keeping its buffers.
func (st *placeState) reset() {
	n := st.pp.n
	for s, nodes := range st.occ {
		for _, u := range nodes {
			st.count[s*n+u], st.mass[s*n+u] = 0, 0
		}
		st.occ[s] = nodes[:0]
		st.hash[s] = [2]uint64{}
	}
	for u := range st.podsOn {
		st.podsOn[u] = st.podsOn[u][:0]
	}
	copy(st.freeCPU, st.pp.cpu)
	copy(st.freeMem, st.pp.mem)
	copy(st.freeLoad, st.pp.loadCap)
	for i := range st.node {
		st.node[i] = -1
	}
	clear(st.nodeQ)
}

// canHost says whether pod i may be added to node v (resources, headroom and spread cap).
func (st *placeState) canHost(i, v int) bool {
	s := st.pp.pods[i].svc
	return int(st.count[s*st.pp.n+v]) < st.pp.svcs[s].cap && st.fitsResources(i, v)
}

// add puts the unplaced pod i on node v; the caller has checked canHost. Edge costs are not
// updated (see refresh).
func (st *placeState) add(i, v int) {
	s, n := st.pp.pods[i].svc, st.pp.n
	ps := &st.pp.svcs[s]
	st.node[i] = v
	k := s*n + v
	if st.count[k] == 0 {
		st.occ[s] = insertSorted(st.occ[s], v)
	}
	st.count[k]++
	st.mass[k] += st.pp.pods[i].w
	w := uint64(st.pp.pods[i].w)
	st.hash[s][0] += w * st.pp.zobrist[v][0]
	st.hash[s][1] += w * st.pp.zobrist[v][1]
	if st.freeCPU[v] != unlimited {
		st.freeCPU[v] -= ps.cpu
	}
	if st.freeMem[v] != unlimited {
		st.freeMem[v] -= ps.mem
	}
	if st.freeLoad[v] != unlimited {
		st.freeLoad[v] -= st.pp.load[i]
	}
	st.podsOn[v] = append(st.podsOn[v], i)
	if st.pp.queued {
		st.nodeQ[v] = st.queueWith(v, -1, -1)
	}
}

// queueWith returns the queueing of node v's pods (see LoadSplit) were pod add (≥ 0) added to
// it and pod skip (≥ 0) taken off; O(pods on v). The sum runs in podsOn order, add last.
func (st *placeState) queueWith(v, add, skip int) float64 {
	pp := st.pp
	used := 0.0
	for _, p := range st.podsOn[v] {
		if p != skip {
			used += pp.cpuUse[p]
		}
	}
	if add >= 0 {
		used += pp.cpuUse[add]
	}
	var q float64
	term := func(p int) {
		if pp.rho[p] > 0 {
			o := 0.0
			if c := pp.coreM[v]; c > 0 {
				o = (used - pp.cpuUse[p]) / c
			}
			q += queueTerm(pp.rho[p], o, pp.m.UtilizationCap)
		}
	}
	for _, p := range st.podsOn[v] {
		if p != skip {
			term(p)
		}
	}
	if add >= 0 {
		term(add)
	}
	return q
}

// moveQueue returns the change in queueing were pod p moved from its node to v (≠ its node),
// leaving the state as it is; 0 when the objective has no queueing part.
func (st *placeState) moveQueue(p, v int) float64 {
	if !st.pp.queued {
		return 0
	}
	u := st.node[p]
	return st.queueWith(u, -1, p) + st.queueWith(v, p, -1) - st.nodeQ[u] - st.nodeQ[v]
}

// remove takes pod i off its node.
func (st *placeState) remove(i int) {
	s, n, v := st.pp.pods[i].svc, st.pp.n, st.node[i]
	ps := &st.pp.svcs[s]
	k := s*n + v
	st.count[k]--
	st.mass[k] -= st.pp.pods[i].w
	w := uint64(st.pp.pods[i].w)
	st.hash[s][0] -= w * st.pp.zobrist[v][0]
	st.hash[s][1] -= w * st.pp.zobrist[v][1]
	if st.count[k] == 0 {
		st.occ[s] = removeSorted(st.occ[s], v)
	}
	if st.freeCPU[v] != unlimited {
		st.freeCPU[v] += ps.cpu
	}
	if st.freeMem[v] != unlimited {
		st.freeMem[v] += ps.mem
	}
	if st.freeLoad[v] != unlimited {
		st.freeLoad[v] += st.pp.load[i]
	}
	on := st.podsOn[v]
	for j, p := range on {
		if p == i {
			copy(on[j:], on[j+1:])
			st.podsOn[v] = on[:len(on)-1]
			break
		}
	}
	st.node[i] = -1
	if st.pp.queued {
		st.nodeQ[v] = st.queueWith(v, -1, -1)
	}
}

func insertSorted(s []int, v int) []int {
	j := len(s)
	for j > 0 && s[j-1] > v {
		j--
	}
	s = append(s, 0)
	copy(s[j+1:], s[j:])
	s[j] = v
	return s
}

func removeSorted(s []int, v int) []int {
	for j, x := range s {
		if x == v {
			return append(s[:j], s[j+1:]...)
		}
	}
	return s
}

// load places every pod as nodes says (a complete placement) into an empty state and costs it.
func (st *placeState) load(nodes []int) {
	for i, v := range nodes {
		st.add(i, v)
	}
	st.refresh()
}

// refresh recomputes every edge's cost.
func (st *placeState) refresh() {
	for e := range st.pp.edges {
		st.resolveEdge(e)
	}
}

// resolveEdge recomputes and caches edge e's cost, and its optimal duals if the state keeps
// them (local search does).
func (st *placeState) resolveEdge(e int) {
	if st.duals == nil || st.pp.edges[e].factor == 0 {
		st.edgeCost[e] = st.solveEdge(e)
		return
	}
	st.buildEdge(e)
	st.edgeCost[e] = st.eval.solve(&st.pp.lat)
	st.eval.duals(&st.pp.lat, &st.duals[e])
}

// cost is the placement's cost in ms·req/s: its LATA cost, summed in edge order, plus, when
// the objective has a queueing part, its queueing, summed in node order.
func (st *placeState) cost() float64 {
	var c float64
	for e, pe := range st.pp.edges {
		c += pe.factor * float64(st.edgeCost[e])
	}
	if st.pp.queued {
		for _, q := range st.nodeQ {
			c += q
		}
	}
	return c
}

// solveEdge returns the optimal cost, in integer units, of edge e's node-level transportation
// problem under the current placement: supply at node u = (weight of caller pods on u) × total
// callee weight, demand at v = (weight of callee pods on v) × total caller weight, unit cost
// L(u,v) in CostQuantumMS. LATA's cost depends on pods only through their nodes, so this is
// the edge's optimal LATA cost whatever the pod counts; it has at most |nodes|² arcs.
func (st *placeState) solveEdge(e int) int64 {
	pe := &st.pp.edges[e]
	if pe.factor == 0 {
		return 0
	}
	if st.memo == nil {
		st.buildEdge(e)
		return st.eval.solve(&st.pp.lat)
	}
	ha, hb := st.hash[pe.from], st.hash[pe.to]
	h := ha[0] ^ hb[0]*0x9e3779b97f4a7c15 ^ uint64(e)*0xbf58476d1ce4e5b9
	slot := &st.memo[h&uint64(len(st.memo)-1)]
	if slot.valid && slot.edge == e && slot.from == ha && slot.to == hb {
		return slot.cost
	}
	st.buildEdge(e)
	c := st.eval.solve(&st.pp.lat)
	*slot = memoEntry{valid: true, edge: e, from: ha, to: hb, cost: c}
	return c
}

// maxMemo bounds the edge-cost cache of a state: a direct-mapped table of a power of two
// slots (16 per edge and node, at most 2^15, ≈ 1.5 MiB), where a new entry replaces the
// slot's old one.
const maxMemo = 1 << 15

func (pp *placeProblem) memoSize() int {
	size := 256
	for size < maxMemo && size < 16*len(pp.edges)*pp.n {
		size *= 2
	}
	return size
}

type memoEntry struct {
	valid    bool
	edge     int
	from, to [2]uint64
	cost     int64
}

// buildEdge loads edge e's node-level transportation problem into st.eval.
func (st *placeState) buildEdge(e int) {
	pe := &st.pp.edges[e]
	n := st.pp.n
	a, b := pe.from, pe.to
	ta, tb := st.pp.svcs[a].total, st.pp.svcs[b].total
	ev := &st.eval
	ev.src, ev.supply = ev.src[:0], ev.supply[:0]
	for _, u := range st.occ[a] {
		if w := st.mass[a*n+u]; w > 0 {
			ev.src = append(ev.src, u)
			ev.supply = append(ev.supply, w*tb)
		}
	}
	ev.dst, ev.demand = ev.dst[:0], ev.demand[:0]
	for _, v := range st.occ[b] {
		if w := st.mass[b*n+v]; w > 0 {
			ev.dst = append(ev.dst, v)
			ev.demand = append(ev.demand, w*ta)
		}
	}
}

// snapshot returns the per-pod nodes.
func (st *placeState) snapshot() []int { return append([]int(nil), st.node...) }
