package optimizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"strings"
	"testing"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// placeGenConfig shapes a random placement instance.
type placeGenConfig struct {
	nodes, services, replicas int // maxima; at least 2 nodes, 2 services, 1 replica
	// zones > 0 puts the nodes in that many zones (low latency inside, high across) instead of
	// random points in a square.
	zones int
	// calls is the number of call edges drawn (a random DAG); 0 draws each forward pair with
	// probability 0.6.
	calls int
	// exact sets the counts to the maxima instead of drawing them.
	exact bool
	// pods > 0 sets the total pod count: every service gets one, the rest go to random services.
	pods int
	// slack scales node capacity relative to the total request (≈1/utilisation); 0 draws node
	// sizes from a fixed menu, which makes some small instances infeasible.
	slack float64
}

// genPlaceTopology returns a random topology to place: services given by replicas, a random
// call DAG with ingress into its roots, latencies from 2-D coordinates (plus per-node
// intra-node latency, 0 in a third of the instances), and cpu/memory on nodes and services.
func genPlaceTopology(seed uint64, c placeGenConfig) *Topology {
	r := rand.New(rand.NewPCG(seed, 0x1a2b))
	draw := func(lo, hi int) int {
		if c.exact {
			return hi
		}
		return lo + r.IntN(hi-lo+1)
	}
	nNodes, nSvcs := draw(2, c.nodes), draw(2, c.services)
	t := &Topology{}
	type point struct{ x, y float64 }
	var zoneAt []point
	for z := 0; z < c.zones; z++ {
		zoneAt = append(zoneAt, point{r.Float64() * 40, r.Float64() * 40})
	}
	at := make([]point, nNodes)
	for u := range at {
		if c.zones > 0 {
			z := zoneAt[r.IntN(c.zones)]
			at[u] = point{z.x + r.Float64()*2, z.y + r.Float64()*2}
		} else {
			at[u] = point{r.Float64() * 20, r.Float64() * 20}
		}
	}
	selfZero := r.IntN(3) == 0
	for s := 0; s < nSvcs; s++ {
		svc := Service{
			Name:     fmt.Sprintf("svc%d", s),
			CPU:      []int64{100, 250, 500, 750, 1000}[r.IntN(5)],
			Memory:   []int64{128, 256, 512, 1024}[r.IntN(4)],
			Replicas: 1 + r.IntN(c.replicas),
		}
		if c.exact && c.replicas > 0 && c.zones == 0 {
			svc.Replicas = c.replicas
		}
		t.Services = append(t.Services, svc)
	}
	if c.pods > 0 {
		for i := range t.Services {
			t.Services[i].Replicas = 1
		}
		for k := nSvcs; k < c.pods; k++ {
			t.Services[r.IntN(nSvcs)].Replicas++
		}
	}
	var totC, totM int64
	for _, s := range t.Services {
		totC += s.CPU * int64(s.Replicas)
		totM += s.Memory * int64(s.Replicas)
	}
	for u := 0; u < nNodes; u++ {
		n := Node{Name: fmt.Sprintf("node%d", u)}
		if c.slack > 0 {
			f := c.slack * (0.7 + 0.6*r.Float64()) / float64(nNodes)
			n.CPU, n.Memory = int64(float64(totC)*f)+1000, int64(float64(totM)*f)+1024
		} else {
			n.CPU = []int64{1000, 1500, 2000, 3000, 4000}[r.IntN(5)]
			n.Memory = []int64{1024, 2048, 4096}[r.IntN(3)]
		}
		t.Nodes = append(t.Nodes, n)
	}
	for u := 0; u < nNodes; u++ {
		for v := u; v < nNodes; v++ {
			ms := 0.0
			if u == v {
				if !selfZero {
					ms = 0.05 + math.Round(r.Float64()*300)/1000
				}
			} else {
				ms = 0.5 + math.Hypot(at[u].x-at[v].x, at[u].y-at[v].y)
				ms = math.Round(ms*100) / 100
			}
			t.Latency = append(t.Latency, Latency{From: t.Nodes[u].Name, To: t.Nodes[v].Name, MS: ms})
		}
	}
	perm := r.Perm(nSvcs) // topological order of the DAG
	seen := map[[2]int]bool{}
	rates := []float64{0.5, 1.5, 2, 3}
	if c.calls > 0 {
		rates = []float64{0.2, 0.5, 1, 1}
	}
	addCall := func(i, j int) {
		a, b := perm[min(i, j)], perm[max(i, j)]
		if i == j || seen[[2]int{a, b}] {
			return
		}
		seen[[2]int{a, b}] = true
		call := Call{From: t.Services[a].Name, To: t.Services[b].Name}
		if r.IntN(2) == 0 {
			rate := rates[r.IntN(len(rates))]
			call.Rate = &rate
		}
		t.Calls = append(t.Calls, call)
	}
	if c.calls > 0 {
		// Layers, as microservice call graphs have them: each call goes mostly one layer down.
		const layers = 5
		first := func(l int) int { return (l*nSvcs + layers - 1) / layers } // first service of layer l
		layerOf := func(i int) int { return i * layers / nSvcs }
		want := min(c.calls, nSvcs*(nSvcs-1)/4+1)
		for tries := 0; len(t.Calls) < want && tries < 100*want; tries++ {
			i := r.IntN(first(layers - 1))
			l := layerOf(i) + 1
			if r.IntN(5) == 0 && l+1 < layers {
				l += 1 + r.IntN(layers-l-1)
			}
			lo, hi := first(l), first(l+1)
			if hi > lo {
				addCall(i, lo+r.IntN(hi-lo))
			}
		}
	} else {
		for i := 0; i < nSvcs; i++ {
			for j := i + 1; j < nSvcs; j++ {
				if r.Float64() < 0.6 {
					addCall(i, j)
				}
			}
		}
		if len(t.Calls) == 0 {
			addCall(0, 1)
		}
	}
	called := map[string]bool{}
	for _, call := range t.Calls {
		called[call.To] = true
	}
	for _, s := range t.Services {
		if !called[s.Name] {
			t.Ingress = append(t.Ingress, Ingress{Service: s.Name, RPS: float64(10 + r.IntN(191))})
		}
	}
	return t
}

func compileUnplaced(t *testing.T, top *Topology) *Model {
	t.Helper()
	m, err := Compile(top, Options{Unplaced: true})
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return m
}

// placeOracle is the exact optimum of a small instance: it enumerates every pod count per
// (service, node) within the constraints and costs each with node-level transportation
// problems solved by gonum's LP simplex (real latencies, no quantisation). It returns
// feasible = false if no placement satisfies the constraints.
func placeOracle(t *testing.T, m *Model) (opt float64, feasible bool, best [][]int) {
	t.Helper()
	n := len(m.Nodes)
	cpu, mem := make([]int64, n), make([]int64, n)
	for u, node := range m.Nodes {
		cpu[u], mem[u] = node.CPU, node.Memory
		if cpu[u] == 0 {
			cpu[u] = math.MaxInt64 / 4
		}
		if mem[u] == 0 {
			mem[u] = math.MaxInt64 / 4
		}
	}
	vectors := make([][][]int, len(m.Services))
	for s, sm := range m.Services {
		spreadCap := (len(sm.Pods) + n - 1) / n
		var rec func(prefix []int, left int)
		rec = func(prefix []int, left int) {
			if len(prefix) == n {
				if left == 0 {
					vectors[s] = append(vectors[s], append([]int(nil), prefix...))
				}
				return
			}
			for c := 0; c <= min(left, spreadCap); c++ {
				rec(append(prefix, c), left-c)
			}
		}
		rec(nil, len(sm.Pods))
	}
	memo := map[[3]int]float64{}
	edgeCost := func(e int, va, vb int) float64 {
		key := [3]int{e, va, vb}
		if c, ok := memo[key]; ok {
			return c
		}
		call := m.Calls[e]
		c := oracleTransport(t, m, call, vectors[call.From][va], vectors[call.To][vb])
		memo[key] = c
		return c
	}
	choice := make([]int, len(m.Services))
	opt = math.Inf(1)
	var search func(s int)
	search = func(s int) {
		if s == len(m.Services) {
			var c float64
			for e, call := range m.Calls {
				c += edgeCost(e, choice[call.From], choice[call.To])
			}
			if c < opt {
				opt = c
				best = best[:0]
				for s, vi := range choice {
					best = append(best, vectors[s][vi])
				}
			}
			feasible = true
			return
		}
		sm := &m.Services[s]
		for vi, vec := range vectors[s] {
			ok := true
			for u, k := range vec {
				if int64(k)*sm.CPU > cpu[u] || int64(k)*sm.Mem > mem[u] {
					ok = false
				}
			}
			if !ok {
				continue
			}
			for u, k := range vec {
				cpu[u] -= int64(k) * sm.CPU
				mem[u] -= int64(k) * sm.Mem
			}
			choice[s] = vi
			search(s + 1)
			for u, k := range vec {
				cpu[u] += int64(k) * sm.CPU
				mem[u] += int64(k) * sm.Mem
			}
		}
	}
	search(0)
	return opt, feasible, best
}

// oracleTransport is the optimal LATA cost of one call edge when its caller and callee have
// the given pod counts per node (unit weights): the node-level transportation problem, by LP.
func oracleTransport(t *testing.T, m *Model, call CallEdge, ca, cb []int) float64 {
	t.Helper()
	rps := m.Services[call.From].Load * call.Rate
	na, nb := float64(sum(intsToFloats(ca))), float64(sum(intsToFloats(cb)))
	var src, dst []int
	for u, k := range ca {
		if k > 0 {
			src = append(src, u)
		}
	}
	for v, k := range cb {
		if k > 0 {
			dst = append(dst, v)
		}
	}
	if len(src) == 1 || len(dst) == 1 {
		var c float64
		for _, u := range src {
			for _, v := range dst {
				c += rps * float64(ca[u]) / na * float64(cb[v]) / nb * m.Latency.At(u, v)
			}
		}
		return c
	}
	k := len(dst)
	rows := len(src) + k - 1
	a := mat.NewDense(rows, len(src)*k, nil)
	b := make([]float64, rows)
	cost := make([]float64, len(src)*k)
	for i, u := range src {
		b[i] = rps * float64(ca[u]) / na
		for j, v := range dst {
			cost[i*k+j] = m.Latency.At(u, v)
			a.Set(i, i*k+j, 1)
			if j < k-1 {
				a.Set(len(src)+j, i*k+j, 1)
			}
		}
	}
	for j := 0; j < k-1; j++ {
		b[len(src)+j] = rps * float64(cb[dst[j]]) / nb
	}
	opt, _, err := lp.Simplex(cost, a, b, 1e-10, nil)
	if err != nil {
		t.Fatalf("lp oracle %d→%d: %v", call.From, call.To, err)
	}
	return opt
}

func intsToFloats(v []int) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// checkPlacement asserts that pl places every pod of m on a node within the constraints, and
// that its cost is the LATA cost of the placed topology.
func checkPlacement(t *testing.T, label string, m *Model, pl *Placement) {
	t.Helper()
	n := len(m.Nodes)
	usedC, usedM := make([]int64, n), make([]int64, n)
	if got, want := len(pl.Placement), countPods(m); got != want {
		t.Fatalf("%s: %d pods placed, want %d", label, got, want)
	}
	for _, sm := range m.Services {
		per := map[int]int{}
		for _, p := range sm.Pods {
			u, ok := m.NodeIndex(pl.Placement[p.Name])
			if !ok {
				t.Fatalf("%s: pod %s placed on unknown node %q", label, p.Name, pl.Placement[p.Name])
			}
			per[u]++
			usedC[u] += sm.CPU
			usedM[u] += sm.Mem
		}
		spreadCap := (len(sm.Pods) + n - 1) / n
		for u, k := range per {
			if k > spreadCap {
				t.Fatalf("%s: %d pods of %s on %s, spread cap %d", label, k, sm.Name, m.Nodes[u].Name, spreadCap)
			}
		}
	}
	for u, node := range m.Nodes {
		if node.CPU > 0 && usedC[u] > node.CPU || node.Memory > 0 && usedM[u] > node.Memory {
			t.Fatalf("%s: node %s over capacity: cpu %d/%d memory %d/%d", label, node.Name, usedC[u], node.CPU, usedM[u], node.Memory)
		}
	}
	placed, err := Compile(pl.Apply(m.Topology), Options{})
	if err != nil {
		t.Fatalf("%s: placed topology does not compile: %v", label, err)
	}
	alloc, err := Plan(placed, LATA)
	if err != nil {
		t.Fatalf("%s: plan: %v", label, err)
	}
	if math.Abs(alloc.Cost-pl.Cost) > 1e-9*(1+alloc.Cost) {
		t.Fatalf("%s: cost %v, plan of the placed topology says %v", label, pl.Cost, alloc.Cost)
	}
}

func countPods(m *Model) int {
	k := 0
	for _, s := range m.Services {
		k += len(s.Pods)
	}
	return k
}

// gapStats summarises per-instance gaps.
type gapStats struct {
	gaps      []float64
	cost, opt float64
}

func (g *gapStats) add(cost, opt float64) {
	g.cost += cost
	g.opt += opt
	switch {
	case opt > 1e-9:
		g.gaps = append(g.gaps, cost/opt-1)
	case cost <= 1e-6:
		g.gaps = append(g.gaps, 0)
	default:
		g.gaps = append(g.gaps, math.Inf(1))
	}
}

func (g *gapStats) aggregate() float64 { return g.cost/g.opt - 1 }

func (g *gapStats) String() string {
	s := append([]float64(nil), g.gaps...)
	sort.Float64s(s)
	q := func(p float64) float64 { return s[int(math.Ceil(p*float64(len(s))))-1] }
	optimal, inf := 0, 0
	var mean float64
	for _, x := range s {
		if x <= 1e-6 {
			optimal++
		}
		if math.IsInf(x, 1) {
			inf++
		} else {
			mean += x
		}
	}
	mean /= float64(len(s) - inf)
	out := fmt.Sprintf("aggregate %6.2f%%  mean %7.2f%%  median %6.2f%%  p90 %7.2f%%  max %8.2f%%  optimal %3d/%d",
		100*g.aggregate(), 100*mean, 100*q(0.5), 100*q(0.9), 100*s[len(s)-1-inf], optimal, len(s))
	if inf > 0 {
		out += fmt.Sprintf("  (+%d with optimum 0, cost > 0: not in mean/max)", inf)
	}
	return out
}

// TestPlaceAgainstExactOptimum compares every policy with the exact optimum on random small
// instances (≤ 4 services, ≤ 3 replicas, ≤ 5 nodes), checks the constraints of every placement
// and that exactly the infeasible instances are rejected.
func TestPlaceAgainstExactOptimum(t *testing.T) {
	const instances = 400
	cfg := placeGenConfig{nodes: 5, services: 4, replicas: 3}
	stats := map[string]*gapStats{}
	for _, v := range larpIngredients {
		stats[v.name] = &gapStats{}
	}
	infeasible := 0
	for seed := uint64(0); seed < instances; seed++ {
		top := genPlaceTopology(seed, cfg)
		m := compileUnplaced(t, top)
		opt, feasible, _ := placeOracle(t, m)
		if !feasible {
			infeasible++
		}
		for _, p := range PlacementPolicies() {
			label := fmt.Sprintf("seed %d %s", seed, p)
			pl, err := Place(m, p)
			if !feasible {
				if !errors.Is(err, ErrInfeasible) || !errors.Is(err, ErrInvalidTopology) {
					t.Fatalf("%s: the oracle finds no feasible placement, Place returned %v", label, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v (the oracle finds a placement of cost %v)", label, err, opt)
			}
			checkPlacement(t, label, m, pl)
			if pl.Cost < opt-1e-6*(1+opt)-CostQuantumMS*totalRPS(m) {
				t.Fatalf("%s: cost %v below the exact optimum %v", label, pl.Cost, opt)
			}
			stats[string(p)].add(pl.Cost, opt)
		}
		if !feasible {
			continue
		}
		for _, v := range larpIngredients {
			if v.tune != nil {
				stats[v.name].add(placeWith(t, m, *v.tune).Cost, opt)
			}
		}
	}
	t.Logf("%d instances (%d infeasible, rejected as such); gap = cost/optimum − 1 over the %d feasible:",
		instances, infeasible, instances-infeasible)
	for _, v := range larpIngredients {
		t.Logf("  %-40s %v", v.name, stats[v.name])
	}
	if g := stats[string(LARP)].aggregate(); g > 0.05 {
		t.Errorf("larp's aggregate gap to the exact optimum is %.2f%%, want ≤ 5%%", 100*g)
	}
	if g, h := stats[string(LARP)].aggregate(), stats[string(LARPGreedy)].aggregate(); g > h {
		t.Errorf("larp's aggregate gap %.2f%% is above larp-greedy's %.2f%%", 100*g, 100*h)
	}
	if infeasible == 0 || infeasible > instances/2 {
		t.Errorf("%d of %d instances infeasible: the generator drifted", infeasible, instances)
	}
}

// larpIngredients are the policies and larp's ingredients, added one at a time, as the gap
// tables report them (tune nil: the policy of that name).
var larpIngredients = []struct {
	name string
	tune *larpTuning
}{
	{name: string(K8sSpread)},
	{name: string(LARPGreedy)},
	{"greedy from every start node (best)", &larpTuning{allStarts: true}},
	{"… + local search (moves, swaps)", func() *larpTuning { t := larpDefault; t.exchangeMaxNodes = 0; return &t }()},
	{name: string(LARP)}, // … + node exchanges
}

// placeWith places m with larp's search tuned by tune.
func placeWith(t testing.TB, m *Model, tune larpTuning) *Placement {
	t.Helper()
	pp, err := newPlaceProblem(m)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := pp.larpWith(tune)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := pp.placement(LARP, nodes)
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// totalRPS is Σ over call edges of their rps: the bound on how far quantising latency can move
// a cost.
func totalRPS(m *Model) float64 {
	var r float64
	for _, c := range m.Calls {
		r += m.Services[c.From].Load * c.Rate
	}
	return r
}

func TestPlaceDeterministic(t *testing.T) {
	cfgs := []placeGenConfig{
		{nodes: 5, services: 4, replicas: 3},
		{nodes: 12, services: 10, replicas: 5, zones: 3, slack: 1.4},
	}
	for i, cfg := range cfgs {
		for seed := uint64(0); seed < 20; seed++ {
			m := compileUnplaced(t, genPlaceTopology(seed, cfg))
			for _, p := range PlacementPolicies() {
				var first *Placement
				for _, procs := range []int{1, 2, 4, 1} {
					prev := runtime.GOMAXPROCS(procs)
					pl, err := Place(m, p)
					runtime.GOMAXPROCS(prev)
					if errors.Is(err, ErrInfeasible) {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					if first == nil {
						first = pl
						continue
					}
					if fmt.Sprint(pl) != fmt.Sprint(first) {
						t.Fatalf("config %d seed %d %s: GOMAXPROCS=%d gives %v, first run %v", i, seed, p, procs, pl, first)
					}
				}
			}
		}
	}
}

// TestPlaceMediumInstances checks constraints and the ordering of the policies on instances
// too large for the oracle.
func TestPlaceMediumInstances(t *testing.T) {
	var sums [3]float64
	instances := uint64(30)
	if placeRace {
		instances = 8
	}
	for seed := uint64(0); seed < instances; seed++ {
		cfg := placeGenConfig{nodes: 16, services: 24, replicas: 6, zones: 4, calls: 36, slack: 1.3}
		m := compileUnplaced(t, genPlaceTopology(seed, cfg))
		var costs [3]float64
		for i, p := range PlacementPolicies() {
			pl, err := Place(m, p)
			if err != nil {
				t.Fatalf("seed %d %s: %v", seed, p, err)
			}
			checkPlacement(t, fmt.Sprintf("seed %d %s", seed, p), m, pl)
			costs[i] = pl.Cost
			sums[i] += pl.Cost
		}
		if costs[2] > costs[0]+1e-6*(1+costs[0]) || costs[2] > costs[1]+1e-6*(1+costs[1]) {
			t.Fatalf("seed %d: larp cost %v worse than k8s-spread %v or larp-greedy %v", seed, costs[2], costs[0], costs[1])
		}
	}
	t.Logf("Σ cost over %d instances: k8s-spread %.0f, larp-greedy %.0f (%.1f%%), larp %.0f (%.1f%%)",
		instances, sums[0], sums[1], 100*(sums[1]/sums[0]-1), sums[2], 100*(sums[2]/sums[0]-1))
}

func TestPlaceInfeasible(t *testing.T) {
	base := func() *Topology {
		return &Topology{
			Nodes:   []Node{{Name: "a", CPU: 1000, Memory: 1024}, {Name: "b", CPU: 1000, Memory: 1024}},
			Latency: []Latency{{From: "a", To: "b", MS: 5}},
			Services: []Service{
				{Name: "front", CPU: 400, Memory: 256, Replicas: 2},
				{Name: "back", CPU: 400, Memory: 256, Replicas: 2},
			},
			Calls:   []Call{{From: "front", To: "back"}},
			Ingress: []Ingress{{Service: "front", RPS: 100}},
		}
	}
	tests := []struct {
		name   string
		change func(t *Topology)
		want   []string
	}{
		{"cpu", func(t *Topology) { t.Services[1].CPU = 1200 }, []string{`service "back"`, "cpu"}},
		{"memory", func(t *Topology) { t.Services[0].Memory = 2048 }, []string{`service "front"`, "memory"}},
		{"spread", func(t *Topology) { t.Nodes[1].CPU = 100 }, []string{"spread", "at most 1 per node"}},
		{"together", func(t *Topology) { t.Services[1].CPU = 700 }, []string{"cpu", "left by the other services"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			top := base()
			tc.change(top)
			m := compileUnplaced(t, top)
			for _, p := range PlacementPolicies() {
				_, err := Place(m, p)
				if !errors.Is(err, ErrInfeasible) || !errors.Is(err, ErrInvalidTopology) {
					t.Fatalf("%s: got %v, want an ErrInfeasible error", p, err)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: error %q does not say %q", p, err, w)
					}
				}
			}
		})
	}
}

// TestPlaceInfeasibleInAll: every service fits alone, but together they need more cpu than the
// nodes have; the error names the service the packing could not place.
func TestPlaceInfeasibleInAll(t *testing.T) {
	top := &Topology{}
	for u := 0; u < 10; u++ {
		top.Nodes = append(top.Nodes, Node{Name: fmt.Sprintf("n%d", u), CPU: 1000, Memory: 4096})
	}
	for s := 0; s < 14; s++ {
		top.Services = append(top.Services, Service{Name: fmt.Sprintf("s%d", s), CPU: 150, Memory: 64, Replicas: 5})
	}
	d := 1.0
	m, err := Compile(top, Options{Unplaced: true, DefaultLatencyMS: &d})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range PlacementPolicies() {
		_, err := Place(m, p)
		if !errors.Is(err, ErrInfeasible) || !strings.Contains(err.Error(), "cpu") ||
			!strings.Contains(err.Error(), "10500m cpu in all, the nodes have 10000m") || !strings.Contains(err.Error(), `service "s`) {
			t.Errorf("%s: %v", p, err)
		}
	}
}

func TestParsePlacementPolicy(t *testing.T) {
	for _, p := range PlacementPolicies() {
		if got, err := ParsePlacementPolicy(string(p)); err != nil || got != p {
			t.Errorf("ParsePlacementPolicy(%q) = %q, %v", p, got, err)
		}
	}
	if _, err := ParsePlacementPolicy("lata"); err == nil {
		t.Error("ParsePlacementPolicy(lata) succeeded")
	}
	m := compileUnplaced(t, genPlaceTopology(1, placeGenConfig{nodes: 3, services: 3, replicas: 2}))
	if _, err := Place(m, "best"); err == nil {
		t.Error("Place with an unknown policy succeeded")
	}
}

// TestLARPGreedyFollowsThePaper checks the paper's greedy on a case worked by hand: two groups
// (A=3, B=2 → round(2.5) = 2), the larger group (two pods) on the node with the most free
// capacity, the other on the free node nearest to it.
func TestLARPGreedyFollowsThePaper(t *testing.T) {
	top := &Topology{
		Nodes: []Node{{Name: "far", CPU: 4000, Memory: 4096}, {Name: "big", CPU: 8000, Memory: 8192},
			{Name: "near", CPU: 4000, Memory: 4096}},
		Latency: []Latency{{From: "far", To: "big", MS: 30}, {From: "far", To: "near", MS: 32}, {From: "big", To: "near", MS: 2}},
		Services: []Service{
			{Name: "a", CPU: 500, Memory: 256, Replicas: 3},
			{Name: "b", CPU: 500, Memory: 256, Replicas: 2},
		},
		Calls:   []Call{{From: "a", To: "b"}},
		Ingress: []Ingress{{Service: "a", RPS: 90}},
	}
	m := compileUnplaced(t, top)
	pl, err := Place(m, LARPGreedy)
	if err != nil {
		t.Fatal(err)
	}
	// Groups: {a-0, a-2, b-0} (larger) and {a-1, b-1}. Spread cap: a ≤ 1 per node, b ≤ 1.
	// Group 0 on "big": a-0, b-0 fit; a-2 is over a's cap there and goes to the node nearest
	// "big" with room: "near". Group 1's home: the node holding no pod yet: "far".
	want := map[string]string{"a-0": "big", "b-0": "big", "a-2": "near", "a-1": "far", "b-1": "far"}
	if fmt.Sprint(pl.Placement) != fmt.Sprint(want) {
		t.Fatalf("larp-greedy placed %v, want %v", pl.Placement, want)
	}
	checkPlacement(t, "larp-greedy", m, pl)
	best, err := Place(m, LARP)
	if err != nil {
		t.Fatal(err)
	}
	checkPlacement(t, "larp", m, best)
	if best.Cost > pl.Cost {
		t.Fatalf("larp cost %v above larp-greedy's %v", best.Cost, pl.Cost)
	}
}

func TestPlacementApply(t *testing.T) {
	w := 2.0
	top := &Topology{
		Nodes:   []Node{{Name: "a"}, {Name: "b"}},
		Latency: []Latency{{From: "a", To: "b", MS: 1}},
		Services: []Service{
			{Name: "x", Replicas: 2},
			{Name: "y", Pods: []Pod{{Name: "y-main", Weight: &w, Address: "10.0.0.1:80"}, {Name: "y-side"}}},
		},
		Calls:   []Call{{From: "x", To: "y"}},
		Ingress: []Ingress{{Service: "x", RPS: 10}},
	}
	pl := &Placement{Policy: LARP, Placement: map[string]string{"x-0": "a", "x-1": "b", "y-main": "b", "y-side": "a"}}
	got := pl.Apply(top)
	if top.Services[0].Replicas != 2 || len(top.Services[0].Pods) != 0 || top.Services[1].Pods[0].Node != "" {
		t.Fatal("Apply modified its input")
	}
	if got.Services[0].Replicas != 0 || len(got.Services[0].Pods) != 2 || got.Services[0].Pods[1] != (Pod{Name: "x-1", Node: "b"}) {
		t.Fatalf("service x: %+v", got.Services[0])
	}
	if p := got.Services[1].Pods[0]; p.Node != "b" || *p.Weight != 2 || p.Address != "10.0.0.1:80" {
		t.Fatalf("pod y-main: %+v", p)
	}
	if _, err := Compile(got, Options{}); err != nil {
		t.Fatal(err)
	}
}

// TestPlaceWeightedPods places pods given by name with unequal weights and no node.
func TestPlaceWeightedPods(t *testing.T) {
	for seed := uint64(0); seed < 40; seed++ {
		top := genPlaceTopology(seed, placeGenConfig{nodes: 6, services: 5, replicas: 4, slack: 1.5})
		r := rand.New(rand.NewPCG(seed, 7))
		for i := range top.Services {
			s := &top.Services[i]
			for k := 0; k < s.Replicas; k++ {
				w := []float64{0, 0.5, 1, 2.25, 3}[r.IntN(5)]
				if k == 0 {
					w = 1
				}
				s.Pods = append(s.Pods, Pod{Name: fmt.Sprintf("%s-p%d", s.Name, k), Weight: &w})
			}
		}
		m := compileUnplaced(t, top)
		for _, p := range PlacementPolicies() {
			pl, err := Place(m, p)
			if err != nil {
				t.Fatalf("seed %d %s: %v", seed, p, err)
			}
			checkPlacement(t, fmt.Sprintf("seed %d %s", seed, p), m, pl)
		}
	}
}

func FuzzPlace(f *testing.F) {
	f.Add([]byte(`
nodes: [{name: a, cpu: 2000, memory: 2048}, {name: b, cpu: 1000, memory: 1024}, {name: c}]
latency: [{from: a, to: b, ms: 3}, {from: b, to: c, ms: 1.5}, {from: a, to: c, ms: 9}, {from: a, to: a, ms: 0.2}]
services:
  - {name: x, cpu: 500, memory: 256, replicas: 3}
  - {name: y, cpu: 300, memory: 128, pods: [{name: y0, weight: 2}, {name: y1}]}
  - {name: z, replicas: 2}
calls: [{from: x, to: y, rate: 2}, {from: y, to: z}, {from: x, to: z, rate: 0.5}]
ingress: [{service: x, rps: 100}]
`))
	f.Add([]byte(`{"nodes": [{"name": "a", "cpu": 100}], "services": [{"name": "s", "cpu": 200, "replicas": 1}]}`))
	f.Add([]byte(`{"nodes": [{"name": "a"}, {"name": "b"}], "latency": [{"from": "a", "to": "b", "ms": 1}],
		"services": [{"name": "s", "replicas": 4}, {"name": "t", "replicas": 1}], "calls": [{"from": "s", "to": "t"}],
		"ingress": [{"service": "s", "rps": 1e300}]}`))
	for seed := uint64(0); seed < 4; seed++ {
		data, err := json.Marshal(genPlaceTopology(seed, placeGenConfig{nodes: 4, services: 3, replicas: 3}))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		top, err := ParseTopology(strings.NewReader(string(data)), "fuzz")
		if err != nil {
			return
		}
		// Compile generates Replicas pods: keep the instance small enough to place quickly.
		pods := 0
		for _, s := range top.Services {
			pods += max(s.Replicas, len(s.Pods))
		}
		if pods > 200 || len(top.Nodes) > 30 || len(top.Services) > 40 {
			return
		}
		m, err := Compile(top, Options{Unplaced: true})
		if err != nil {
			return
		}
		var costs []float64
		for _, p := range PlacementPolicies() {
			pl, err := Place(m, p)
			if err != nil {
				if !errors.Is(err, ErrInvalidTopology) {
					t.Fatalf("%s: error not wrapping ErrInvalidTopology: %v", p, err)
				}
				continue
			}
			checkPlacement(t, string(p), m, pl)
			costs = append(costs, pl.Cost)
		}
		if len(costs) != 0 && len(costs) != 3 {
			t.Fatalf("some policies place the input and some do not: costs %v", costs)
		}
	})
}
