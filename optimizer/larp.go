package optimizer

import (
	"math"
	"runtime"
	"sort"
	"sync"
)

// groupCount is the paper's number of groups: the mean replica count rounded half to even (as
// Python's round, which gives DESIGN.md's example: A=3, B=2 → 2 groups), at least 1.
func (pp *placeProblem) groupCount() int {
	total := 0
	for _, ps := range pp.svcs {
		total += ps.count
	}
	k := int(math.RoundToEven(float64(total) / float64(len(pp.svcs))))
	return max(k, 1)
}

// greedy is the paper's LARP greedy with its first group on node start; nil if some pod fits
// nowhere. How DESIGN.md's wording is read:
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
	k := pp.groupCount()
	groups := make([][]int, k)
	for _, ps := range pp.svcs {
		for i := 0; i < ps.count; i++ {
			groups[i%k] = append(groups[i%k], ps.first+i)
		}
	}
	totC, totM := pp.totalRequests()
	podSize := func(i int) float64 {
		ps := &pp.svcs[pp.pods[i].svc]
		return share(ps.cpu, totC) + share(ps.mem, totM)
	}
	demand := make([]float64, k)
	for g, pods := range groups {
		for _, i := range pods {
			demand[g] += podSize(i)
		}
		sort.SliceStable(pods, func(a, b int) bool { return podSize(pods[a]) > podSize(pods[b]) })
	}
	order := make([]int, k)
	for g := range order {
		order[g] = g
	}
	sort.SliceStable(order, func(a, b int) bool { return demand[order[a]] > demand[order[b]] })

	n := pp.n
	chosen := make([]bool, n)
	var chosenList []int
	toChosen := make([]float64, n) // Σ_{c chosen} lsym(c, v)
	choose := func(v int) {
		if chosen[v] {
			return
		}
		chosen[v] = true
		chosenList = append(chosenList, v)
		for u := 0; u < n; u++ {
			toChosen[u] += pp.lsym[v*n+u]
		}
	}
	first := true
	for _, g := range order {
		pods := groups[g]
		if len(pods) == 0 {
			continue
		}
		home := start
		if !first {
			home = pp.nextHome(st, pods, chosen, len(chosenList), toChosen)
		}
		first = false
		for _, i := range pods {
			v := home
			if !st.canHost(i, v) {
				v = -1
				for u := 0; u < n; u++ {
					if !st.canHost(i, u) {
						continue
					}
					if v < 0 || pp.lsym[home*n+u] < pp.lsym[home*n+v] ||
						pp.lsym[home*n+u] == pp.lsym[home*n+v] && toChosen[u] < toChosen[v] {
						v = u
					}
				}
				if v < 0 {
					return nil
				}
			}
			st.add(i, v)
			choose(v)
		}
	}
	return st.node
}

// nextHome picks the home node of a later group (see greedy).
func (pp *placeProblem) nextHome(st *placeState, pods []int, chosen []bool, nChosen int, toChosen []float64) int {
	n := pp.n
	var cpu, mem int64
	per := map[int]int{} // pods of each service in the group
	for _, i := range pods {
		s := pp.pods[i].svc
		cpu += pp.svcs[s].cpu
		mem += pp.svcs[s].mem
		per[s]++
	}
	wholeFits := func(v int) bool {
		if cpu > st.freeCPU[v] || mem > st.freeMem[v] {
			return false
		}
		for s, c := range per {
			if int(st.count[s*n+v])+c > pp.svcs[s].cap {
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
				return nil
			}
			st.add(i, best)
		}
	}
	return st.node
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

// Tuning of larp's search. They are counts, never times, so the result does not depend on the
// machine or its load.
const (
	// larpCandidates is how many target nodes a pod's move considers: the nodes with the lowest
	// proxy cost (the round-robin cost of one pod there, given its neighbours' placement).
	larpCandidates = 12
	// larpMaxPasses bounds the local search's passes over all pods.
	larpMaxPasses = 200
	// larpSearchUnits bounds the local searches: starts × pods ≤ larpSearchUnits (at least 2
	// starts), so small inputs search from every start and large ones from the best few.
	larpSearchUnits = 8000
)

// larp is the shipped placement. Starts: the greedy from every start node and the Kubernetes
// spread (the packing search's placement when none of those fits). The best starts by cost,
// distinct placements only, are each improved by local search (see localSearch); the best
// result wins (ties: the better start).
func (pp *placeProblem) larp() ([]int, error) {
	var starts [][]int
	seen := map[string]bool{}
	addStart := func(nodes []int) {
		if nodes == nil {
			return
		}
		key := pp.countsKey(nodes)
		if seen[key] {
			return
		}
		seen[key] = true
		starts = append(starts, nodes)
	}
	addStart(pp.greedy(pp.mostFreeNode()))
	for u := 0; u < pp.n; u++ {
		addStart(pp.greedy(u))
	}
	addStart(pp.k8sSpread())
	if len(starts) == 0 {
		nodes, err := pp.pack()
		if err != nil {
			return nil, err
		}
		starts = append(starts, nodes)
	}
	costs := make([]float64, len(starts))
	for i, nodes := range starts {
		st := pp.newState()
		st.load(nodes)
		costs[i] = st.cost()
	}
	rank := make([]int, len(starts))
	for i := range rank {
		rank[i] = i
	}
	sort.SliceStable(rank, func(a, b int) bool { return costs[rank[a]] < costs[rank[b]] })
	keep := max(2, larpSearchUnits/max(1, len(pp.pods)))
	rank = rank[:min(len(rank), keep)]

	results := make([][]int, len(rank))
	resCost := make([]float64, len(rank))
	workers := min(runtime.GOMAXPROCS(0), len(rank))
	var next int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				r := next
				next++
				mu.Unlock()
				if r >= len(rank) {
					return
				}
				st := pp.newState()
				st.load(starts[rank[r]])
				st.localSearch()
				st.refresh()
				results[r], resCost[r] = st.snapshot(), st.cost()
			}
		}()
	}
	wg.Wait()
	best := 0
	for r := range results {
		if resCost[r] < resCost[best] {
			best = r
		}
	}
	return results[best], nil
}

// countsKey identifies a placement up to permuting a service's pods of equal weight.
func (pp *placeProblem) countsKey(nodes []int) string {
	key := make([]byte, 0, 12*len(nodes))
	for _, ps := range pp.svcs {
		pairs := make([][2]int64, ps.count)
		for k := range pairs {
			i := ps.first + k
			pairs[k] = [2]int64{int64(nodes[i]), pp.pods[i].w}
		}
		sort.Slice(pairs, func(a, b int) bool {
			if pairs[a][0] != pairs[b][0] {
				return pairs[a][0] < pairs[b][0]
			}
			return pairs[a][1] < pairs[b][1]
		})
		for _, p := range pairs {
			for _, x := range p {
				for s := 0; s < 64; s += 8 {
					key = append(key, byte(x>>s))
				}
			}
		}
		key = append(key, 0xff)
	}
	return string(key)
}
