package optimizer

import (
	"cmp"
	"math"
	"slices"
	"sort"
)

// localSearchWithin improves the placement by moving a pod to another node or swapping two pods of
// different services, within the constraints, until no such step lowers the cost (or
// tune.maxPasses passes); then, on clusters of at most tune.exchangeMaxNodes nodes, it
// exchanges the contents of two nodes if that helps, and starts over.
//
// Every step is scored exactly, by re-solving only the node-level transports of the call
// edges that touch the services it moves — but only if a lower bound does not already rule it
// out. The bound comes from the optimal duals of those transports under the current placement
// (see price): moving a pod of weight w from u to v changes an edge's optimal cost by at least
// w·(π(v) − π(u)), π being the edge's dual price of one unit of the service at a node. So a
// pass visits the services in order and, for each node u holding pods of the service, one pod
// per distinct weight (pods of equal weight are interchangeable); it ranks all nodes v below
// the service's spread cap by that bound, and evaluates exactly, best bound first, the (at most
// tune.candidates) moves whose bound still promises a gain. A move is applied if the pod fits
// v; where it does not (cpu or memory), swaps with each distinct pod on v are tried instead.
// The best improving step of the (service, node) is applied.
//
// A service whose neighbourhood has not changed since it was last visited is skipped ("don't
// look" bits). Deterministic: no randomness, no map iteration.
//
// It stops when budget says so (see stepsLeft.spend): every
// step applied so far lowered the cost and kept the constraints, so the state is then a valid
// placement no worse than the start. It returns the passes run; budget.cut says whether the
// budget stopped it.
func (st *placeState) localSearchWithin(tune larpTuning, budget *stepsLeft) (passes int) {
	pp := st.pp
	n := pp.n
	if st.memo == nil {
		st.memo = make([]memoEntry, pp.memoSize())
	}
	if st.duals == nil {
		st.duals = make([]edgeDual, len(pp.edges))
		st.refresh()
	}
	price, bound := make([]float64, n), make([]float64, n)
	var nodes, cands, reps, partners []int
	// dirty[s]: s or a neighbour moved since s was last visited.
	dirty := make([]bool, len(pp.svcs))
	for s := range dirty {
		dirty[s] = len(pp.svcs[s].edges) > 0 || pp.queued // else its placement does not change the cost
	}
	touch := func(s int) {
		if pp.queued {
			// A move changes the queueing of every pod on the two nodes: any service may
			// now gain from a step.
			for t := range dirty {
				dirty[t] = true
			}
			return
		}
		dirty[s] = true
		for _, e := range pp.svcs[s].edges {
			dirty[pp.edges[e].from] = true
			dirty[pp.edges[e].to] = true
		}
	}
	for {
		for ; passes < tune.maxPasses; passes++ {
			tol := 1e-9 * max(1, st.cost())
			improved := false
			for s := range pp.svcs {
				if !dirty[s] {
					continue
				}
				dirty[s] = false
				nodes = append(nodes[:0], st.occ[s]...)
				for _, u := range nodes {
					if st.count[s*n+u] == 0 {
						continue
					}
					st.price(s, price)
					reps = st.representatives(s, u, reps[:0])
					bestDelta, bestP, bestQ, bestV := -tol, -1, -1, -1
					for _, p := range reps {
						st.moveBounds(p, price, bound)
						cands = st.candidates(s, u, bound, bestDelta, cands[:0])
						for k, v := range cands {
							if k == tune.candidates || bound[v] >= bestDelta {
								break
							}
							if budget.spend() {
								return passes
							}
							d := st.tryMove(p, v, bestDelta)
							if st.fitsResources(p, v) {
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
								if budget.spend() {
									return passes
								}
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
				}
			}
			if !improved {
				break
			}
		}
		// Pod steps are exhausted. Exchanging the whole contents of two nodes moves a
		// co-located group at once, which no single pod step can do without first making
		// things worse.
		if passes >= tune.maxPasses || n > tune.exchangeMaxNodes || !st.exchangeNodes(touch, budget) {
			return passes
		}
		passes++
	}
}

// price sets price[v], for every node v, to the dual price of one unit of service s's weight
// on v: Σ over the call edges of s of factor × (the other end's total weight) × the edge's
// optimal dual potential of v — its α where s calls, its β where s is called. A node that
// holds none of s's pods gets the largest potential that keeps the edge's dual feasible
// (min over the other end's nodes of L − potential). By weak duality, moving a pod of weight
// w from u to v raises the cost of s's edges by at least w·(price[v] − price[u]).
func (st *placeState) price(s int, price []float64) {
	pp := st.pp
	n := pp.n
	lq, w, zone := pp.lat.q, pp.lat.w, pp.lat.zone
	for v := range price {
		price[v] = 0
	}
	for _, e := range pp.svcs[s].edges {
		pe := &pp.edges[e]
		if pe.factor == 0 {
			continue
		}
		d := &st.duals[e]
		// The table's rows and columns of d's nodes: the nodes themselves when the latency
		// is per node, their zones when it is per zone.
		src, dst := d.src, d.dst
		if zone != nil {
			st.zoneSrc, st.zoneDst = pp.lat.zonesOf(d.src, st.zoneSrc[:0]), pp.lat.zonesOf(d.dst, st.zoneDst[:0])
			src, dst = st.zoneSrc, st.zoneDst
		}
		if pe.from == s {
			scale := pe.factor * float64(pp.svcs[pe.to].total)
			k := 0
			for v := 0; v < n; v++ {
				for k < len(d.src) && d.src[k] < v {
					k++
				}
				var a float64
				if k < len(d.src) && d.src[k] == v {
					a = d.alpha[k]
				} else {
					a = math.Inf(1)
					r := v
					if zone != nil {
						r = int(zone[v])
					}
					row := lq[r*w:]
					for j, x := range dst {
						a = min(a, float64(row[x])-d.beta[j])
					}
				}
				price[v] += scale * a
			}
		} else {
			scale := pe.factor * float64(pp.svcs[pe.from].total)
			k := 0
			for v := 0; v < n; v++ {
				for k < len(d.dst) && d.dst[k] < v {
					k++
				}
				var b float64
				if k < len(d.dst) && d.dst[k] == v {
					b = d.beta[k]
				} else {
					b = math.Inf(1)
					c := v
					if zone != nil {
						c = int(zone[v])
					}
					for i, x := range src {
						b = min(b, float64(lq[x*w+c])-d.alpha[i])
					}
				}
				price[v] += scale * b
			}
		}
	}
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

// moveBounds sets bound[v], for every node v other than pod p's node u, to a lower bound of the
// change in cost were p moved to v: w·(price[v] − price[u]) for the network part (see price;
// w the pod's integer weight), plus the exact change in queueing (moveQueue).
func (st *placeState) moveBounds(p int, price, bound []float64) {
	u, w := st.node[p], float64(st.pp.pods[p].w)
	for v := range bound {
		bound[v] = w * (price[v] - price[u])
		if v != u {
			bound[v] += st.moveQueue(p, v)
		}
	}
}

// candidates returns the nodes other than u where s is below its spread cap and moving the pod
// may gain more than limit (its bound is below limit), best bound first (ties: lower node).
func (st *placeState) candidates(s, u int, bound []float64, limit float64, dst []int) []int {
	n := st.pp.n
	capacity := int32(st.pp.svcs[s].cap)
	for v := 0; v < n; v++ {
		if v != u && st.count[s*n+v] < capacity && bound[v] < limit {
			dst = append(dst, v)
		}
	}
	slices.SortStableFunc(dst, func(a, b int) int { return cmp.Compare(bound[a], bound[b]) })
	return dst
}

// exchangeNodes applies the best improving exchange of the contents of two nodes (all their
// pods), if any, and marks the services it moved with touch. Exchanging keeps every per-node
// pod count of a service, so spread caps hold; cpu and memory are checked. When budget says
// stop, it applies nothing.
func (st *placeState) exchangeNodes(touch func(s int), budget *stepsLeft) bool {
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
			if len(edges) == 0 && !pp.queued {
				continue
			}
			if budget.spend() {
				return false
			}
			sort.Ints(edges)
			old, oldQ := st.incident(edges), st.nodeQ[u]+st.nodeQ[v]
			st.exchange(u, v)
			dq := st.nodeQ[u] + st.nodeQ[v] - oldQ
			d := st.trial(edges, old, bestDelta-dq) + dq
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

// exchangeFits says whether the pods of u fit v's allocatable cpu and memory and headroom,
// and vice versa.
func (st *placeState) exchangeFits(u, v int) bool {
	cu, mu, lu := st.requests(u)
	cv, mv, lv := st.requests(v)
	pp := st.pp
	return cu <= pp.cpu[v] && mu <= pp.mem[v] && lu <= pp.loadCap[v] && cv <= pp.cpu[u] && mv <= pp.mem[u] && lv <= pp.loadCap[u]
}

// requests sums the cpu and memory requests and the planned cpu of the pods on v (saturating).
func (st *placeState) requests(v int) (cpu, mem, load int64) {
	for _, p := range st.podsOn[v] {
		ps := &st.pp.svcs[st.pp.pods[p].svc]
		cpu, mem, load = satAdd(cpu, ps.cpu), satAdd(mem, ps.mem), satAdd(load, st.pp.load[p])
	}
	return cpu, mem, load
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

// fitsResources says whether pod i, not on v, fits node v's free cpu, memory and headroom.
func (st *placeState) fitsResources(i, v int) bool {
	ps := &st.pp.svcs[st.pp.pods[i].svc]
	return ps.cpu <= st.freeCPU[v] && ps.mem <= st.freeMem[v] && st.pp.load[i] <= st.freeLoad[v]
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
			!swapFits(st.freeCPU[u], ps.cpu, pt.cpu) || !swapFits(st.freeMem[u], ps.mem, pt.mem) ||
			!swapFits(st.freeLoad[v], pp.load[q], pp.load[p]) || !swapFits(st.freeLoad[u], pp.load[p], pp.load[q]) {
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
				b = f * st.eval.dualBound(&st.pp.lat, &st.duals[e])
			} else {
				b = f * float64(st.eval.bound(&st.pp.lat))
			}
		}
		bounds = append(bounds, b)
		c += b
	}
	st.bounds = bounds
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
	edges := st.pp.svcs[st.pp.pods[p].svc].edges
	u := st.node[p]
	old, oldQ := st.incident(edges), st.nodeQ[u]+st.nodeQ[v]
	st.remove(p)
	st.add(p, v)
	dq := st.nodeQ[u] + st.nodeQ[v] - oldQ
	d := st.trial(edges, old, limit-dq) + dq
	st.remove(p)
	st.add(p, u)
	return d
}

// trySwap returns the change in cost if pods p and q exchanged nodes, leaving the state as it
// was; +Inf if the change is not below limit.
func (st *placeState) trySwap(p, q int, limit float64) float64 {
	pp := st.pp
	s, t := pp.pods[p].svc, pp.pods[q].svc
	edges := append(st.swapEdges[:0], pp.svcs[s].edges...)
	for _, e := range pp.svcs[t].edges {
		if pe := &pp.edges[e]; pe.from != s && pe.to != s {
			edges = append(edges, e)
		}
	}
	st.swapEdges = edges
	u, v := st.node[p], st.node[q]
	old, oldQ := st.incident(edges), st.nodeQ[u]+st.nodeQ[v]
	st.swap(p, q)
	dq := st.nodeQ[u] + st.nodeQ[v] - oldQ
	d := st.trial(edges, old, limit-dq) + dq
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
