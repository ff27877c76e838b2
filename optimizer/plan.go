package optimizer

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/edgeflow/edgeflow/optimizer/mcf"
)

// Numeric rules of the LATA solve. The transportation problem of an edge is solved between nodes
// (nodeflow.go: pods of a node share its flow, north-west corner) exactly in
// integers: latencies are rounded to CostQuantumMS, and supplies and demands are integer units
// (exact for integer weights, else apportioned over FlowUnits; see flowUnits).
//
// The optimum is usually degenerate: several allocations have the same total cost, some using a
// long path a little where another uses two medium ones. Among them edgeflow prefers the fewest
// long paths: each unit cost is c·2^TieBreakBits + t(c), where the tie-break t(c) < 2^TieBreakBits
// grows with the square of c relative to the edge's longest path. The result is a basic (tree)
// solution, so it also has few routes per caller (at most callers+callees−1 in all).
//
// Consequences, which the tests hold the solver to:
//   - the cost is within 1.5 × CostQuantumMS × (total rps) of the true optimum (half a quantum
//     from rounding, less than one from the tie-break);
//   - each caller's fractions sum to 1 within 1e-9, and each callee receives its capacity share
//     within 1e-6 relative.
const (
	CostQuantumMS = 1e-3
	FlowUnits     = 1 << 30
	TieBreakBits  = 8
)

// Plan computes the allocation of policy p for every call edge of m. Edges are solved
// independently, in parallel (GOMAXPROCS workers); the result is identical for any degree of
// parallelism. A caller pod whose weight is zero (it should receive no requests) still gets
// routes: to its nearest callee pods, ties split by weight, so a sidecar never has an empty
// configuration. A model whose latency is per zone is planned between zones (PlanZones).
func Plan(m *Model, p Policy) (*Allocation, error) {
	if _, err := ParsePolicy(string(p)); err != nil {
		return nil, err
	}
	a, _, _, err := planFrom(m, p, nil)
	return a, err
}

// RoundRobinCost returns Plan(m, RoundRobin).Cost without building the allocation: the same
// products summed in the same order, so the two are equal exactly, in O(callers × callees)
// time and no memory per route (Plan's round-robin routes for 10,000 callers of a 50-pod
// service take 28 MB). A model whose latency is per zone is planned between zones, as by Plan.
func RoundRobinCost(m *Model) (float64, error) {
	if m.Latency.Zoned() {
		a, err := Plan(m, RoundRobin)
		if err != nil {
			return 0, err
		}
		return a.Cost, nil
	}
	var total float64
	for _, e := range m.Calls {
		// As roundRobin's rows and buildCallFrom's sums.
		a, b := &m.Services[e.From], &m.Services[e.To]
		w := weights(b.Pods)
		sw, wa := sum(w), a.TotalWeight()
		var cost float64
		for _, caller := range a.Pods {
			supply := a.Load * e.Rate * caller.Weight / wa
			for q, wq := range w {
				if !(wq > 0) {
					continue
				}
				if fraction := wq / sw; fraction > 0 {
					rps := fraction * supply
					cost += float64(rps * m.Latency.At(caller.Node, b.Pods[q].Node)) // unfused, as buildCallFrom
				}
			}
		}
		total += cost
	}
	return total, nil
}

// previousPlan is the last plan made of the model's previous version (incremental recompute),
// and which parts of it a solve may keep: a call edge k with keepEdge(k), and under lata-q a
// callee service b with keepService(b) (its queueing cost from queue[b]). nil keeps nothing.
type previousPlan struct {
	alloc *Allocation
	*queueState
	keepEdge    func(k int) bool
	keepService func(b int) bool
	// keepSplits(k): edge k's pods and latencies are unchanged, only its caller's load or its
	// rate differ. Every policy but lata-q splits a caller's requests independently of the
	// load, so the previous fractions stand and only the rps and cost are rebuilt.
	keepSplits func(k int) bool
}

// planFrom is Plan, keeping what prev allows; it returns the queueing cost per callee service
// (lata-q) and the number of units (edges, or lata-q callee services) it solved.
func planFrom(m *Model, p Policy, prev *previousPlan) (*Allocation, *queueState, int, error) {
	if m.Latency.Zoned() { // planned between zones, in full (see zoneplan.go)
		a, err := PlanZones(m, p)
		return a, nil, len(m.Calls), err
	}
	if p.queued() {
		a, st, solved, err := planQueued(m, prev)
		if a != nil {
			a.Policy = p
			a = foldThinBands(m, a)
		}
		return a, st, solved, err
	}
	alloc := &Allocation{Policy: p, Calls: make([]CallAllocation, len(m.Calls))}
	var todo []int
	for k := range m.Calls {
		switch {
		case prev != nil && prev.keepEdge(k):
			alloc.Calls[k] = prev.alloc.Calls[k]
		case prev != nil && prev.keepSplits(k):
			alloc.Calls[k] = buildCall(m, m.Calls[k], splitsOf(m, m.Calls[k], &prev.alloc.Calls[k]))
		default:
			todo = append(todo, k)
		}
	}
	errs := make([]error, len(todo))
	workers := workerCount()
	allocators := make([]*edgeAllocator, workers) // one per worker, made on first use
	parallelWorkers(workers, len(todo), func(w, i int) {
		if allocators[w] == nil {
			allocators[w] = newEdgeAllocator()
		}
		k := todo[i]
		alloc.Calls[k], errs[i] = allocators[w].call(p, m, m.Calls[k])
	})
	for _, err := range errs {
		if err != nil {
			return nil, nil, 0, err
		}
	}
	for _, c := range alloc.Calls {
		alloc.Cost += c.Cost
	}
	return alloc, nil, len(todo), nil
}

// workerCount is the number of goroutines a parallel solve uses: GOMAXPROCS, read once per
// solve. Go changes GOMAXPROCS at run time (when a container's CPU limit changes), so a caller
// that sizes per-worker scratch must read it once, here, and pass the same count to
// parallelWorkers. A variable so that tests can change the count between reads.
var workerCount = func() int { return runtime.GOMAXPROCS(0) }

// parallel runs f(w, 0) … f(w, n-1) on up to workerCount() goroutines and waits for them. Use
// it only where f ignores w; a caller with per-worker scratch uses parallelWorkers with the
// count it sized the scratch by.
func parallel(n int, f func(w, i int)) { parallelWorkers(workerCount(), n, f) }

// parallelWorkers runs f(w, 0) … f(w, n-1) on up to workers goroutines and waits for them; w is
// the goroutine's number, 0 ≤ w < workers, for per-goroutine scratch. Each f must write only
// its own results, so the outcome does not depend on the scheduling.
func parallelWorkers(workers, n int, f func(w, i int)) {
	workers = min(max(workers, 1), n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				f(w, i)
			}
		}()
	}
	wg.Wait()
}

// edgeAllocator holds one worker's reusable buffers.
type edgeAllocator struct {
	solver *mcf.Solver
	prob   mcf.Transport
	flows  []mcf.Flow
}

func newEdgeAllocator() *edgeAllocator { return &edgeAllocator{solver: mcf.NewSolver()} }

// call allocates edge e under policy p; the error names the edge.
func (a *edgeAllocator) call(p Policy, m *Model, e CallEdge) (CallAllocation, error) {
	splits, err := a.allocate(p, m, e)
	if err != nil {
		return CallAllocation{}, fmt.Errorf("optimizer: call %s → %s: %w", m.Services[e.From].Name, m.Services[e.To].Name, err)
	}
	return buildCall(m, e, splits), nil
}

func (a *edgeAllocator) allocate(p Policy, m *Model, e CallEdge) ([][]split, error) {
	callers, callees := m.Services[e.From].Pods, m.Services[e.To].Pods
	switch p {
	case RoundRobin:
		return roundRobin(callers, callees), nil
	case Localization:
		return localization(callers, callees, m.Latency), nil
	case OptTraffic:
		return optTraffic(callers, callees), nil
	case LATA:
		return a.lata(callers, callees, m.Latency)
	}
	return nil, fmt.Errorf("unknown policy %q", p)
}

// planCoster computes Plan's LATA cost of placements of one model, re-solving only the call
// edges of the services whose pods moved. Its total is summed in call order, as Plan sums it,
// so it equals Plan's cost of the same placement exactly.
type planCoster struct {
	m     Model // a copy whose pods (only their nodes) change
	alloc *edgeAllocator
	calls []float64 // per call, its cost
}

func newPlanCoster(m *Model) *planCoster {
	c := &planCoster{m: *m, alloc: newEdgeAllocator(), calls: make([]float64, len(m.Calls))}
	c.m.Services = slices.Clone(m.Services)
	for s := range c.m.Services {
		c.m.Services[s].Pods = slices.Clone(m.Services[s].Pods)
	}
	return c
}

// set puts global pod i (pp's numbering) on node u; no call is re-solved.
func (c *planCoster) set(pp *placeProblem, i, u int) {
	s := pp.pods[i].svc
	c.m.Services[s].Pods[i-pp.svcs[s].first].Node = u
}

// load puts every pod on its node in nodes (pp's numbering) and solves every call.
func (c *planCoster) load(pp *placeProblem, nodes []int) error {
	for i, u := range nodes {
		c.set(pp, i, u)
	}
	for k := range c.m.Calls {
		if err := c.solveCall(k); err != nil {
			return err
		}
	}
	return nil
}

// cost is Plan's LATA cost of the placement nodes (pp's numbering), which it loads.
func (c *planCoster) cost(pp *placeProblem, nodes []int) (float64, error) {
	if err := c.load(pp, nodes); err != nil {
		return 0, err
	}
	return c.total(), nil
}

// solveService re-solves the calls of service s (after only s's pods moved).
func (c *planCoster) solveService(s int) error {
	for k, e := range c.m.Calls {
		if e.From == s || e.To == s {
			if err := c.solveCall(k); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *planCoster) solveCall(k int) error {
	call, err := c.alloc.call(LATA, &c.m, c.m.Calls[k])
	if err != nil {
		return err
	}
	c.calls[k] = call.Cost
	return nil
}

func (c *planCoster) total() float64 {
	var sum float64
	for _, x := range c.calls {
		sum += x
	}
	return sum
}

func weights(pods []PodRef) []float64 {
	w := make([]float64, len(pods))
	for i, p := range pods {
		w[i] = p.Weight
	}
	return w
}

func roundRobin(callers, callees []PodRef) [][]split {
	w := weights(callees)
	total := sum(w)
	row := make([]split, 0, len(callees))
	for q, wq := range w {
		if wq > 0 {
			row = append(row, split{callee: q, fraction: wq / total})
		}
	}
	out := make([][]split, len(callers))
	for p := range callers {
		out[p] = append([]split(nil), row...)
	}
	return out
}

// nearest splits one caller's requests over its lowest-latency callee pods of positive weight,
// in proportion to their weights.
func nearest(caller PodRef, callees []PodRef, lat LatencyMatrix) []split {
	best := math.Inf(1)
	for _, q := range callees {
		if q.Weight > 0 {
			best = math.Min(best, lat.At(caller.Node, q.Node))
		}
	}
	var row []split
	var total float64
	for i, q := range callees {
		if q.Weight > 0 && lat.At(caller.Node, q.Node) == best {
			row = append(row, split{callee: i, fraction: q.Weight})
			total += q.Weight
		}
	}
	for i := range row {
		row[i].fraction /= total
	}
	return row
}

func localization(callers, callees []PodRef, lat LatencyMatrix) [][]split {
	out := make([][]split, len(callers))
	for p, c := range callers {
		out[p] = nearest(c, callees, lat)
	}
	return out
}

// optTraffic: on every node, callers first fill the same-node callee pods up to their balanced
// share (all callers of the node alike); what callers cannot place locally is spread over all
// callee pods with share left, in proportion to that share, whatever their distance.
func optTraffic(callers, callees []PodRef) [][]split {
	sw, dw := sum(weights(callers)), sum(weights(callees))
	supplyAt, demandAt := map[int]float64{}, map[int]float64{}
	for _, p := range callers {
		supplyAt[p.Node] += p.Weight / sw
	}
	for _, q := range callees {
		demandAt[q.Node] += q.Weight / dw
	}
	// local[u] is the fraction of node u's callers' requests served on u.
	local := map[int]float64{}
	for u, s := range supplyAt {
		d := demandAt[u]
		switch {
		case d == 0:
			local[u] = 0
		case s <= d:
			local[u] = 1
		default:
			local[u] = d / s
		}
	}
	remaining := make([]float64, len(callees))
	var remTotal float64
	for i, q := range callees {
		filled := 0.0
		if s, ok := supplyAt[q.Node]; ok && demandAt[q.Node] > 0 {
			filled = math.Min(1, s/demandAt[q.Node])
		}
		if r := q.Weight / dw * (1 - filled); r > 1e-15 {
			remaining[i] = r
			remTotal += r
		}
	}
	out := make([][]split, len(callers))
	for p, c := range callers {
		alpha := local[c.Node]
		if supplyAt[c.Node] == 0 && demandAt[c.Node] > 0 {
			alpha = 1 // weightless callers only: local pods cost nothing to serve
		}
		var row []split
		for i, q := range callees {
			var f float64
			if q.Node == c.Node && demandAt[c.Node] > 0 {
				f += alpha * (q.Weight / dw) / demandAt[c.Node]
			}
			if alpha < 1 && remTotal > 0 {
				f += (1 - alpha) * remaining[i] / remTotal
			}
			if f > 0 {
				row = append(row, split{callee: i, fraction: f})
			}
		}
		if len(row) == 0 {
			// Only a weightless caller on a node without callee pods, when every share is
			// already filled, gets here: it sends nothing, so the default spread is harmless.
			row = roundRobin(callers[:1], callees)[0]
		}
		out[p] = row
	}
	return out
}

// lata solves the edge's transportation problem exactly in integer units (see FlowUnits),
// between nodes (see nodeflow.go): callers and callees are grouped by node, the node-level
// problem is solved, and expandFlows derives the pod-level flows, at the same cost. Memory is
// O(nodes² + pods) whatever the number of replicas.
func (a *edgeAllocator) lata(callers, callees []PodRef, lat LatencyMatrix) ([][]split, error) {
	supply, demand, exact := flowUnits(weights(callers), weights(callees))
	srcNode, srcGroups := podGroups(podNodes(callers))
	dstNode, dstGroups := podGroups(podNodes(callees))
	cost := latencyCosts(a.prob.Cost, lat, srcNode, dstNode, CostQuantumMS, nil)
	a.prob = mcf.Transport{Sources: len(srcNode), Sinks: len(dstNode), Cost: cost,
		Supply: groupTotals(a.prob.Supply[:0], srcGroups, supply), Demand: groupTotals(a.prob.Demand[:0], dstGroups, demand)}
	flows, _, err := a.solver.Solve(&a.prob, a.flows)
	if err != nil {
		return nil, err
	}
	a.flows = flows
	out := make([][]split, len(callers))
	for _, f := range expandFlows(srcGroups, supply, dstGroups, demand, flows) {
		frac := float64(f.amount) / float64(supply[f.src])
		if !exact && frac < dustFraction {
			continue // an artefact of apportioning, not a route; renormalised below
		}
		out[f.src] = append(out[f.src], split{callee: f.dst, fraction: frac})
	}
	if !exact {
		for _, row := range out {
			var total float64
			for _, s := range row {
				total += s.fraction
			}
			for i := range row {
				row[i].fraction /= total
			}
		}
	}
	for p := range out {
		if supply[p] == 0 {
			out[p] = nearest(callers[p], callees, lat)
		}
	}
	return out, nil
}

// latencyCosts returns the unit costs of the arcs from the nodes from to the nodes to, row by
// row (one row per from node, len(to) long), in buf's memory. With c the latency L(u, v)
// rounded to a whole number of quanta (quantum ms) and longest the largest c of the matrix,
// the arc into to[j] costs
//
//	(c + extra[j])·2^TieBreakBits + tieBreak(c, longest)
//
// where extra is an integer cost per sink in quanta (lata-q's queueing slopes; nil: none). The
// tie-break t(c) < 2^TieBreakBits depends on the latency alone, not on extra, and grows with
// the square of c/longest: of two allocations of equal cost in quanta the one with fewer long
// paths is cheaper, and it costs less than one quantum per unit of flow (see TieBreakBits).
func latencyCosts(buf []int64, lat LatencyMatrix, from, to []int, quantum float64, extra []int64) []int64 {
	cost := buf[:0]
	var longest int64
	for _, u := range from {
		for _, v := range to {
			c := int64(math.Round(lat.At(u, v) / quantum))
			longest = max(longest, c)
			cost = append(cost, c)
		}
	}
	if extra == nil { // lata's hot path: no per-sink term to look up
		for i, c := range cost {
			cost[i] = c<<TieBreakBits + tieBreak(c, longest)
		}
		return cost
	}
	for i, c := range cost {
		cost[i] = (c+extra[i%len(to)])<<TieBreakBits + tieBreak(c, longest)
	}
	return cost
}

// tieBreak is the tie-break t(c) < 2^TieBreakBits of a path of c quanta when the longest is
// longest: it grows with the square of c/longest, so that of two allocations of equal cost the
// one with fewer long paths is cheaper.
func tieBreak(c, longest int64) int64 {
	if longest <= 0 {
		return 0
	}
	const tieMax = 1<<TieBreakBits - 1
	r := float64(c) / float64(longest)
	return int64(math.Round(tieMax * r * r))
}

func podNodes(pods []PodRef) []int {
	out := make([]int, len(pods))
	for i, p := range pods {
		out[i] = p.Node
	}
	return out
}

// groupTotals appends to dst the total amount of each group.
func groupTotals(dst []int64, groups [][]int, amount []int64) []int64 {
	for _, members := range groups {
		var t int64
		for _, i := range members {
			t += amount[i]
		}
		dst = append(dst, t)
	}
	return dst
}

// dustFraction is the smallest route kept when supplies and demands had to be apportioned:
// apportioning leaves a few units that the solver must ship somewhere, which would otherwise
// show up as routes of ~1e-9.
const dustFraction = 1e-6

// flowUnits turns caller and callee weights into integer supplies and demands with equal totals.
// When the weights are integers after scaling by a power of ten (the usual case: default weight
// 1, or millicores), it cross-multiplies, supply_p = w_p·ΣW_callees and demand_q = w_q·ΣW_callers,
// which is exact. Otherwise both sides are apportioned over FlowUnits (exact = false).
func flowUnits(wa, wb []float64) (supply, demand []int64, exact bool) {
	ia, sa, okA := integerWeights(wa, FlowUnits)
	ib, sb, okB := integerWeights(wb, FlowUnits)
	if !okA || !okB || sa > FlowUnits/sb {
		return LargestRemainder(wa, FlowUnits), LargestRemainder(wb, FlowUnits), false
	}
	k := FlowUnits / (sa * sb) // spread the total over the full resolution
	for i := range ia {
		ia[i] *= sb * k
	}
	for j := range ib {
		ib[j] *= sa * k
	}
	return ia, ib, true
}

// integerWeights returns w scaled by the smallest power of ten (1 … 10⁴) that makes every weight
// an integer, with their sum, if that sum is positive and at most limit.
func integerWeights(w []float64, limit int64) ([]int64, int64, bool) {
	for scale := 1.0; scale <= 1e4; scale *= 10 {
		if iw, total, ok := integral(w, scale); ok && total > 0 && total <= limit {
			return iw, total, true
		}
	}
	return nil, 0, false
}

// integral returns w·scale as integers, and their sum, if every one is an integer ≤ FlowUnits.
func integral(w []float64, scale float64) ([]int64, int64, bool) {
	out := make([]int64, len(w))
	var total int64
	for i, x := range w {
		v := x * scale
		if v != math.Trunc(v) || v > FlowUnits {
			return nil, 0, false
		}
		out[i] = int64(v)
		total += out[i]
	}
	return out, total, total <= FlowUnits
}

func sum(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s
}

// LargestRemainder apportions total integer units in proportion to weights (Hamilton's method):
// each gets floor(total·w/Σw), and the units left go to the largest remainders, ties to the
// lower index. The result sums to total exactly whenever Σw > 0; zero weights get zero.
// Weights must be finite and non-negative. O(n log n).
func LargestRemainder(weights []float64, total int64) []int64 {
	out := make([]int64, len(weights))
	sumW := sum(weights)
	if !(sumW > 0) {
		return out
	}
	type rem struct {
		i int
		r float64
	}
	rems := make([]rem, 0, len(weights))
	var given int64
	for i, w := range weights {
		if w <= 0 {
			continue
		}
		exact := float64(total) * (w / sumW)
		out[i] = int64(math.Floor(exact))
		given += out[i]
		rems = append(rems, rem{i, exact - math.Floor(exact)})
	}
	sort.SliceStable(rems, func(a, b int) bool { return rems[a].r > rems[b].r })
	left := total - given
	// Float rounding can leave the floors a unit or so over the total: take those back from
	// the smallest remainders. Normally left ≥ 0 and goes to the largest remainders.
	for left < 0 {
		for j := len(rems) - 1; j >= 0 && left < 0; j-- {
			if out[rems[j].i] > 0 {
				out[rems[j].i]--
				left++
			}
		}
	}
	for left > 0 {
		for _, r := range rems {
			if left == 0 {
				break
			}
			out[r.i]++
			left--
		}
	}
	return out
}
