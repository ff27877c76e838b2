package optimizer

import (
	"fmt"
	"math"
	"sort"
)

// packBudget bounds the exhaustive packing search (search steps, ≈ 0.1 s). It is far more
// than the small instances need to be decided exactly; an instance that neither the
// constructive policies nor this search can pack within the budget is reported as
// infeasible, saying that the search gave up.
const packBudget = 200_000

// checkAlone reports a service that cannot be placed even on empty nodes: more replicas than
// the nodes' cpu, memory or the spread cap leave room for.
func (pp *placeProblem) checkAlone() error {
	for s := range pp.svcs {
		if why := pp.diagnose(s, pp.cpu, pp.mem, pp.loadCap, false); why != "" {
			return infeasiblef("service %q: %s", pp.m.Services[s].Name, why)
		}
	}
	return nil
}

// diagnose explains why service s cannot place all its pods into the free capacity given
// ("cpu: …", "memory: …", "headroom: …" or "spread: …"), or returns "" if, taken alone, it
// can. others says the capacity is what other services left. Its pods are taken to need the
// headroom of its most loaded pod (placeService.load).
func (pp *placeProblem) diagnose(s int, freeCPU, freeMem, freeLoad []int64, others bool) string {
	ps := &pp.svcs[s]
	need := ps.count
	var byCPU, byMem, byLoad, bySpread int
	for u := 0; u < pp.n; u++ {
		byCPU += min(need, pp.fitsOne(ps.cpu, freeCPU[u], need))
		byMem += min(need, pp.fitsOne(ps.mem, freeMem[u], need))
		byLoad += min(need, pp.fitsOne(ps.load, freeLoad[u], need))
		bySpread += min(ps.cap, pp.fitsOne(ps.cpu, freeCPU[u], ps.cap), pp.fitsOne(ps.mem, freeMem[u], ps.cap), pp.fitsOne(ps.load, freeLoad[u], ps.cap))
		byCPU, byMem, byLoad, bySpread = min(byCPU, need), min(byMem, need), min(byLoad, need), min(bySpread, need)
	}
	left := ""
	if others {
		left = " left by the other services"
	}
	switch {
	case byCPU < need:
		return fmt.Sprintf("cpu: %d replicas of %dm each, but the nodes' cpu%s fits only %d", need, ps.cpu, left, byCPU)
	case byMem < need:
		return fmt.Sprintf("memory: %d replicas of %d MiB each, but the nodes' memory%s fits only %d", need, ps.mem, left, byMem)
	case byLoad < need:
		return fmt.Sprintf("headroom: %d replicas using up to %.0fm cpu each at their planned load, but the nodes' cores under the utilisation limit %v%s fit only %d",
			need, float64(ps.load)/utilizationUnits, pp.m.MaxNodeUtilization, left, byLoad)
	case bySpread < need:
		return fmt.Sprintf("spread: %d replicas, at most %d per node (ceil(%d/%d nodes)), but the nodes with cpu and memory%s for one fit only %d",
			need, ps.cap, need, pp.n, left, bySpread)
	}
	return ""
}

// overTotal reports a resource of which the pods request more than all nodes have together
// ("" if none).
func (pp *placeProblem) overTotal() string {
	reqC, reqM := pp.totalRequests()
	var reqL, haveC, haveM, haveL float64
	for _, l := range pp.load {
		reqL += float64(l)
	}
	for u := 0; u < pp.n; u++ {
		haveC += float64(pp.cpu[u])
		haveM += float64(pp.mem[u])
		haveL += float64(pp.loadCap[u])
		if pp.cpu[u] == unlimited {
			haveC = math.Inf(1)
		}
		if pp.mem[u] == unlimited {
			haveM = math.Inf(1)
		}
		if pp.loadCap[u] == unlimited {
			haveL = math.Inf(1)
		}
	}
	switch {
	case reqC > haveC:
		return fmt.Sprintf("the pods request %.0fm cpu in all, the nodes have %.0fm", reqC, haveC)
	case reqM > haveM:
		return fmt.Sprintf("the pods request %.0f MiB memory in all, the nodes have %.0f MiB", reqM, haveM)
	case reqL > haveL:
		return fmt.Sprintf("the pods use %.0fm cpu in all at their planned load, the nodes' cores under the utilisation limit %v have %.0fm",
			reqL/utilizationUnits, pp.m.MaxNodeUtilization, haveL/utilizationUnits)
	}
	return ""
}

// feasible says which constraint the complete placement nodes breaks ("" if none).
func (pp *placeProblem) feasible(nodes []int) string {
	n := pp.n
	count := make(map[[2]int]int) // (service, node) → pods
	usedCPU, usedMem, usedLoad := make([]int64, n), make([]int64, n), make([]int64, n)
	for i, u := range nodes {
		s := pp.pods[i].svc
		count[[2]int{s, u}]++
		usedCPU[u] = satAdd(usedCPU[u], pp.svcs[s].cpu)
		usedMem[u] = satAdd(usedMem[u], pp.svcs[s].mem)
		usedLoad[u] = satAdd(usedLoad[u], pp.load[i])
	}
	for i, u := range nodes {
		s := pp.pods[i].svc
		if k := count[[2]int{s, u}]; k > pp.svcs[s].cap {
			return fmt.Sprintf("%d pods of service %q on node %q, spread cap %d", k, pp.m.Services[s].Name, pp.m.Nodes[u].Name, pp.svcs[s].cap)
		}
	}
	for u := 0; u < n; u++ {
		if usedCPU[u] > pp.cpu[u] || usedMem[u] > pp.mem[u] {
			return fmt.Sprintf("requests over node %q's allocatable (cpu %dm, memory %d MiB)", pp.m.Nodes[u].Name, usedCPU[u], usedMem[u])
		}
		if usedLoad[u] > pp.loadCap[u] {
			return fmt.Sprintf("node %q's planned utilisation %.2f over the limit %v", pp.m.Nodes[u].Name,
				float64(usedLoad[u])/utilizationUnits/pp.m.coreMillis(u), pp.m.MaxNodeUtilization)
		}
	}
	return ""
}

// fitsOne is how many requests of size req fit in free (at most limit; unlimited if req is 0
// or the node is not limited).
func (pp *placeProblem) fitsOne(req, free int64, limit int) int {
	if req == 0 || free == unlimited {
		return limit
	}
	return int(min(int64(limit), free/req))
}

// pack finds some placement satisfying the constraints, ignoring latency, by depth-first search
// over pod counts per (service, node): services hardest first, nodes with most room first,
// largest counts first. It is exhaustive (so exact about feasibility) unless it runs out of
// packBudget steps. On failure the error names the service at which the deepest attempt failed
// and what it lacked there.
func (pp *placeProblem) pack() ([]int, error) {
	order := make([]int, len(pp.svcs))
	for s := range order {
		order[s] = s
	}
	totC, totM := pp.totalRequests()
	size := func(s int) float64 {
		ps := &pp.svcs[s]
		return float64(ps.count) * (share(ps.cpu, totC) + share(ps.mem, totM))
	}
	sort.SliceStable(order, func(i, j int) bool { return size(order[i]) > size(order[j]) })

	// When the totals already exceed the nodes, one descent finds the service to name.
	over := pp.overTotal()
	budget := packBudget
	if over != "" {
		budget = len(pp.svcs)*pp.n + 1
	}
	k := &packer{pp: pp, order: order, freeCPU: append([]int64(nil), pp.cpu...), freeMem: append([]int64(nil), pp.mem...),
		freeLoad: append([]int64(nil), pp.loadCap...),
		counts:   make([]int, len(pp.svcs)*pp.n), budget: budget, deepest: -1}
	if over == "" && k.service(0) {
		nodes := make([]int, len(pp.pods))
		for s, ps := range pp.svcs {
			i := ps.first
			for u := 0; u < pp.n; u++ {
				for c := 0; c < k.counts[s*pp.n+u]; c++ {
					nodes[i] = u
					i++
				}
			}
		}
		return nodes, nil
	}
	if over != "" {
		k.service(0)
	}
	s := order[max(k.deepest, 0)]
	name := pp.m.Services[s].Name
	why := pp.diagnose(s, k.deepCPU, k.deepMem, k.deepLoad, true)
	if why == "" {
		why = "cpu and memory: no combination of nodes fits the pods of all services together"
	}
	switch {
	case over != "":
		return nil, infeasiblef("service %q: %s (%s)", name, why, over)
	case k.budget <= 0:
		return nil, infeasiblef("service %q: %s, and no placement was found within %d search steps", name, why, packBudget)
	}
	return nil, infeasiblef("service %q: %s", name, why)
}

func (pp *placeProblem) totalRequests() (cpu, mem float64) {
	for _, ps := range pp.svcs {
		cpu += float64(ps.count) * float64(ps.cpu)
		mem += float64(ps.count) * float64(ps.mem)
	}
	return cpu, mem
}

func share(v int64, total float64) float64 {
	if total == 0 {
		return 0
	}
	return float64(v) / total
}

type packer struct {
	pp               *placeProblem
	order            []int
	freeCPU, freeMem []int64
	freeLoad         []int64 // headroom, each pod of a service taking placeService.load
	counts           []int   // [s*n+u]
	budget           int
	deepest          int // deepest service position that failed
	deepCPU, deepMem []int64
	deepLoad         []int64
}

// service places the services order[pos:]; it reports success.
func (k *packer) service(pos int) bool {
	if pos == len(k.order) {
		return true
	}
	s := k.order[pos]
	pp := k.pp
	nodes := make([]int, pp.n)
	for u := range nodes {
		nodes[u] = u
	}
	room := func(u int) float64 {
		return relative(k.freeCPU[u], maxFinite(pp.cpu)) + relative(k.freeMem[u], maxFinite(pp.mem))
	}
	sort.SliceStable(nodes, func(i, j int) bool { return room(nodes[i]) > room(nodes[j]) })
	maxAt := make([]int, pp.n+1) // maxAt[j]: pods of s the nodes nodes[j:] can take
	for j := pp.n - 1; j >= 0; j-- {
		u := nodes[j]
		maxAt[j] = maxAt[j+1] + pp.fits(s, k.freeCPU[u], k.freeMem[u], k.freeLoad[u], pp.svcs[s].cap)
	}
	if k.spread(pos, s, nodes, maxAt, 0, pp.svcs[s].count) {
		return true
	}
	if pos > k.deepest {
		k.deepest = pos
		k.deepCPU = append(k.deepCPU[:0], k.freeCPU...)
		k.deepMem = append(k.deepMem[:0], k.freeMem...)
		k.deepLoad = append(k.deepLoad[:0], k.freeLoad...)
	}
	return false
}

// spread distributes need pods of s over nodes[j:], then continues with the next service.
func (k *packer) spread(pos, s int, nodes, maxAt []int, j, need int) bool {
	if need == 0 {
		return k.service(pos + 1)
	}
	if k.budget--; k.budget <= 0 || j == len(nodes) || maxAt[j] < need {
		return false
	}
	pp, u := k.pp, nodes[j]
	ps := &pp.svcs[s]
	for c := min(need, pp.fits(s, k.freeCPU[u], k.freeMem[u], k.freeLoad[u], ps.cap)); c >= 0; c-- {
		if need-c > maxAt[j+1] {
			break
		}
		k.take(s, u, c)
		ok := k.spread(pos, s, nodes, maxAt, j+1, need-c)
		k.take(s, u, -c)
		if ok {
			k.counts[s*pp.n+u] += c
			return true
		}
		if k.budget <= 0 {
			return false
		}
	}
	return false
}

// take reserves (or, with c < 0, releases) c pods of s on u. counts is written only on success.
func (k *packer) take(s, u, c int) {
	ps := &k.pp.svcs[s]
	if k.freeCPU[u] != unlimited {
		k.freeCPU[u] -= int64(c) * ps.cpu
	}
	if k.freeMem[u] != unlimited {
		k.freeMem[u] -= int64(c) * ps.mem
	}
	if k.freeLoad[u] != unlimited {
		k.freeLoad[u] -= int64(c) * ps.load
	}
}

func maxFinite(v []int64) int64 {
	var m int64
	for _, x := range v {
		if x != unlimited {
			m = max(m, x)
		}
	}
	return m
}

// repair moves pods off nodes where the loaded placement breaks a constraint (a service over
// its spread cap, cpu or memory over the allocatable) until none does: each step moves one pod
// that relieves a violated constraint of the first such node to a node that can host it, the
// (pod, node) of lowest resulting cost (ties: lower node, earlier pod). No step creates a
// violation, and each removes part of one, so it ends; false if some offending pod fits
// nowhere.
func (st *placeState) repair() bool {
	pp := st.pp
	n := pp.n
	var reps []int
	for u := 0; u < n; u++ {
		for {
			overCPU, overMem, overLoad := st.freeCPU[u] < 0, st.freeMem[u] < 0, st.freeLoad[u] < 0
			reps = reps[:0]
			for _, p := range st.podsOn[u] {
				s := pp.pods[p].svc
				ps := &pp.svcs[s]
				relieves := int(st.count[s*n+u]) > ps.cap || overCPU && ps.cpu > 0 || overMem && ps.mem > 0 || overLoad && pp.load[p] > 0
				if relieves && !st.hasClass(reps, p) {
					reps = append(reps, p)
				}
			}
			if len(reps) == 0 {
				break
			}
			bestD, bestP, bestV := math.Inf(1), -1, -1
			for _, p := range reps {
				for v := 0; v < n; v++ {
					if v == u || !st.canHost(p, v) {
						continue
					}
					if d := st.tryMove(p, v, math.Inf(1)); bestP < 0 || d < bestD {
						bestD, bestP, bestV = d, p, v
					}
				}
			}
			if bestP < 0 {
				return false
			}
			st.remove(bestP)
			st.add(bestP, bestV)
			st.resolve(pp.svcs[pp.pods[bestP].svc].edges)
		}
	}
	return true
}

// hasClass says whether pods holds a pod of p's service and integer weight.
func (st *placeState) hasClass(pods []int, p int) bool {
	for _, q := range pods {
		if st.pp.pods[q].svc == st.pp.pods[p].svc && st.pp.pods[q].w == st.pp.pods[p].w {
			return true
		}
	}
	return false
}
