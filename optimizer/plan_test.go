package optimizer

import (
	"math"
	"runtime"
	"testing"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// edgeView gives a test the real supplies and demands of a call edge.
type edgeView struct {
	m       *Model
	e       CallEdge
	call    *CallAllocation
	callers []PodRef
	callees []PodRef
	supply  map[string]float64 // caller pod → rps it sends on this edge
	demand  map[string]float64 // callee pod → rps it must receive (its capacity share)
	node    map[string]int
	// rpsTol is the relative tolerance of a route's rps against fraction × supply; 0 means
	// 1e-9.
	rpsTol float64
}

func edges(m *Model, a *Allocation) []edgeView {
	var out []edgeView
	for k, e := range m.Calls {
		v := edgeView{m: m, e: e, call: &a.Calls[k], callers: m.Services[e.From].Pods, callees: m.Services[e.To].Pods,
			supply: map[string]float64{}, demand: map[string]float64{}, node: map[string]int{}}
		total := m.Services[e.From].Load * e.Rate
		wa, wb := m.Services[e.From].TotalWeight(), m.Services[e.To].TotalWeight()
		for _, p := range v.callers {
			v.supply[p.Name] = total * p.Weight / wa
			v.node[p.Name] = p.Node
		}
		for _, q := range v.callees {
			v.demand[q.Name] = total * q.Weight / wb
			v.node[q.Name] = q.Node
		}
		out = append(out, v)
	}
	return out
}

// checkFractions asserts every caller's fractions are positive and sum to 1, and rps and cost
// agree with them.
func checkFractions(t *testing.T, label string, v edgeView) {
	t.Helper()
	sums := map[string]float64{}
	var cost float64
	for _, r := range v.call.Routes {
		if !(r.Fraction > 0) || r.Fraction > 1+1e-12 {
			t.Fatalf("%s %s→%s: route %s→%s has fraction %v", label, v.call.From, v.call.To, r.Caller, r.Callee, r.Fraction)
		}
		sums[r.Caller] += r.Fraction
		tol := v.rpsTol
		if tol == 0 {
			tol = 1e-9
		}
		if want := r.Fraction * v.supply[r.Caller]; math.Abs(r.RPS-want) > tol*(1+want) {
			t.Fatalf("%s: route %s→%s rps %v, want %v", label, r.Caller, r.Callee, r.RPS, want)
		}
		cost += r.RPS * v.m.Latency.At(v.node[r.Caller], v.node[r.Callee])
	}
	for _, p := range v.callers {
		if math.Abs(sums[p.Name]-1) > 1e-9 {
			t.Fatalf("%s %s→%s: caller %s fractions sum to %v", label, v.call.From, v.call.To, p.Name, sums[p.Name])
		}
	}
	if math.Abs(cost-v.call.Cost) > 1e-9*(1+cost) {
		t.Fatalf("%s: edge cost %v, routes say %v", label, v.call.Cost, cost)
	}
}

// checkBalanced asserts every callee receives its capacity share.
func checkBalanced(t *testing.T, label string, v edgeView) {
	t.Helper()
	got := map[string]float64{}
	var total float64
	for _, r := range v.call.Routes {
		got[r.Callee] += r.RPS
	}
	for _, d := range v.demand {
		total += d
	}
	for _, q := range v.callees {
		if diff := math.Abs(got[q.Name] - v.demand[q.Name]); diff > 1e-6*(1+total) {
			t.Fatalf("%s %s→%s: callee %s receives %v rps, its share is %v", label, v.call.From, v.call.To, q.Name, got[q.Name], v.demand[q.Name])
		}
	}
}

// lpOptimum solves the edge's transportation problem with gonum's dense simplex: an
// independent oracle (real numbers, no quantisation, a different algorithm).
func lpOptimum(t *testing.T, v edgeView) float64 {
	t.Helper()
	n, k := len(v.callers), len(v.callees)
	// Rows: n supply rows, then k-1 demand rows (the last is implied: A must have full rank).
	rows := n + k - 1
	a := mat.NewDense(rows, n*k, nil)
	b := make([]float64, rows)
	c := make([]float64, n*k)
	for i, p := range v.callers {
		b[i] = v.supply[p.Name]
		for j, q := range v.callees {
			c[i*k+j] = v.m.Latency.At(p.Node, q.Node)
			a.Set(i, i*k+j, 1)
			if j < k-1 {
				a.Set(n+j, i*k+j, 1)
			}
		}
	}
	for j := 0; j < k-1; j++ {
		b[n+j] = v.demand[v.callees[j].Name]
	}
	opt, _, err := lp.Simplex(c, a, b, 1e-10, nil)
	if err != nil {
		t.Fatalf("lp oracle on %s→%s: %v", v.call.From, v.call.To, err)
	}
	return opt
}

func TestPlanProperties(t *testing.T) {
	shapes := []genConfig{
		{nodes: 3, services: 3, maxPods: 4},
		{nodes: 4, services: 4, maxPods: 5, weights: true, extraCalls: 2},
		{nodes: 5, services: 5, maxPods: 6, weights: true, fractional: true, extraCalls: 3},
		{nodes: 2, services: 3, maxPods: 6, ties: true},
		{nodes: 6, services: 4, maxPods: 7, weights: true, ties: true, extraCalls: 2},
	}
	const instances = 600
	var edgesChecked, oracleChecked int
	for seed := uint64(0); seed < instances; seed++ {
		shape := shapes[seed%uint64(len(shapes))]
		top := genTopology(seed, shape)
		m, err := Compile(top, Options{})
		if err != nil {
			t.Fatalf("seed %d: generated topology invalid: %v", seed, err)
		}
		plans := map[Policy]*Allocation{}
		for _, p := range Policies() {
			a, err := Plan(m, p)
			if err != nil {
				t.Fatalf("seed %d %s: %v", seed, p, err)
			}
			plans[p] = a
			for _, v := range edges(m, a) {
				checkFractions(t, string(p), v)
				if p != Localization {
					checkBalanced(t, string(p), v)
				}
			}
		}
		lata := edges(m, plans[LATA])
		rr, ot, loc := edges(m, plans[RoundRobin]), edges(m, plans[OptTraffic]), edges(m, plans[Localization])
		for i, v := range lata {
			edgesChecked++
			var rps float64
			for _, s := range v.supply {
				rps += s
			}
			tol := 1e-7*(1+v.call.Cost) + 1.5*CostQuantumMS*rps // documented bound: rounding + tie-break
			for _, base := range []edgeView{rr[i], ot[i]} {
				if v.call.Cost > base.call.Cost+tol {
					t.Fatalf("seed %d %s→%s: lata costs %v, more than %s's %v", seed, v.call.From, v.call.To, v.call.Cost, plans[RoundRobin].Policy, base.call.Cost)
				}
			}
			// Localization ignores the load constraint: it is the unconstrained lower bound.
			if loc[i].call.Cost > v.call.Cost+tol {
				t.Fatalf("seed %d %s→%s: localization %v costs more than lata %v", seed, v.call.From, v.call.To, loc[i].call.Cost, v.call.Cost)
			}
			if len(v.callers)*len(v.callees) <= 49 {
				oracleChecked++
				if opt := lpOptimum(t, v); math.Abs(opt-v.call.Cost) > tol+1e-6*(1+opt) {
					t.Fatalf("seed %d %s→%s: lata cost %v, LP optimum %v", seed, v.call.From, v.call.To, v.call.Cost, opt)
				}
			}
			if routes := len(v.call.Routes); routes > len(v.callers)+len(v.callees)-1 {
				t.Fatalf("seed %d %s→%s: %d routes, a basic solution has at most %d", seed, v.call.From, v.call.To, routes, len(v.callers)+len(v.callees)-1)
			}
		}
	}
	t.Logf("%d topologies, %d call edges, %d checked against gonum's LP simplex", instances, edgesChecked, oracleChecked)
	if oracleChecked < 500 {
		t.Fatalf("only %d edges reached the oracle; the generator drifted", oracleChecked)
	}
}

func TestPlanDeterministic(t *testing.T) {
	top := genTopology(7, genConfig{nodes: 8, services: 12, maxPods: 9, weights: true, fractional: true, extraCalls: 10})
	m, err := Compile(top, Options{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := Plan(m, LATA)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 6; i++ {
		// Half the runs on one core: the parallel solve must not change a bit.
		prev := runtime.GOMAXPROCS(1 + i%2)
		again, err := Plan(m, LATA)
		runtime.GOMAXPROCS(prev)
		if err != nil {
			t.Fatal(err)
		}
		if len(again.Calls) != len(first.Calls) || again.Cost != first.Cost {
			t.Fatalf("run %d: cost %v, first run %v", i, again.Cost, first.Cost)
		}
		for k := range first.Calls {
			a, b := first.Calls[k].Routes, again.Calls[k].Routes
			if len(a) != len(b) {
				t.Fatalf("run %d edge %d: %d routes, first run %d", i, k, len(b), len(a))
			}
			for j := range a {
				if a[j] != b[j] {
					t.Fatalf("run %d edge %d route %d: %+v, first run %+v", i, k, j, b[j], a[j])
				}
			}
		}
	}
}

// TestPlanWorkerCountChanges raises the worker count between any two reads of it, as Go does
// when a container's CPU limit rises during a solve: Plan must size its per-worker scratch and
// run its workers by one reading (it once indexed past the scratch and panicked).
func TestPlanWorkerCountChanges(t *testing.T) {
	top := genTopology(3, genConfig{nodes: 6, services: 12, maxPods: 6, extraCalls: 12})
	m, err := Compile(top, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := Plan(m, LATA)
	if err != nil {
		t.Fatal(err)
	}
	old := workerCount
	defer func() { workerCount = old }()
	reads := 0
	workerCount = func() int { reads++; return reads } // 1, then 2, 3, …
	for _, p := range Policies() {
		reads = 0
		got, err := Plan(m, p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if p == LATA && got.Cost != want.Cost {
			t.Fatalf("cost %v with a changing worker count, %v without", got.Cost, want.Cost)
		}
	}
	// LARP's starts use per-worker scratch too.
	pm, err := Compile(top, Options{Unplaced: true})
	if err != nil {
		t.Fatal(err)
	}
	reads = 0
	if _, err := Place(pm, LARP); err != nil {
		t.Fatalf("place: %v", err)
	}
}

// TestPlanManyReplicasMemory: 2000 caller and 2000 callee pods on 20 nodes. The solve works on
// nodes, so it allocates O(nodes² + pods), not a pods × pods cost matrix (which was 32 MiB of
// costs alone, 160 MB per solve in all).
func TestPlanManyReplicasMemory(t *testing.T) {
	m, err := Compile(replicaTopology(1, 20, 2000, 2000), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	a, err := Plan(m, LATA)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
		t.Fatalf("Plan allocated %d bytes for 2000 × 2000 pods on 20 nodes; want < 16 MiB", got)
	}
	for _, v := range edges(m, a) {
		checkFractions(t, "lata", v)
		checkBalanced(t, "lata", v)
		if routes := len(v.call.Routes); routes > len(v.callers)+len(v.callees)-1 {
			t.Fatalf("%d routes, a basic solution has at most %d", routes, len(v.callers)+len(v.callees)-1)
		}
	}
}

// TestRoundRobinCost: RoundRobinCost equals Plan's round-robin cost exactly, on seeded random
// topologies with and without weights (zero weights included) and per zone.
func TestRoundRobinCost(t *testing.T) {
	for i := 0; i < 80; i++ {
		c := genConfig{nodes: 2 + i%9, services: 2 + i%4, maxPods: 8, extraCalls: i % 3, weights: i%2 == 0, fractional: i%4 == 0}
		top := genTopology(uint64(i), c)
		if i%5 == 0 && c.weights { // a caller pod that receives nothing
			zero := 0.0
			top.Services[0].Pods[0].Weight = &zero
		}
		tops := map[string]*Topology{"per node": top}
		if i%3 == 0 {
			perZone, _ := zoneTopology(uint64(i), c, 1+i%4, i%2 == 0)
			tops["per zone"] = perZone
		}
		for kind, top := range tops {
			m, err := Compile(top, Options{})
			if err != nil {
				t.Fatalf("instance %d %s: %v", i, kind, err)
			}
			want := mustPlan(t, m, RoundRobin).Cost
			got, err := RoundRobinCost(m)
			if err != nil {
				t.Fatalf("instance %d %s: %v", i, kind, err)
			}
			if got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
				t.Errorf("instance %d %s: RoundRobinCost %v, Plan's round-robin cost %v", i, kind, got, want)
			}
		}
	}
}
