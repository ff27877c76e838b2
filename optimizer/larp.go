package optimizer

import (
	"math"
	"slices"
	"sort"
)

// groupCount is the paper's number of groups: the mean replica count rounded half to even (as
// Python's round, which gives the paper's example: A=3, B=2 → 2 groups), at least 1.
func (pp *placeProblem) groupCount() int {
	total := 0
	for _, ps := range pp.svcs {
		total += ps.count
	}
	k := int(math.RoundToEven(float64(total) / float64(len(pp.svcs))))
	return max(k, 1)
}

// greedy is the paper's LARP greedy with its first group on node start; nil if some pod fits
// nowhere. How the paper's wording (groups placed largest first, each later one on the node
// with room and the lowest latency to the nodes already chosen) is read:
//   - pod i of every service goes to group i mod k, so caller and callee pods share groups;
//   - a group's resource demand is its share of the total cpu request plus its share of the
//     total memory request; groups go largest first (ties: lower group);
//   - "the nodes already chosen" are all nodes holding a pod so far, and a candidate's latency
//     to them is the sum over them of L(c,v)+L(v,c);
//   - a later group's home is, among the nodes holding no pod yet (all nodes once none is
//     left), one with room for the whole group (cpu, memory, spread) if any, with the lowest
//     such sum (ties: most free capacity, then lower index);
//   - within a group pods go largest request first; a pod that does not fit on the home goes to
//     the node nearest the home (L both ways) that has room, which joins the chosen nodes.
func (pp *placeProblem) greedy(start int) []int {
	st := pp.newState()
	if !pp.greedyInto(st, start) {
		return nil
	}
	return st.node
}

// greedyInto runs the greedy into the empty state st; false if some pod fits nowhere.
func (pp *placeProblem) greedyInto(st *placeState, start int) bool {
	n := pp.n
	chosen := make([]bool, n)
	nChosen := 0
	toChosen := make([]float64, n) // Σ_{c chosen} lsym(c, v)
	var rowBuf, nearBuf []float64  // symRow's buffers when the latency is per zone
	if pp.lat.zone != nil {
		rowBuf, nearBuf = make([]float64, n), make([]float64, n)
	}
	choose := func(v int) {
		if chosen[v] {
			return
		}
		chosen[v] = true
		nChosen++
		row := pp.lat.symRow(v, rowBuf)
		for u, l := range row {
			toChosen[u] += l
		}
	}
	for g, grp := range pp.groups {
		home := start
		if g > 0 {
			home = pp.nextHome(st, grp, chosen, nChosen, toChosen)
		}
		near := pp.lat.symRow(home, nearBuf)
		for _, i := range grp.pods {
			v := home
			if !st.canHost(i, v) {
				v = -1
				for u := 0; u < n; u++ {
					if !st.canHost(i, u) {
						continue
					}
					if v < 0 || near[u] < near[v] || near[u] == near[v] && toChosen[u] < toChosen[v] {
						v = u
					}
				}
				if v < 0 {
					return false
				}
			}
			st.add(i, v)
			choose(v)
		}
	}
	return true
}

// greedyGroup is one of the paper's groups: its pods, largest request first, and what it needs.
type greedyGroup struct {
	pods     []int
	cpu, mem int64    // Σ requests (saturating)
	load     int64    // Σ planned cpu (saturating)
	per      [][2]int // (service, pods of it in the group), by service
}

// makeGroups deals the pods into the paper's groups (see greedy), largest group first. The
// groups do not depend on the start node, so every greedy run shares them.
func (pp *placeProblem) makeGroups() []greedyGroup {
	k := pp.groupCount()
	groups := make([]greedyGroup, k)
	for s, ps := range pp.svcs {
		for i := 0; i < ps.count; i++ {
			g := &groups[i%k]
			g.pods = append(g.pods, ps.first+i)
			g.cpu, g.mem = satAdd(g.cpu, ps.cpu), satAdd(g.mem, ps.mem)
			g.load = satAdd(g.load, pp.load[ps.first+i])
			if len(g.per) > 0 && g.per[len(g.per)-1][0] == s {
				g.per[len(g.per)-1][1]++
			} else {
				g.per = append(g.per, [2]int{s, 1})
			}
		}
	}
	totC, totM := pp.totalRequests()
	size := make([]float64, len(pp.pods))
	for i, p := range pp.pods {
		ps := &pp.svcs[p.svc]
		size[i] = share(ps.cpu, totC) + share(ps.mem, totM)
	}
	demand := make([]float64, k)
	for g := range groups {
		pods := groups[g].pods
		for _, i := range pods {
			demand[g] += size[i]
		}
		sort.SliceStable(pods, func(a, b int) bool { return size[pods[a]] > size[pods[b]] })
	}
	order := make([]int, k)
	for g := range order {
		order[g] = g
	}
	sort.SliceStable(order, func(a, b int) bool { return demand[order[a]] > demand[order[b]] })
	out := make([]greedyGroup, 0, k)
	for _, g := range order {
		if len(groups[g].pods) > 0 {
			out = append(out, groups[g])
		}
	}
	return out
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// nextHome picks the home node of a later group (see greedy).
func (pp *placeProblem) nextHome(st *placeState, grp greedyGroup, chosen []bool, nChosen int, toChosen []float64) int {
	n := pp.n
	wholeFits := func(v int) bool {
		if grp.cpu > st.freeCPU[v] || grp.mem > st.freeMem[v] || grp.load > st.freeLoad[v] {
			return false
		}
		for _, sc := range grp.per {
			if int(st.count[sc[0]*n+v])+sc[1] > pp.svcs[sc[0]].cap {
				return false
			}
		}
		return true
	}
	maxC, maxM := maxFinite(pp.cpu), maxFinite(pp.mem)
	room := func(v int) float64 { return relative(st.freeCPU[v], maxC) + relative(st.freeMem[v], maxM) }
	best, bestFits := -1, false
	for v := 0; v < n; v++ {
		if chosen[v] && nChosen < n {
			continue
		}
		fits := wholeFits(v)
		switch {
		case best < 0, fits && !bestFits:
		case fits != bestFits:
			continue
		case toChosen[v] < toChosen[best]:
		case toChosen[v] == toChosen[best] && room(v) > room(best):
		default:
			continue
		}
		best, bestFits = v, fits
	}
	return best
}

// greedyOrPack runs the greedy, falling back to the packing search if it gets stuck.
func (pp *placeProblem) greedyOrPack(start int) ([]int, error) {
	if nodes := pp.greedy(start); nodes != nil {
		return nodes, nil
	}
	return pp.pack()
}

// k8sSpread imitates the default scheduler: services in file order, each pod to a node with
// room (resources and the spread cap) holding the fewest pods of its service, then the least
// allocated one (mean of free cpu and free memory fractions after placing it), then the lower
// index. nil if some pod fits nowhere.
func (pp *placeProblem) k8sSpread() []int {
	st := pp.newState()
	if !pp.k8sSpreadInto(st) {
		return nil
	}
	return st.node
}

// k8sSpreadInto runs k8sSpread into the empty state st; false if some pod fits nowhere.
func (pp *placeProblem) k8sSpreadInto(st *placeState) bool {
	n := pp.n
	score := func(s, v int) float64 {
		ps := &pp.svcs[s]
		return freeAfter(st.freeCPU[v], ps.cpu, pp.cpu[v]) + freeAfter(st.freeMem[v], ps.mem, pp.mem[v])
	}
	for s, ps := range pp.svcs {
		for i := ps.first; i < ps.first+ps.count; i++ {
			best := -1
			for v := 0; v < n; v++ {
				if !st.canHost(i, v) {
					continue
				}
				switch {
				case best < 0:
				case st.count[s*n+v] < st.count[s*n+best]:
				case st.count[s*n+v] == st.count[s*n+best] && score(s, v) > score(s, best):
				default:
					continue
				}
				best = v
			}
			if best < 0 {
				return false
			}
			st.add(i, best)
		}
	}
	return true
}

func freeAfter(free, req, alloc int64) float64 {
	if free == unlimited {
		return 1
	}
	return float64(free-req) / float64(alloc)
}

func (pp *placeProblem) k8sSpreadOrPack() ([]int, error) {
	if nodes := pp.k8sSpread(); nodes != nil {
		return nodes, nil
	}
	return pp.pack()
}

// larpTuning are the knobs of larp's search. They are counts, never times, so the result does
// not depend on the machine or its load. Tests use other values to measure each ingredient.
type larpTuning struct {
	// allStarts runs the greedy from every start node; else only from the most free node.
	allStarts bool
	// searchUnits bounds the local searches: (starts searched) × pods ≤ searchUnits, but at
	// least minSearched starts, so small inputs search from every start and large ones from the
	// best few. 0 turns local search off.
	searchUnits, minSearched int
	// candidates bounds how many target nodes a pod's move evaluates exactly: those with the
	// best dual bounds (see localSearch).
	candidates int
	// maxPasses bounds each local search's passes over the services.
	maxPasses int
	// exchangeMaxNodes: with at most this many nodes, local search also exchanges the contents
	// of two nodes (all pairs are tried, so the cost grows with the square of the nodes).
	exchangeMaxNodes int
}

var larpDefault = larpTuning{allStarts: true, searchUnits: 1500, minSearched: 1, candidates: 30, maxPasses: 200, exchangeMaxNodes: 40}

// larpWith is the shipped placement (tuned by larpDefault) without a budget. Starts: the greedy from every start node (at most maxStarts,
// see startNodes) and the Kubernetes spread, or the packing search's placement when none of
// those fits. The best distinct starts by cost — as many as larpDefault's searchUnits allow:
// all of them on small inputs, one on 1000 pods — are each improved by local search (see
// localSearch); the cheapest result wins (ties: the better start).
func (pp *placeProblem) larpWith(tune larpTuning) ([]int, error) {
	nodes, _, err := pp.larpWithin(tune, larpBudget{})
	return nodes, err
}

// larpWithin is larpWith stopped by budget: a start not begun when the deadline passes is
// skipped (except the k8s spread, always built, so the result is never worse than it), as is a
// local search not begun; one under way stops at its next look at the budget and keeps what it
// has. The cut is nil if the budget cut nothing, else what ran.
//
// When the objective has a queueing part (pp.queued), the network-only search of before (LATA
// cost alone) runs first, then the search on network + queueing, within the same budget, with
// the first one's placement as one more start. The best start is always searched from (or,
// when the budget has run out, returned as it is), and local search applies only steps that
// lower the cost, so the placement is never worse, on network + queueing, than the
// network-only one, even when the budget cuts the search. The cut adds up both searches' where both were cut, else it is
// the one that was.
func (pp *placeProblem) larpWithin(tune larpTuning, budget larpBudget) ([]int, *PlacementCut, error) {
	if !pp.queued {
		return pp.larpSearch(tune, budget, nil)
	}
	net := *pp
	net.queued = false
	seed, seedCut, err := net.larpSearch(tune, budget, nil)
	if err != nil {
		return nil, nil, err
	}
	nodes, cut, err := pp.larpSearch(tune, budget, seed)
	if err != nil {
		return nil, nil, err
	}
	if seedCut != nil {
		if cut == nil {
			cut = &PlacementCut{}
		}
		cut.Starts += seedCut.Starts
		cut.StartsBuilt += seedCut.StartsBuilt
		cut.Searches += seedCut.Searches
		cut.SearchesFinished += seedCut.SearchesFinished
		cut.Passes += seedCut.Passes
	}
	return nodes, cut, nil
}

// larpSearch is one LARP search on pp's objective (see larpWithin); seed, when not nil, is one
// more start.
func (pp *placeProblem) larpSearch(tune larpTuning, budget larpBudget, seed []int) ([]int, *PlacementCut, error) {
	// Starts, in a fixed order: the greedy from every node (or only the most free one), then
	// the Kubernetes spread. Each is built and costed independently, in parallel.
	var makers []func(st *placeState) bool
	always := -1 // the start built whatever the budget
	if tune.allStarts {
		for _, u := range pp.startNodes(maxStarts) {
			makers = append(makers, func(st *placeState) bool { return pp.greedyInto(st, u) })
		}
		always = len(makers)
		makers = append(makers, pp.k8sSpreadInto)
	} else {
		makers = append(makers, func(st *placeState) bool { return pp.greedyInto(st, pp.mostFreeNode()) })
	}
	built := make([][]int, len(makers))
	builtCost := make([]float64, len(makers))
	workers := workerCount() // read once: GOMAXPROCS may change between reads
	scratch := make([]*placeState, workers)
	// The start built whatever the budget goes first, so it is never what runs late; results
	// keep the makers' order, which breaks ties.
	order := make([]int, 0, len(makers))
	if always >= 0 {
		order = append(order, always)
	}
	for i := range makers {
		if i != always {
			order = append(order, i)
		}
	}
	built0 := make([]bool, len(makers)) // started within the budget
	parallelWorkers(workers, len(makers), func(w, k int) {
		i := order[k]
		if k > 0 && budget.startsExpired() {
			return
		}
		built0[i] = true
		if scratch[w] == nil {
			scratch[w] = pp.newState()
		}
		st := scratch[w]
		st.reset()
		if makers[i](st) {
			st.refresh()
			built[i], builtCost[i] = st.snapshot(), st.cost()
		}
	})
	var starts [][]int
	var costs []float64
	seen := map[[2]uint64]bool{}
	for i, nodes := range built {
		if nodes == nil {
			continue
		}
		if key := pp.placementKey(nodes); !seen[key] {
			seen[key] = true
			starts = append(starts, nodes)
			costs = append(costs, builtCost[i])
		}
	}
	// The seed joins the starts unless one equals it pod for pod (placementKey would also
	// take a permutation of equal-weight pods for it, which may queue differently: their
	// service rates may differ).
	if seed != nil && !slices.ContainsFunc(starts, func(nodes []int) bool { return slices.Equal(nodes, seed) }) {
		st := pp.newState()
		st.load(seed)
		starts, costs = append(starts, seed), append(costs, st.cost())
	}
	if len(starts) == 0 {
		nodes, err := pp.pack()
		if err != nil {
			return nil, nil, err
		}
		starts, costs = append(starts, nodes), append(costs, 0)
	}
	rank := make([]int, len(starts))
	for i := range rank {
		rank[i] = i
	}
	sort.SliceStable(rank, func(a, b int) bool { return costs[rank[a]] < costs[rank[b]] })
	keep := max(tune.minSearched, tune.searchUnits/max(1, len(pp.pods)))
	if tune.searchUnits == 0 {
		keep = 1
	}
	rank = rank[:min(len(rank), keep)]

	results := make([][]int, len(rank))
	resCost := make([]float64, len(rank))
	finished := make([]bool, len(rank))
	passes := make([]int, len(rank))
	parallel(len(rank), func(_, r int) {
		if tune.searchUnits > 0 && budget.expired() {
			results[r], resCost[r] = starts[rank[r]], costs[rank[r]]
			return
		}
		st := pp.newState()
		st.load(starts[rank[r]])
		spent := &stepsLeft{b: budget}
		if tune.searchUnits > 0 {
			passes[r] = st.localSearchWithin(tune, spent)
		}
		finished[r] = !spent.cut
		if !spent.cut {
			// Every step the search applied re-solved the edges it changed, so the cached
			// costs are current; the refresh only re-checks them, which a cut search has no
			// time for.
			st.refresh()
		}
		results[r], resCost[r] = st.snapshot(), st.cost()
	})
	best := 0
	for r := range results {
		if resCost[r] < resCost[best] {
			best = r
		}
	}
	cut := &PlacementCut{Starts: len(makers), Searches: len(rank)}
	for _, b := range built0 {
		if b {
			cut.StartsBuilt++
		}
	}
	for r := range rank {
		if finished[r] {
			cut.SearchesFinished++
		}
		cut.Passes += passes[r]
	}
	if cut.StartsBuilt == cut.Starts && cut.SearchesFinished == cut.Searches {
		cut = nil
	}
	return results[best], cut, nil
}

// maxStarts bounds the greedy's start nodes: each run costs O(pods × nodes), so trying every
// node of a very large cluster would cost O(pods × nodes²).
const maxStarts = 128

// startNodes returns the greedy's start nodes: every node if there are at most k, else k of
// them spread over the latency space — the most free node first, then each time the node
// farthest (L both ways) from those already taken (ties: lower index).
func (pp *placeProblem) startNodes(k int) []int {
	n := pp.n
	out := make([]int, 0, min(n, k))
	if n <= k {
		for u := 0; u < n; u++ {
			out = append(out, u)
		}
		return out
	}
	far := make([]float64, n) // distance to the nearest node taken
	for u := range far {
		far[u] = math.Inf(1)
	}
	taken := make([]bool, n)
	var rowBuf []float64 // symRow's buffer when the latency is per zone
	if pp.lat.zone != nil {
		rowBuf = make([]float64, n)
	}
	next := pp.mostFreeNode()
	for len(out) < k {
		out = append(out, next)
		taken[next] = true
		best := -1
		row := pp.lat.symRow(next, rowBuf)
		for u := 0; u < n; u++ {
			far[u] = min(far[u], row[u])
			if !taken[u] && (best < 0 || far[u] > far[best]) {
				best = u
			}
		}
		next = best
	}
	return out
}

// placementKey identifies a placement up to permuting a service's pods of equal weight: two
// independent sums of a 64-bit mix of (service, node, weight) over the pods. Distinct
// placements share a key with probability ≈ 2^-128.
func (pp *placeProblem) placementKey(nodes []int) [2]uint64 {
	var key [2]uint64
	for i, v := range nodes {
		p := pp.pods[i]
		x := splitmix64(splitmix64(uint64(p.svc)<<32|uint64(v)) ^ uint64(p.w))
		key[0] += x
		key[1] += splitmix64(x)
	}
	return key
}
