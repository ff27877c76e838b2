package optimizer

import (
	"math"
	"sort"
	"sync/atomic"
)

var debugLS func(pass int, cost float64)

// localSearch improves the placement by moving a pod to another node or swapping two pods of
// different services, within the constraints, until no such step lowers the cost (or
// tune.maxPasses passes). Each step is scored exactly, by re-solving only the node-level
// transports of the call edges that touch the services it moves.
//
// A pass visits the services in order and, for each node holding pods of the service, one pod
// per distinct weight (pods of equal weight on one node are interchangeable). Its targets are
// the tune.candidates nodes with the lowest proxy cost (see rankNodes) that are below the
// service's spread cap. A move is tried where the pod fits; where it does not (cpu or memory),
// swaps with each distinct pod on the target. The best improving step of the (service, node)
// is applied. Deterministic: no randomness, no map iteration.
func (st *placeState) localSearch(tune larpTuning) {
	pp := st.pp
	n := pp.n
	if st.memo == nil {
		st.memo = make([]memoEntry, pp.memoSize())
	}
	if st.duals == nil {
		st.duals = make([]edgeDual, len(pp.edges))
		st.refresh()
	}
	proxy := make([]float64, n)
	ranked := make([]int, n)
	var cands, reps, partners []int
	// dirty[s]: s or a neighbour moved since s was last visited ("don't look bits"); a clean
	// service's steps were all non-improving then, and are assumed still to be.
	dirty := make([]bool, len(pp.svcs))
	for s := range dirty {
		dirty[s] = len(pp.svcs[s].edges) > 0 // else its placement does not change the cost
	}
	touch := func(s int) {
		dirty[s] = true
		for _, e := range pp.svcs[s].edges {
			dirty[pp.edges[e].from] = true
			dirty[pp.edges[e].to] = true
		}
	}
	passes := 0
	for {
		for ; passes < tune.maxPasses; passes++ {
			tol := 1e-9 * max(1, st.cost())
			improved := false
			for s := range pp.svcs {
				if !dirty[s] {
					continue
				}
				dirty[s] = false
				st.rankNodes(s, proxy, ranked)
				for _, u := range append([]int(nil), st.occ[s]...) {
					if st.count[s*n+u] == 0 {
						continue
					}
					reps = st.representatives(s, u, reps[:0])
					cands = st.candidates(s, u, ranked, cands[:0], tune.candidates, proxy, tune.proxySlack)
					bestDelta, bestP, bestQ, bestV := -tol, -1, -1, -1
					for _, p := range reps {
						for _, v := range cands {
							d := st.tryMove(p, v, bestDelta)
							if st.fitsResources(s, v) {
								if d < bestDelta {
									bestDelta, bestP, bestQ, bestV = d, p, -1, v
								}
								continue
							}
							// No room on v: d is what the move would gain if there were. Swaps
							// are tried only where that is worth having (a swap of two pods
							// that would each rather stay is not considered from this side;
							// from the other pod's side it is).
							if d >= bestDelta {
								continue
							}
							partners = st.swapPartners(p, v, partners[:0])
							for _, q := range partners {
								if d := st.trySwap(p, q, bestDelta); d < bestDelta {
									bestDelta, bestP, bestQ, bestV = d, p, q, v
								}
							}
						}
					}
					if bestP < 0 {
						continue
					}
					if bestQ < 0 {
						st.remove(bestP)
						st.add(bestP, bestV)
						st.resolve(pp.svcs[s].edges)
					} else {
						t := pp.pods[bestQ].svc
						st.swap(bestP, bestQ)
						st.resolve(pp.svcs[s].edges)
						st.resolve(pp.svcs[t].edges)
						touch(t)
					}
					touch(s)
					improved = true
					dbgImproves.Add(1)
				}
			}
			if debugLS != nil {
				debugLS(passes, st.cost())
			}
			if !improved {
				break
			}
		}
		// Pod steps are exhausted. Exchanging the whole contents of two nodes moves a
		// co-located group at once, which no single pod step can do without first making
		// things worse.
		if passes >= tune.maxPasses || n > tune.exchangeMaxNodes || !st.exchangeNodes(touch) {
			return
		}
		passes++
	}
}

// exchangeNodes applies the best improving exchange of the contents of two nodes (all their
// pods), if any, and marks the services it moved with touch. Exchanging keeps every per-node
// pod count of a service, so spread caps hold; cpu and memory are checked.
func (st *placeState) exchangeNodes(touch func(s int)) bool {
	pp := st.pp
	n := pp.n
	tol := 1e-9 * max(1, st.cost())
	bestDelta, bestU, bestV := -tol, -1, -1
	mark := make([]bool, len(pp.edges))
	var edges []int
	for u := 0; u < n; u++ {
		for v := u + 1; v < n; v++ {
			if len(st.podsOn[u]) == 0 && len(st.podsOn[v]) == 0 || !st.exchangeFits(u, v) {
				continue
			}
			edges = edges[:0]
			for _, w := range [2]int{u, v} {
				for _, p := range st.podsOn[w] {
					for _, e := range pp.svcs[pp.pods[p].svc].edges {
						if !mark[e] {
							mark[e] = true
							edges = append(edges, e)
						}
					}
				}
			}
			for _, e := range edges {
				mark[e] = false
			}
			if len(edges) == 0 {
				continue
			}
			sort.Ints(edges)
			old := st.incident(edges)
			st.exchange(u, v)
			d := st.trial(edges, old, bestDelta)
			st.exchange(u, v)
			if d < bestDelta {
				bestDelta, bestU, bestV = d, u, v
			}
		}
	}
	if bestU < 0 {
		return false
	}
	st.exchange(bestU, bestV)
	for _, w := range [2]int{bestU, bestV} {
		for _, p := range st.podsOn[w] {
			s := pp.pods[p].svc
			st.resolve(pp.svcs[s].edges)
			touch(s)
		}
	}
	return true
}

// exchangeFits says whether the pods of u fit v's allocatable cpu and memory and vice versa.
func (st *placeState) exchangeFits(u, v int) bool {
	cu, mu := st.requests(u)
	cv, mv := st.requests(v)
	pp := st.pp
	return cu <= pp.cpu[v] && mu <= pp.mem[v] && cv <= pp.cpu[u] && mv <= pp.mem[u]
}

// requests sums the cpu and memory requests of the pods on v (saturating).
func (st *placeState) requests(v int) (cpu, mem int64) {
	for _, p := range st.podsOn[v] {
		ps := &st.pp.svcs[st.pp.pods[p].svc]
		cpu, mem = satAdd(cpu, ps.cpu), satAdd(mem, ps.mem)
	}
	return cpu, mem
}

// exchange moves every pod of u to v and every pod of v to u (the caller checked the fit).
func (st *placeState) exchange(u, v int) {
	onU := append(st.scratchPods[:0], st.podsOn[u]...)
	split := len(onU)
	onU = append(onU, st.podsOn[v]...)
	st.scratchPods = onU
	for _, p := range onU {
		st.remove(p)
	}
	for k, p := range onU {
		if k < split {
			st.add(p, v)
		} else {
			st.add(p, u)
		}
	}
}

// rankNodes orders all nodes by a proxy of the cost of one pod of s there: what the pod's
// traffic would cost if it were spread over its neighbour services' pods in proportion to
// their weight (the round-robin cost). The proxy depends only on the neighbours' placement.
func (st *placeState) rankNodes(s int, proxy []float64, ranked []int) {
	pp := st.pp
	n := pp.n
	for v := range proxy {
		proxy[v] = 0
		ranked[v] = v
	}
	lat := pp.m.Latency
	for _, e := range pp.svcs[s].edges {
		pe := &pp.edges[e]
		other := pe.to
		if other == s {
			other = pe.from
		}
		scale := pp.m.Services[pe.from].Load * pp.m.Calls[e].Rate / float64(max(1, pp.svcs[other].total))
		for _, w := range st.occ[other] {
			mass := float64(st.mass[other*n+w]) * scale
			if mass == 0 {
				continue
			}
			for v := 0; v < n; v++ {
				if pe.from == s {
					proxy[v] += mass * lat.At(v, w)
				} else {
					proxy[v] += mass * lat.At(w, v)
				}
			}
		}
	}
	sort.SliceStable(ranked, func(a, b int) bool { return proxy[ranked[a]] < proxy[ranked[b]] })
}

// representatives returns one pod of s on u per distinct weight.
func (st *placeState) representatives(s, u int, dst []int) []int {
	for _, p := range st.podsOn[u] {
		if st.pp.pods[p].svc != s || st.hasWeight(dst, st.pp.pods[p].w) {
			continue
		}
		dst = append(dst, p)
	}
	return dst
}

func (st *placeState) hasWeight(pods []int, w int64) bool {
	for _, p := range pods {
		if st.pp.pods[p].w == w {
			return true
		}
	}
	return false
}

// candidates returns the first k nodes of ranked, other than u, where s is below
// its spread cap.
func (st *placeState) candidates(s, u int, ranked, dst []int, k int, proxy []float64, slack float64) []int {
	n := st.pp.n
	limit := int32(st.pp.svcs[s].cap)
	for _, v := range ranked {
		if len(dst) == k || slack >= 0 && proxy[v] > proxy[u]*(1+slack) {
			break
		}
		if v != u && st.count[s*n+v] < limit {
			dst = append(dst, v)
		}
	}
	return dst
}

// fitsResources says whether one more pod of s fits node v's free cpu and memory.
func (st *placeState) fitsResources(s, v int) bool {
	ps := &st.pp.svcs[s]
	return ps.cpu <= st.freeCPU[v] && ps.mem <= st.freeMem[v]
}

// swapPartners returns the pods on v, one per distinct (service, weight), that pod p may swap
// with: of another service, below that service's spread cap on p's node, and with both nodes
// within cpu and memory after the swap.
func (st *placeState) swapPartners(p, v int, dst []int) []int {
	pp := st.pp
	n := pp.n
	s, u := pp.pods[p].svc, st.node[p]
	ps := &pp.svcs[s]
	first := len(dst)
	for _, q := range st.podsOn[v] {
		t := pp.pods[q].svc
		if t == s || int(st.count[t*n+u]) >= pp.svcs[t].cap {
			continue
		}
		pt := &pp.svcs[t]
		if !swapFits(st.freeCPU[v], pt.cpu, ps.cpu) || !swapFits(st.freeMem[v], pt.mem, ps.mem) ||
			!swapFits(st.freeCPU[u], ps.cpu, pt.cpu) || !swapFits(st.freeMem[u], ps.mem, pt.mem) {
			continue
		}
		dup := false
		for _, r := range dst[first:] {
			if pp.pods[r].svc == t && pp.pods[r].w == pp.pods[q].w {
				dup = true
				break
			}
		}
		if !dup {
			dst = append(dst, q)
		}
	}
	return dst
}

// swapFits says whether a node with free capacity free fits in after releasing out and taking in.
func swapFits(free, out, in int64) bool {
	return free == unlimited || in-out <= free
}

// incident returns the cost, in ms·req/s, of the given edges as currently cached.
func (st *placeState) incident(edges []int) float64 {
	var c float64
	for _, e := range edges {
		c += st.pp.edges[e].factor * float64(st.edgeCost[e])
	}
	return c
}

// resolve recomputes and caches the cost of the given edges.
func (st *placeState) resolve(edges []int) {
	for _, e := range edges {
		st.resolveEdge(e)
	}
}

// trial returns the cost, in ms·req/s, of the given edges under the current (trial) placement
// minus old, or +Inf as soon as lower bounds show that the difference is not below limit. It
// first bounds every edge (see transportEval.bound), then solves them one by one, so a step
// that cannot win costs a few bounds instead of transports.
func (st *placeState) trial(edges []int, old, limit float64) float64 {
	bounds := st.bounds[:0]
	var c float64
	for _, e := range edges {
		b := 0.0
		if f := st.pp.edges[e].factor; f != 0 {
			st.buildEdge(e)
			if st.duals != nil {
				b = f * st.eval.dualBound(st.pp.lq, st.pp.n, &st.duals[e])
			} else {
				b = f * float64(st.eval.bound(st.pp.lq, st.pp.n))
			}
		}
		bounds = append(bounds, b)
		c += b
	}
	st.bounds = bounds
	dbgTrials.Add(1)
	if c-old >= limit {
		dbgPruned.Add(1)
	}
	if noBound {
		c = 0
		for i := range bounds {
			bounds[i] = 0
		}
	}
	if c-old >= limit {
		return math.Inf(1)
	}
	for i, e := range edges {
		c += st.pp.edges[e].factor*float64(st.solveEdge(e)) - bounds[i]
		if c-old >= limit {
			return math.Inf(1)
		}
	}
	return c - old
}

// tryMove returns the change in cost if pod p moved to v, leaving the state as it was; +Inf if
// the change is not below limit. It ignores v's free resources (the caller checks them).
func (st *placeState) tryMove(p, v int, limit float64) float64 {
	dbgMoves.Add(1)
	edges := st.pp.svcs[st.pp.pods[p].svc].edges
	u := st.node[p]
	old := st.incident(edges)
	st.remove(p)
	st.add(p, v)
	d := st.trial(edges, old, limit)
	st.remove(p)
	st.add(p, u)
	return d
}

// trySwap returns the change in cost if pods p and q exchanged nodes, leaving the state as it
// was; +Inf if the change is not below limit.
func (st *placeState) trySwap(p, q int, limit float64) float64 {
	dbgSwaps.Add(1)
	pp := st.pp
	s, t := pp.pods[p].svc, pp.pods[q].svc
	edges := append(st.swapEdges[:0], pp.svcs[s].edges...)
	for _, e := range pp.svcs[t].edges {
		if pe := &pp.edges[e]; pe.from != s && pe.to != s {
			edges = append(edges, e)
		}
	}
	st.swapEdges = edges
	old := st.incident(edges)
	st.swap(p, q)
	d := st.trial(edges, old, limit)
	st.swap(p, q)
	return d
}

// swap exchanges the nodes of pods p and q (the caller has checked the constraints).
func (st *placeState) swap(p, q int) {
	u, v := st.node[p], st.node[q]
	st.remove(p)
	st.remove(q)
	st.add(p, v)
	st.add(q, u)
}

var noBound bool

var dbgMoves, dbgSwaps, dbgImproves, dbgTrials, dbgPruned atomic.Int64
