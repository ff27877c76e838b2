package optimizer

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/edgeflow/edgeflow/optimizer/mcf"
)

// lata-q, load-aware LATA: LATA with each pod's fixed share replaced by a queueing delay.
//
// A callee pod q with a service rate μ_q (capacity_rps) is an M/M/1 queue: at load ℓ it adds
// 1000·ℓ/(μ_q−ℓ) ms·req/s of queueing (its mean sojourn time in ms times its rate; the same
// unit as Cost). lata-q minimises Σ rps × latency + Σ_q 1000·ℓ_q/(μ_q−ℓ_q) subject to
// ℓ_q ≤ cap·μ_q (Model.UtilizationCap), instead of fixing each pod's share.
//
// The load on a pod comes from every call edge into its service, so lata-q solves one problem
// per callee service b with a service rate: the supplies are the caller pods of every edge
// into b, and b's ingress λ⁰_b is a fixed background load bg_q = λ⁰_b · w_q / Σw on each pod
// (external traffic is balanced by weight, not by edgeflow). Services without a service rate
// keep lata's fixed shares, edge by edge: without any capacity_rps lata-q is exactly lata.
//
// A caller pod sends what it receives times the edge's rate. Under lata every pod receives its
// share by weight, σ = Λ_a · r_ab · w_p / Σw; under lata-q a service it solved receives what
// the plan sends it, which is not its share by weight (that is the point). So lata-q solves the
// callee services in topological order of the call graph, level by level (the services of one
// level in parallel), and each problem's supplies are its callers' planned loads: the loads the
// proxies will really see, so the cap holds for them and the costs are what the plan causes.
// The lata edges into services without a service rate (or saturated) use the same supplies;
// their callees still receive exactly their shares by weight.
//
// The convex queueing term is linearised: each pod's curve g(ℓ) = 1000·ℓ/(μ−ℓ) is
// interpolated between bg_q and cap·μ_q at the loads k·μ_q/QueueResolution (every 1 % of μ)
// and both ends, giving parallel arcs from the pod to a sink, one per segment, with capacity
// the segment's width and cost its chord's slope 1000·μ/((μ−x₀)(μ−x₁)), increasing. The
// chords lie above the curve, so the linearised cost bounds the true one from above; the
// difference is largest near the cap, where the curve bends most. The arcs of equal cost on one
// node are merged, and callers are grouped by node, so the problem stays a dense node-level
// transportation problem (mcf), made balanced by a slack source that takes up the unused
// capacity at cost 0: integral, exact and deterministic. Latencies and slopes are rounded to
// a quantum of max(CostQuantumMS, largest cost / 2^23) ms, and among allocations of equal
// cost the one with the fewest long paths wins, by lata's tie-break (see TieBreakBits), so
// the result is within 1.5 × quantum × (rps into b) of the linearised optimum. That matters
// where pods sit at their cap, whose queueing is then fixed: lata's unsplit routes rather than
// any split of equal cost (a caller pod split over several callees sends each a random, so
// burstier, stream). Flows are integer units, at most (Σ cap·μ)/2^30 rps each, so a pod's load
// is within a few units of its segments, and shares under 10⁻⁶ of a caller's are dropped as
// dust, as in lata. The pod-level routes come from the node-level flows by expandFlows
// (nodeflow.go).
//
// Low load fills only the first, cheapest segments: each caller goes to its nearest pod of
// equal μ (localization). Load near cap·Σμ leaves each pod at its cap: with μ ∝ weight,
// lata's shares.

// QueueResolution is the number of linear pieces lata-q uses for a pod's queueing curve from
// 0 to μ: breakpoints every μ/QueueResolution (1 % of μ). A hundred pieces keep the chord above
// the curve within about 1/QueueResolution of the curve's own slope below 50 % utilisation,
// while the node-level problem of a service stays small (≈ 90 sinks per distinct pod per node).
const QueueResolution = 100

func (m *Model) queueResolution() int {
	if m.resolution > 0 {
		return m.resolution
	}
	return QueueResolution
}

// queueSegment is one linear piece of a pod's queueing curve.
type queueSegment struct {
	pod          int
	width, slope float64 // rps, ms per rps
}

// queueSegments returns the linear pieces of q's cost (1000·ℓ/(μ−ℓ) for M/M/1) from bg to cap·μ.
// resolution is the number of pieces from 0 to μ (QueueResolution in Plan).
func queueSegments(pod int, q podQueue, bg, cap float64, resolution int) []queueSegment {
	mu := q.mu
	res := float64(resolution)
	hi := cap * mu
	var out []queueSegment
	x0 := bg
	for k := math.Floor(bg/mu*res) + 1; ; k++ {
		x1 := min(hi, k*mu/res)
		if x1 > x0 {
			slope := 1000 * mu / ((mu - x0) * (mu - x1)) // M/M/1's chord, in closed form
			if q.slots > 0 {
				slope = (q.cost(x1) - q.cost(x0)) / (x1 - x0)
			}
			out = append(out, queueSegment{pod: pod, width: x1 - x0, slope: slope})
			x0 = x1
		}
		if x1 >= hi {
			return out
		}
	}
}

// queueCost is 1000·ℓ/(μ−ℓ), the M/M/1 term of one pod.
func queueCost(load, mu float64) float64 { return 1000 * load / (mu - load) }

// queuedService is the outcome of lata-q for one callee service.
type queuedService struct {
	calls     map[int]CallAllocation // by index in Model.Calls
	queueCost float64
	load      []float64 // each pod's planned load: background plus what the callers send it
}

// hasCapacity reports whether lata-q treats s as a set of queues.
func hasCapacity(s *ServiceModel) bool {
	for _, p := range s.Pods {
		if p.CapacityRPS > 0 {
			return true
		}
	}
	return false
}

// queueState is what lata-q leaves per callee service for an incremental recompute: its
// queueing cost, if saturated, why, and its pods' planned loads (nil: by weight); and per call
// edge lata-q's own allocation (raw), whether or not lata's was served instead, and the lata
// plan it was compared with (nil: none).
type queueState struct {
	queue     []float64
	saturated []string
	load      [][]float64
	raw       []CallAllocation
	lata      *Allocation
}

// overCap says a service's load cannot be kept under its pods' utilisation cap: lata-q serves
// it as lata by capacity (shares by each pod's capacity, every pod at the same utilisation: the
// saturated limit) and lists it in Allocation.Saturated.
type overCap struct{ why string }

func (e overCap) Error() string { return e.why }

// callerPiece is one caller pod of one edge into the service.
type callerPiece struct {
	edge, pod, node int
	rps             float64
}

// queued solves lata-q for callee service b, fed by the call edges edgeIdx; load[s] are the
// planned loads of service s's pods (nil: by weight).
func (a *edgeAllocator) queued(m *Model, b int, edgeIdx []int, load [][]float64) (queuedService, error) {
	svc := &m.Services[b]
	pods := svc.Pods
	cap := m.UtilizationCap
	wb := svc.TotalWeight()
	totalMu := totalCapacity(svc)
	if svc.Load > cap*totalMu*(1+1e-12) {
		return queuedService{}, overCap{fmt.Sprintf("service %q: load %.6g rps exceeds its utilisation cap %g × capacity %.6g rps", svc.Name, svc.Load, cap, totalMu)}
	}
	bg := make([]float64, len(pods))
	var segs []queueSegment
	for i, q := range pods {
		if q.Weight == 0 {
			continue
		}
		bg[i] = svc.Ingress * q.Weight / wb
		if bg[i] > cap*q.CapacityRPS*(1+1e-12) {
			return queuedService{}, overCap{fmt.Sprintf("pod %q (service %q): its share of the ingress, %.6g rps, exceeds its utilisation cap %g × capacity %.6g rps", q.Name, svc.Name, bg[i], cap, q.CapacityRPS)}
		}
		segs = append(segs, queueSegments(i, svc.queueOf(q), bg[i], cap, m.queueResolution())...)
	}

	var pieces []callerPiece
	var supplyRPS float64
	for k, ek := range edgeIdx {
		e := m.Calls[ek]
		caller := &m.Services[e.From]
		wa := caller.TotalWeight()
		for p, pod := range caller.Pods {
			rps := caller.Load * e.Rate * pod.Weight / wa
			if load[e.From] != nil {
				rps = load[e.From][p] * e.Rate
			}
			pieces = append(pieces, callerPiece{edge: k, pod: p, node: pod.Node, rps: rps})
			supplyRPS += rps
		}
	}

	var capacity float64
	for _, s := range segs {
		capacity += s.width
	}
	pieceSplits := make([][]split, len(pieces))
	units := make([]int64, len(pieces))
	if supplyRPS > 0 && capacity > 0 {
		var err error
		units, err = a.solveQueued(m, pods, pieces, segs, supplyRPS, capacity, pieceSplits)
		if err != nil {
			return queuedService{}, err
		}
	}
	for i, pc := range pieces {
		if units[i] == 0 {
			pieceSplits[i] = nearest(m.Services[m.Calls[edgeIdx[pc.edge]].From].Pods[pc.pod], pods, m.Latency)
		}
	}

	// Per-edge splits, CallAllocations and the pods' loads.
	planned := append([]float64(nil), bg...)
	byEdge := make([][][]split, len(edgeIdx))
	for k, ek := range edgeIdx {
		byEdge[k] = make([][]split, len(m.Services[m.Calls[ek].From].Pods))
	}
	for i, pc := range pieces {
		byEdge[pc.edge][pc.pod] = pieceSplits[i]
		for _, s := range pieceSplits[i] {
			planned[s.callee] += s.fraction * pc.rps
		}
	}
	out := queuedService{calls: map[int]CallAllocation{}, load: planned}
	for k, ek := range edgeIdx {
		e := m.Calls[ek]
		out.calls[ek] = buildCallFrom(m, e, byEdge[k], load[e.From])
	}
	for i, q := range pods {
		if q.Weight > 0 {
			out.queueCost += svc.queueOf(q).cost(planned[i])
		}
	}
	return out, nil
}

// solveQueued solves the linearised problem and fills splits; it returns each piece's units
// (0: the piece sends nothing and gets no route here).
func (a *edgeAllocator) solveQueued(m *Model, pods []PodRef, pieces []callerPiece, segs []queueSegment, supplyRPS, capacity float64, splits [][]split) ([]int64, error) {
	// Integer units: the capacity is FlowUnits; each pod's segments get its capacity's units.
	total := int64(FlowUnits)
	segUnits := make([]int64, len(segs))
	{
		var podW []float64
		var podSegs [][]int
		at := map[int]int{}
		for j, s := range segs {
			k, ok := at[s.pod]
			if !ok {
				k = len(podW)
				at[s.pod] = k
				podW = append(podW, 0)
				podSegs = append(podSegs, nil)
			}
			podW[k] += s.width
			podSegs[k] = append(podSegs[k], j)
		}
		podUnits := LargestRemainder(podW, total)
		for k, js := range podSegs {
			w := make([]float64, len(js))
			for i, j := range js {
				w[i] = segs[j].width
			}
			for i, u := range LargestRemainder(w, podUnits[k]) {
				segUnits[js[i]] = u
			}
		}
	}
	supplyUnits := min(total, int64(math.Round(supplyRPS/capacity*float64(total))))
	rps := make([]float64, len(pieces))
	for i, pc := range pieces {
		rps[i] = pc.rps
	}
	units := LargestRemainder(rps, supplyUnits)

	// The cost quantum: fine, unless the steepest slope needs a coarser one to fit mcf.
	var steepest, longest float64
	for _, s := range segs {
		steepest = max(steepest, s.slope)
	}
	for i := range m.Latency.ms {
		longest = max(longest, m.Latency.ms[i])
	}
	quantum := max(CostQuantumMS, (steepest+longest)/(1<<(31-TieBreakBits)))
	return units, a.solveQueuedUnits(m.Latency, pods, pieces, units, segs, segUnits, quantum, splits)
}

// solveQueuedUnits solves the node-level problem in integer units and fills splits.
func (a *edgeAllocator) solveQueuedUnits(lat LatencyMatrix, pods []PodRef, pieces []callerPiece, units []int64,
	segs []queueSegment, segUnits []int64, quantum float64, splits [][]split) error {
	pieceNode := make([]int, len(pieces))
	for i, pc := range pieces {
		pieceNode[i] = pc.node
	}
	srcNode, srcGroups := podGroups(pieceNode)
	// Sinks: the segments, merged when on one node at one (rounded) cost.
	type sinkKey struct {
		node  int
		slope int64
	}
	sinkAt := map[sinkKey]int{}
	var sinkNode []int
	var sinkSlope, sinkUnits []int64
	var sinkSegs [][]int
	for j, sg := range segs {
		key := sinkKey{pods[sg.pod].Node, int64(math.Round(sg.slope / quantum))}
		s, ok := sinkAt[key]
		if !ok {
			s = len(sinkNode)
			sinkAt[key] = s
			sinkNode, sinkSlope = append(sinkNode, key.node), append(sinkSlope, key.slope)
			sinkUnits, sinkSegs = append(sinkUnits, 0), append(sinkSegs, nil)
		}
		sinkUnits[s] += segUnits[j]
		sinkSegs[s] = append(sinkSegs[s], j)
	}
	g := len(srcNode) // the slack source's index
	// Each arc: its latency plus the sink's slope, tie-broken by the latency; the slack
	// source's row costs 0.
	cost := latencyCosts(a.prob.Cost, lat, srcNode, sinkNode, quantum, sinkSlope)
	for range sinkNode {
		cost = append(cost, 0)
	}
	supply := groupTotals(a.prob.Supply[:0], srcGroups, units)
	var capUnits, shipped int64
	for _, u := range sinkUnits {
		capUnits += u
	}
	for _, u := range units {
		shipped += u
	}
	supply = append(supply, capUnits-shipped)
	a.prob = mcf.Transport{Sources: g + 1, Sinks: len(sinkNode), Cost: cost, Supply: supply, Demand: append(a.prob.Demand[:0], sinkUnits...)}
	flows, _, err := a.solver.Solve(&a.prob, a.flows)
	if err != nil {
		return fmt.Errorf("optimizer: lata-q for service %q: %w", pods[0].Name, err)
	}
	a.flows = flows

	// Each sink's real inflow, back to its segments (pro rata) and so to pods.
	inflow := make([]int64, len(sinkNode))
	for _, f := range flows {
		if f.Source < g {
			inflow[f.Sink] += f.Amount
		}
	}
	podUnits := make([]int64, len(pods))
	for s, js := range sinkSegs {
		w := make([]float64, len(js))
		for i, j := range js {
			w[i] = float64(segUnits[j])
		}
		for i, u := range LargestRemainder(w, inflow[s]) {
			podUnits[segs[js[i]].pod] += u
		}
	}
	// Node-level flows from caller node groups to callee node groups.
	dstNode, dstGroups := podGroups(podNodes(pods))
	groupOf := map[int]int{}
	for h, v := range dstNode {
		groupOf[v] = h
	}
	agg := map[[2]int]int64{}
	for _, f := range flows {
		if f.Source < g {
			agg[[2]int{f.Source, groupOf[sinkNode[f.Sink]]}] += f.Amount
		}
	}
	nodeFlows := make([]mcf.Flow, 0, len(agg))
	for k, amount := range agg {
		nodeFlows = append(nodeFlows, mcf.Flow{Source: k[0], Sink: k[1], Amount: amount})
	}
	sort.Slice(nodeFlows, func(i, j int) bool {
		if nodeFlows[i].Source != nodeFlows[j].Source {
			return nodeFlows[i].Source < nodeFlows[j].Source
		}
		return nodeFlows[i].Sink < nodeFlows[j].Sink
	})
	for _, f := range expandFlows(srcGroups, units, dstGroups, podUnits, nodeFlows) {
		if frac := float64(f.amount) / float64(units[f.src]); frac >= dustFraction {
			splits[f.src] = append(splits[f.src], split{callee: f.dst, fraction: frac})
		}
	}
	for _, row := range splits {
		var t float64
		for _, s := range row {
			t += s.fraction
		}
		for i := range row {
			row[i].fraction /= t
		}
	}
	return nil
}

// planQueued is Plan for lata-q: one problem per callee service with a service rate, lata per
// edge into the others, level by level of the call graph (see above). It keeps what prev allows
// (see previousPlan: a callee service whose inputs, its callers' planned loads among them, are
// unchanged) and returns the per-service state and the number of callee services it solved.
func planQueued(m *Model, prev *previousPlan) (*Allocation, *queueState, int, error) {
	alloc := &Allocation{Policy: LATAQ, Calls: make([]CallAllocation, len(m.Calls))}
	into := make([][]int, len(m.Services))
	for k, e := range m.Calls {
		into[e.To] = append(into[e.To], k)
	}
	st := &queueState{queue: make([]float64, len(m.Services)), saturated: make([]string, len(m.Services)),
		load: make([][]float64, len(m.Services))}
	workers := workerCount()
	allocators := make([]*edgeAllocator, workers)
	var solved int
	for _, level := range callLevels(m, into) {
		var targets []int
		for _, b := range level {
			if len(into[b]) == 0 && !hasCapacity(&m.Services[b]) {
				continue // no edge to allocate; its pods receive their shares by weight
			}
			if prev != nil && prev.keepService(b) && sameCallerLoads(m, into[b], prev.load, st.load) {
				for _, k := range into[b] {
					alloc.Calls[k] = prev.raw[k]
				}
				st.queue[b], st.saturated[b], st.load[b] = prev.queue[b], prev.saturated[b], prev.load[b]
				continue
			}
			targets = append(targets, b)
		}
		solved += len(targets)
		errs := make([]error, len(targets))
		parallelWorkers(workers, len(targets), func(w, t int) {
			if allocators[w] == nil {
				allocators[w] = newEdgeAllocator()
			}
			errs[t] = allocators[w].queuedService(m, targets[t], into[targets[t]], alloc, st)
		})
		for _, err := range errs {
			if err != nil {
				return nil, nil, 0, err
			}
		}
	}
	for _, c := range alloc.Calls {
		alloc.Cost += c.Cost
	}
	for _, q := range st.queue {
		alloc.QueueCost += q
	}
	for _, why := range st.saturated {
		if why != "" {
			alloc.Saturated = append(alloc.Saturated, why)
		}
	}
	st.raw = alloc.Calls
	lata, err := lataUnlessBeaten(m, alloc, st, prev)
	if err != nil {
		return nil, nil, 0, err
	}
	return lata, st, solved, nil
}

// lataUnlessBeaten returns lata's allocation, as lata-q's (ServedAsLATA), when it costs no more
// than lata-q's own, alloc, in lata-q's objective: Σ rps × latency plus, for the pods of the
// services lata-q solved as queues, 1000·ℓ/(μ−ℓ), exactly (not linearised), at the loads each
// allocation really puts on them. Otherwise it returns alloc. The lata plan is kept in st; prev
// lets it keep what the previous one allows, edge by edge, as Plan under lata does.
//
// lata-q solves one callee service at a time, top down: each solve takes its callers' loads
// as given and cannot see what its own choice costs the services below (a pod loaded more
// calls more from its node). Where lata-q's gain is small (loads near the cap, or little to
// localise) that blindness can make its plan a little worse than lata's equal shares, and lata's
// is then served: lata-q's plan is never worse than lata's in the objective it minimises.
func lataUnlessBeaten(m *Model, alloc *Allocation, st *queueState, prev *previousPlan) (*Allocation, error) {
	if alloc.QueueCost == 0 {
		return alloc, nil // no service solved as queues: alloc is lata's already
	}
	var prevLATA *previousPlan
	if prev != nil && prev.queueState != nil && prev.lata != nil {
		prevLATA = &previousPlan{alloc: prev.lata, keepEdge: prev.keepEdge, keepSplits: prev.keepSplits}
	}
	lata, _, _, err := planFrom(m, LATA, prevLATA)
	if err != nil {
		return nil, err
	}
	st.lata = lata
	var queue float64
	for b := range m.Services {
		svc := &m.Services[b]
		if !hasCapacity(svc) {
			continue
		}
		saturated := st.saturated[b] != ""
		wb, mu := svc.TotalWeight(), totalCapacity(svc)
		for _, q := range svc.Pods {
			if q.Weight == 0 {
				continue
			}
			l := svc.Load * q.Weight / wb
			if l >= q.CapacityRPS && (!saturated || l > svc.Load*q.CapacityRPS/mu*(1+1e-9)) {
				return alloc, nil // lata overloads a pod lata-q does not, or more than by capacity
			}
			if !saturated {
				queue += svc.queueOf(q).cost(l)
			}
		}
	}
	if lata.Cost+queue > alloc.Cost+alloc.QueueCost {
		return alloc, nil
	}
	served := *lata
	served.Policy, served.QueueCost, served.Saturated, served.ServedAsLATA = LATAQ, queue, alloc.Saturated, true
	return &served, nil
}

// queuedService allocates every edge into callee service b (edges) and records b's state in
// st: queued if b has a service rate and its load fits under the cap, else lata. The error
// names the service or edge.
func (a *edgeAllocator) queuedService(m *Model, b int, edges []int, alloc *Allocation, st *queueState) error {
	if hasCapacity(&m.Services[b]) {
		res, err := a.queued(m, b, edges, st.load)
		var over overCap
		switch {
		case errors.As(err, &over):
			st.saturated[b] = over.why
		case err != nil:
			return err
		default:
			for k, c := range res.calls {
				alloc.Calls[k] = c
			}
			st.queue[b], st.load[b] = res.queueCost, res.load
			if len(edges) == 0 {
				st.load[b] = nil // only its ingress: by weight
			}
			return nil
		}
	}
	// lata: b's pods receive their shares by weight, whatever the callers' loads; exactly so
	// (st.load[b] stays nil) when every caller's are by weight, else within lata's rounding,
	// and then b's loads are what the routes send. A saturated service (its load past the cap
	// of its measured capacity) is lata by capacity instead (byCapacity): every pod at the same
	// utilisation, the least the service's load allows; by weight would load a pod measured
	// slower than its peers past its capacity while they have room.
	callees, byCap := m.Services[b].Pods, st.saturated[b] != ""
	if byCap {
		callees = byCapacity(callees)
	}
	var planned []float64
	for _, k := range edges {
		from := m.Calls[k].From
		var err error
		if alloc.Calls[k], err = a.callFrom(m, m.Calls[k], st.load[from], callees); err != nil {
			return err
		}
		if (st.load[from] != nil || byCap) && planned == nil {
			planned = make([]float64, len(m.Services[b].Pods))
		}
	}
	if planned != nil {
		svc := &m.Services[b]
		at := make(map[string]int, len(svc.Pods))
		share, total := svc.Pods, svc.TotalWeight()
		if byCap {
			share, total = callees, totalCapacity(svc)
		}
		for i, q := range svc.Pods {
			at[q.Name] = i
			planned[i] = svc.Ingress * share[i].Weight / total
		}
		for _, k := range edges {
			for _, r := range alloc.Calls[k].Routes {
				planned[at[r.Callee]] += r.RPS
			}
		}
		st.load[b] = planned
	}
	return nil
}

// byCapacity is pods with each weight replaced by the pod's capacity (requests/s), for lata's
// shares by capacity; pods of weight 0 (not ready, draining) keep 0.
func byCapacity(pods []PodRef) []PodRef {
	out := slices.Clone(pods)
	for i := range out {
		if out[i].Weight > 0 {
			out[i].Weight = out[i].CapacityRPS
		}
	}
	return out
}

// callFrom is call(LATA, …) into callees (the callee service's pods, or byCapacity's) for
// callers whose pods receive load[p] requests/s (nil: by weight): their supplies are those
// loads times the edge's rate.
func (a *edgeAllocator) callFrom(m *Model, e CallEdge, load []float64, callees []PodRef) (CallAllocation, error) {
	callers := m.Services[e.From].Pods
	if load != nil {
		callers = slices.Clone(callers)
		for p := range callers {
			callers[p].Weight = load[p]
		}
	}
	splits, err := a.lata(callers, callees, m.Latency)
	if err != nil {
		return CallAllocation{}, fmt.Errorf("optimizer: call %s → %s: %w", m.Services[e.From].Name, m.Services[e.To].Name, err)
	}
	return buildCallFrom(m, e, splits, load), nil
}

// callLevels groups the services by level of the call graph: a service's level is one more
// than its callers' highest (0 without callers), so every service's callers are in earlier
// levels. Services keep their topological order within a level.
func callLevels(m *Model, into [][]int) [][]int {
	level := make([]int, len(m.Services))
	var out [][]int
	for _, s := range m.Order {
		for _, k := range into[s] {
			level[s] = max(level[s], level[m.Calls[k].From]+1)
		}
		for len(out) <= level[s] {
			out = append(out, nil)
		}
		out[level[s]] = append(out[level[s]], s)
	}
	return out
}

// sameCallerLoads says whether every caller service of the edges has the same planned pod
// loads in prev (the last recompute) as in now.
func sameCallerLoads(m *Model, edges []int, prev, now [][]float64) bool {
	for _, k := range edges {
		from := m.Calls[k].From
		if !slices.Equal(prev[from], now[from]) || (prev[from] == nil) != (now[from] == nil) {
			return false
		}
	}
	return true
}

// totalCapacity is Σ capacity over svc's pods of positive weight.
func totalCapacity(svc *ServiceModel) float64 {
	var total float64
	for _, q := range svc.Pods {
		if q.Weight > 0 {
			total += q.CapacityRPS
		}
	}
	return total
}
