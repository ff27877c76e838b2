package optimizer

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// rebalanceWorld builds a placed topology: nodes with cpu (0 = unlimited), symmetric latencies
// (self 0), services with cpu 500 and pods on the nodes given, calls of rate 1, ingress 100
// into the first service of each call.
func rebalanceWorld(nodes map[string]int64, order []string, lat map[[2]string]float64, pods map[string][]string, svcOrder []string, calls [][2]string) *Topology {
	t := &Topology{}
	for _, n := range order {
		t.Nodes = append(t.Nodes, Node{Name: n, CPU: nodes[n]})
	}
	for i, a := range order {
		for _, b := range order[i+1:] {
			ms, ok := lat[[2]string{a, b}]
			if !ok {
				ms = lat[[2]string{b, a}]
			}
			t.Latency = append(t.Latency, Latency{From: a, To: b, MS: ms})
		}
	}
	for _, s := range svcOrder {
		svc := Service{Name: s, CPU: 500}
		for k, n := range pods[s] {
			svc.Pods = append(svc.Pods, Pod{Name: fmt.Sprintf("%s-%d", s, k), Node: n})
		}
		t.Services = append(t.Services, svc)
	}
	for _, c := range calls {
		t.Calls = append(t.Calls, Call{From: c[0], To: c[1]})
		t.Ingress = append(t.Ingress, Ingress{Service: c[0], RPS: 100})
	}
	return t
}

func compilePlaced(t *testing.T, top *Topology) *Model {
	t.Helper()
	m, err := Compile(top, Options{})
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return m
}

func mustRebalance(t *testing.T, m *Model, opt RebalanceOptions) *Rebalance {
	t.Helper()
	rb, err := PlanRebalance(m, opt)
	if err != nil {
		t.Fatalf("PlanRebalance: %v", err)
	}
	return rb
}

func relClose(a, b, rel float64) bool {
	return math.Abs(a-b) <= rel*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// classMoves counts the moves from the placement of m to target with interchangeable pods
// (one service, equal weight): Σ over (service, weight, node) of max(0, current − target).
func classMoves(m *Model, target map[string]string) int {
	type key struct {
		svc  string
		w    float64
		node string
	}
	surplus := map[key]int{}
	for _, sm := range m.Services {
		for _, p := range sm.Pods {
			surplus[key{sm.Name, p.Weight, m.Nodes[p.Node].Name}]++
			surplus[key{sm.Name, p.Weight, target[p.Name]}]--
		}
	}
	k := 0
	for _, x := range surplus {
		k += max(0, x)
	}
	return k
}

// checkRebalance walks the plan on a copy of m's topology: every move starts where its pod is,
// lands on a node with room (cpu, memory, spread cap), and its CostAfter is Plan's cost of the
// topology so far; moves and blocked moves together lead exactly to Target, which is feasible
// and costs CostTarget; and no pod moves that need not.
func checkRebalance(t *testing.T, label string, m *Model, rb *Rebalance) {
	t.Helper()
	plan := func(top *Topology) float64 {
		t.Helper()
		pm, err := Compile(top, Options{})
		if err != nil {
			t.Fatalf("%s: compile: %v", label, err)
		}
		a, err := Plan(pm, LATA)
		if err != nil {
			t.Fatalf("%s: plan: %v", label, err)
		}
		return a.Cost
	}
	if before := mustPlan(t, m, LATA).Cost; rb.CostBefore != before {
		t.Fatalf("%s: CostBefore %v, Plan says %v", label, rb.CostBefore, before)
	}
	top := m.Topology.Clone()
	podAt := map[string]*Pod{}
	svcOf := map[string]*Service{}
	for i := range top.Services {
		s := &top.Services[i]
		for k := range s.Pods {
			podAt[s.PodKey(&s.Pods[k])] = &s.Pods[k]
			svcOf[s.PodKey(&s.Pods[k])] = s
		}
	}
	nodeCPU, nodeMem := map[string]int64{}, map[string]int64{}
	for _, n := range top.Nodes {
		nodeCPU[n.Name], nodeMem[n.Name] = n.CPU, n.Memory
	}
	for k, mv := range rb.Moves {
		p, ok := podAt[mv.Pod]
		if !ok {
			t.Fatalf("%s: move %d: unknown pod %q", label, k, mv.Pod)
		}
		s := svcOf[mv.Pod]
		if s.Key() != mv.Service || p.Node != mv.From || mv.From == mv.To {
			t.Fatalf("%s: move %d %+v: pod is on %q of service %q", label, k, mv, p.Node, s.Key())
		}
		p.Node = mv.To
		var cpu, mem int64
		same := 0
		for _, s2 := range top.Services {
			for _, q := range s2.Pods {
				if q.Node == mv.To {
					cpu, mem = cpu+s2.CPU, mem+s2.Memory
					if s2.Key() == s.Key() {
						same++
					}
				}
			}
		}
		if c := nodeCPU[mv.To]; c > 0 && cpu > c || nodeMem[mv.To] > 0 && mem > nodeMem[mv.To] {
			t.Fatalf("%s: move %d %+v: node %s over capacity (cpu %d/%d, memory %d/%d)", label, k, mv, mv.To, cpu, c, mem, nodeMem[mv.To])
		}
		if spread := (len(s.Pods) + len(top.Nodes) - 1) / len(top.Nodes); same > spread {
			t.Fatalf("%s: move %d %+v: %d pods of %s on %s, spread cap %d", label, k, mv, same, s.Key(), mv.To, spread)
		}
		if got := plan(top); !relClose(mv.CostAfter, got, 1e-6) {
			t.Fatalf("%s: move %d %+v: CostAfter %v, Plan of the topology so far says %v", label, k, mv, mv.CostAfter, got)
		}
	}
	if len(rb.Blocked) == 0 {
		want := rb.CostBefore
		if len(rb.Moves) > 0 {
			want = rb.Moves[len(rb.Moves)-1].CostAfter
		}
		if !relClose(want, rb.CostTarget, 1e-6) {
			t.Fatalf("%s: nothing blocked, final cost %v but CostTarget %v", label, want, rb.CostTarget)
		}
	}
	for k, mv := range rb.Blocked {
		p := podAt[mv.Pod]
		if p == nil || p.Node != mv.From || mv.From == mv.To || mv.CostAfter != 0 {
			t.Fatalf("%s: blocked %d %+v: pod is on %v", label, k, mv, p)
		}
		p.Node = mv.To
	}
	for name, p := range podAt {
		if rb.Target[name] != p.Node {
			t.Fatalf("%s: moves lead pod %s to %q, Target says %q", label, name, p.Node, rb.Target[name])
		}
	}
	checkPlacement(t, label+": target", m, rb.Placement())
	if got, want := len(rb.Moves)+len(rb.Blocked), classMoves(m, rb.Target); got != want {
		t.Fatalf("%s: %d moves and blocked, but the target is %d moves away", label, got, want)
	}
}

// farWorld: a, b close, c far; front and back 4 pods each (spread cap 2), back half on c.
func farWorld() *Topology {
	return rebalanceWorld(map[string]int64{}, []string{"a", "b", "c"},
		map[[2]string]float64{{"a", "b"}: 1, {"a", "c"}: 30, {"b", "c"}: 30},
		map[string][]string{"front": {"a", "a", "b", "b"}, "back": {"c", "c", "a", "b"}},
		[]string{"front", "back"}, [][2]string{{"front", "back"}})
}

func TestRebalanceFarLayout(t *testing.T) {
	m := compilePlaced(t, farWorld())
	rb := mustRebalance(t, m, RebalanceOptions{})
	checkRebalance(t, "far", m, rb)
	if len(rb.Moves) < 2 || len(rb.Blocked) != 0 {
		t.Fatalf("want at least two moves and none blocked: %+v", rb)
	}
	if !(rb.CostTarget < rb.CostBefore/2) {
		t.Fatalf("target cost %v, before %v: want far less", rb.CostTarget, rb.CostBefore)
	}
	prev := rb.CostBefore
	for k, mv := range rb.Moves {
		if mv.CostAfter > prev {
			t.Fatalf("move %d %+v raises the cost from %v", k, mv, prev)
		}
		prev = mv.CostAfter
	}
	applied := compilePlaced(t, rb.Placement().Apply(m.Topology))
	if got := mustPlan(t, applied, LATA).Cost; prev != rb.CostTarget || got != rb.CostTarget {
		t.Fatalf("last CostAfter %v, CostTarget %v, Plan of the applied target %v", prev, rb.CostTarget, got)
	}
}

// TestRebalanceMostGainFirst: two independent pairs, one with twice the traffic; its move
// comes first.
func TestRebalanceMostGainFirst(t *testing.T) {
	top := rebalanceWorld(map[string]int64{}, []string{"x", "y"}, map[[2]string]float64{{"x", "y"}: 10},
		map[string][]string{"a": {"x"}, "b": {"y"}, "c": {"x"}, "d": {"y"}}, []string{"c", "d", "a", "b"}, [][2]string{{"c", "d"}, {"a", "b"}})
	top.Ingress[1].RPS = 200 // a → b carries 200 req/s, c → d 100
	m := compilePlaced(t, top)
	rb := mustRebalance(t, m, RebalanceOptions{})
	checkRebalance(t, "gain", m, rb)
	if len(rb.Moves) != 2 || rb.CostBefore != 3000 || rb.Moves[0].CostAfter != 1000 || rb.Moves[1].CostAfter != 0 {
		t.Fatalf("want the a → b pair first (3000 → 1000 → 0): %+v", rb)
	}
}

func TestRebalanceAlreadyOptimal(t *testing.T) {
	m := compilePlaced(t, farWorld())
	again := compilePlaced(t, mustRebalance(t, m, RebalanceOptions{}).Placement().Apply(m.Topology))
	rb := mustRebalance(t, again, RebalanceOptions{})
	if len(rb.Moves)+len(rb.Blocked) != 0 || rb.CostTarget != rb.CostBefore {
		t.Fatalf("far world once rebalanced: %+v", rb)
	}
	// Instances of non-zero optimal cost: LARP's own placements are where it would go.
	for seed := uint64(0); seed < 8; seed++ {
		mu := compileUnplaced(t, genPlaceTopology(seed, placeGenConfig{nodes: 5, services: 4, replicas: 4, slack: 2}))
		pl, err := Place(mu, LARP)
		if err != nil {
			t.Fatal(err)
		}
		m := compilePlaced(t, pl.Apply(mu.Topology))
		rb := mustRebalance(t, m, RebalanceOptions{})
		if len(rb.Moves)+len(rb.Blocked) != 0 || rb.CostTarget != rb.CostBefore || rb.CostBefore != pl.Cost {
			t.Fatalf("seed %d: LARP placement (cost %v) rebalanced: %+v", seed, pl.Cost, rb)
		}
	}
}

// TestRebalanceFewestMoves: two mirror-image pairs of nodes; the optimum puts everything in one
// pair, either one. The current placement is one move from the pair LARP does not choose.
func TestRebalanceFewestMoves(t *testing.T) {
	world := func(front, back []string) *Topology {
		return rebalanceWorld(map[string]int64{}, []string{"p1", "p2", "q1", "q2"},
			map[[2]string]float64{{"p1", "p2"}: 1, {"q1", "q2"}: 1, {"p1", "q1"}: 20, {"p1", "q2"}: 20, {"p2", "q1"}: 20, {"p2", "q2"}: 20},
			map[string][]string{"front": front, "back": back}, []string{"front", "back"}, [][2]string{{"front", "back"}})
	}
	base := compilePlaced(t, world([]string{"p1", "p2"}, []string{"p1", "p2"}))
	pl, err := Place(base, LARP)
	if err != nil {
		t.Fatal(err)
	}
	other, mirror := "p", "q1"
	if strings.HasPrefix(pl.Placement["front-0"], "p") {
		other, mirror = "q", "p1"
	}
	// Front on the pair LARP does not choose, back half there and half in the other pair.
	m := compilePlaced(t, world([]string{other + "1", other + "2"}, []string{other + "1", mirror}))
	if moves := classMoves(m, pl.Placement); moves < 2 {
		t.Fatalf("LARP's placement %v is only %d moves away: the test proves nothing", pl.Placement, moves)
	}
	rb := mustRebalance(t, m, RebalanceOptions{})
	checkRebalance(t, "mirror", m, rb)
	// back-1 → other2 or front-1 → mirror: either way one move to a co-located layout.
	if len(rb.Moves) != 1 || len(rb.Blocked) != 0 || rb.CostTarget != pl.Cost {
		t.Fatalf("want one move to cost %v: %+v", pl.Cost, rb)
	}
}

// TestRebalanceTolerance: with a tolerance covering the whole gain, the current placement (no
// move) wins; with the default, the instance moves.
func TestRebalanceTolerance(t *testing.T) {
	tried := 0
	for seed := uint64(0); seed < 40 && tried < 5; seed++ {
		mu := compileUnplaced(t, genPlaceTopology(seed, placeGenConfig{nodes: 5, services: 4, replicas: 4, slack: 2}))
		cur := randomFeasible(rand.New(rand.NewPCG(seed, 3)), mu)
		if cur == nil {
			continue
		}
		m := compilePlaced(t, cur.Apply(mu.Topology))
		tight := mustRebalance(t, m, RebalanceOptions{})
		if len(tight.Moves) == 0 || !(tight.CostTarget > 0) {
			continue
		}
		tried++
		loose := mustRebalance(t, m, RebalanceOptions{Tolerance: 1e9})
		if len(loose.Moves)+len(loose.Blocked) != 0 || loose.CostTarget != loose.CostBefore {
			t.Fatalf("seed %d: with an unbounded tolerance the current placement (0 moves) must win: %+v", seed, loose)
		}
		// Just under the gain the default target got: the current placement is out.
		gain := tight.CostBefore/tight.CostTarget - 1
		under := mustRebalance(t, m, RebalanceOptions{Tolerance: gain * 0.999})
		if len(under.Moves) == 0 || under.CostTarget > tight.CostTarget*(1+gain*0.999) {
			t.Fatalf("seed %d: tolerance %v: %+v", seed, gain*0.999, under)
		}
	}
	if tried == 0 {
		t.Fatal("no instance with moves")
	}
	if _, err := PlanRebalance(compilePlaced(t, farWorld()), RebalanceOptions{Tolerance: -1}); err == nil {
		t.Fatal("negative tolerance accepted")
	}
}

// TestRebalanceResources: x and y are full (two pods of 500m in 1000m). A swap between them is
// blocked; a move into x waits until a pod has left it.
func TestRebalanceResources(t *testing.T) {
	calls := [][2]string{{"a", "b"}, {"c", "d"}}
	svcs := []string{"a", "b", "c", "d"}
	t.Run("swap", func(t *testing.T) {
		m := compilePlaced(t, rebalanceWorld(map[string]int64{"x": 1000, "y": 1000}, []string{"x", "y"},
			map[[2]string]float64{{"x", "y"}: 10},
			map[string][]string{"a": {"x"}, "b": {"y"}, "c": {"y"}, "d": {"x"}}, svcs, calls))
		rb := mustRebalance(t, m, RebalanceOptions{})
		checkRebalance(t, "swap", m, rb)
		if len(rb.Moves) != 0 || len(rb.Blocked) != 2 || rb.CostTarget != 0 || rb.CostBefore == 0 {
			t.Fatalf("want the swap blocked: %+v", rb)
		}
	})
	t.Run("order", func(t *testing.T) {
		// y has room for one pod only; z is empty.
		m := compilePlaced(t, rebalanceWorld(map[string]int64{"x": 1000, "y": 500, "z": 1000}, []string{"x", "y", "z"},
			map[[2]string]float64{{"x", "y"}: 10, {"x", "z"}: 10, {"y", "z"}: 10},
			map[string][]string{"a": {"x"}, "b": {"y"}, "c": {"z"}, "d": {"x"}}, svcs, calls))
		rb := mustRebalance(t, m, RebalanceOptions{})
		checkRebalance(t, "order", m, rb)
		want := []Move{{Service: "d", Pod: "d-0", From: "x", To: "z", CostAfter: 1000}, {Service: "b", Pod: "b-0", From: "y", To: "x", CostAfter: 0}}
		if !reflect.DeepEqual(rb.Moves, want) || len(rb.Blocked) != 0 {
			t.Fatalf("moves %+v blocked %+v, want %+v", rb.Moves, rb.Blocked, want)
		}
	})
}

// TestRebalanceOverCap: live clusters break the spread cap; the plan still ends feasible.
func TestRebalanceOverCap(t *testing.T) {
	m := compilePlaced(t, rebalanceWorld(map[string]int64{}, []string{"a", "b", "c"},
		map[[2]string]float64{{"a", "b"}: 1, {"a", "c"}: 30, {"b", "c"}: 30},
		map[string][]string{"front": {"c", "c", "c", "c"}, "back": {"c", "c", "c", "a"}},
		[]string{"front", "back"}, [][2]string{{"front", "back"}}))
	rb := mustRebalance(t, m, RebalanceOptions{})
	checkRebalance(t, "over cap", m, rb)
	// Fewest: two front pods and one back pod leave c for a (LARP from scratch needs more).
	if len(rb.Moves) != 3 || len(rb.Blocked) != 0 || rb.CostTarget != 0 {
		t.Fatalf("4 of 4 front pods on c (cap 2): %+v", rb)
	}
}

func TestRebalanceRejectsUnplaced(t *testing.T) {
	top := farWorld()
	top.Services[1].Pods[2].Node = ""
	m, err := Compile(top, Options{Unplaced: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = PlanRebalance(m, RebalanceOptions{})
	if !errors.Is(err, ErrInvalidTopology) || !strings.Contains(err.Error(), `"back-2"`) {
		t.Fatalf("err = %v, want ErrInvalidTopology naming back-2", err)
	}
}

// randomFeasible puts the pods of m on random nodes within cpu, memory and the spread cap
// (nil if it gets stuck).
func randomFeasible(r *rand.Rand, m *Model) *Placement {
	n := len(m.Nodes)
	usedC, usedM := make([]int64, n), make([]int64, n)
	out := &Placement{Placement: map[string]string{}}
	for _, sm := range m.Services {
		spread := (len(sm.Pods) + n - 1) / n
		per := make([]int, n)
		for _, p := range sm.Pods {
			var ok []int
			for u, node := range m.Nodes {
				if per[u] < spread && (node.CPU == 0 || usedC[u]+sm.CPU <= node.CPU) && (node.Memory == 0 || usedM[u]+sm.Mem <= node.Memory) {
					ok = append(ok, u)
				}
			}
			if len(ok) == 0 {
				return nil
			}
			u := ok[r.IntN(len(ok))]
			per[u]++
			usedC[u], usedM[u] = usedC[u]+sm.CPU, usedM[u]+sm.Mem
			out.Placement[p.Name] = m.Nodes[u].Name
		}
	}
	return out
}

// TestRebalanceProperties: on random instances with tight resources and random feasible
// current placements, every prefix of the plan is feasible and costs its CostAfter, the target
// is no worse than the current placement and no more moves away than Place's LARP placement.
func TestRebalanceProperties(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 40
	}
	var withMoves, withBlocked int
	for seed := uint64(0); seed < uint64(seeds); seed++ {
		label := fmt.Sprintf("seed %d", seed)
		mu := compileUnplaced(t, genPlaceTopology(seed, placeGenConfig{nodes: 6, services: 5, replicas: 5, slack: 1.25 + float64(seed%4)/4}))
		r := rand.New(rand.NewPCG(seed, 7))
		cur := randomFeasible(r, mu)
		if cur == nil {
			continue
		}
		m := compilePlaced(t, cur.Apply(mu.Topology))
		rb := mustRebalance(t, m, RebalanceOptions{})
		checkRebalance(t, label, m, rb)
		if rb.CostTarget > rb.CostBefore*(1+1e-9) {
			t.Fatalf("%s: target cost %v above the current %v", label, rb.CostTarget, rb.CostBefore)
		}
		pl, err := Place(m, LARP)
		if err != nil {
			t.Fatalf("%s: Place: %v", label, err)
		}
		if got, larp := len(rb.Moves)+len(rb.Blocked), classMoves(m, pl.Placement); got > larp {
			t.Fatalf("%s: %d moves, LARP's placement is %d away", label, got, larp)
		}
		if len(rb.Moves) > 0 {
			withMoves++
		}
		if len(rb.Blocked) > 0 {
			withBlocked++
		}
	}
	t.Logf("%d of %d instances with moves, %d with blocked moves", withMoves, seeds, withBlocked)
	if withMoves < seeds/2 {
		t.Fatalf("only %d instances with moves: the generator tests little", withMoves)
	}
}

// TestRebalanceRandomOverCap: gen_test's pods sit on random nodes, mostly over the spread cap.
func TestRebalanceRandomOverCap(t *testing.T) {
	for seed := uint64(0); seed < 40; seed++ {
		m := compilePlaced(t, genTopology(seed, genConfig{nodes: 4, services: 4, maxPods: 6, extraCalls: 2, weights: seed%2 == 0}))
		rb := mustRebalance(t, m, RebalanceOptions{})
		checkRebalance(t, fmt.Sprintf("seed %d", seed), m, rb)
	}
}

// TestRebalanceDeterministic: the same plan for any GOMAXPROCS, and from concurrent calls.
func TestRebalanceDeterministic(t *testing.T) {
	for seed := uint64(0); seed < 6; seed++ {
		mu := compileUnplaced(t, genPlaceTopology(seed, placeGenConfig{nodes: 8, services: 6, replicas: 6, slack: 1.5}))
		cur := randomFeasible(rand.New(rand.NewPCG(seed, 9)), mu)
		if cur == nil {
			continue
		}
		m := compilePlaced(t, cur.Apply(mu.Topology))
		prev := runtime.GOMAXPROCS(1)
		want := mustRebalance(t, m, RebalanceOptions{})
		runtime.GOMAXPROCS(prev)
		got := make([]*Rebalance, 4)
		var wg sync.WaitGroup
		for i := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i], _ = PlanRebalance(m, RebalanceOptions{})
			}()
		}
		wg.Wait()
		for i, g := range got {
			if !reflect.DeepEqual(g, want) {
				t.Fatalf("seed %d: run %d differs from the GOMAXPROCS=1 run:\n%+v\n%+v", seed, i, g, want)
			}
		}
	}
}

// BenchmarkPlanRebalance plans the large instance of BenchmarkPlace from its k8s-spread
// placement (what the default scheduler leaves) and reports the moves and the cost reached
// relative to the start.
func BenchmarkPlanRebalance(b *testing.B) {
	mu, err := Compile(genPlaceTopology(1, largePlaceConfig), Options{Unplaced: true})
	if err != nil {
		b.Fatal(err)
	}
	spread, err := Place(mu, K8sSpread)
	if err != nil {
		b.Fatal(err)
	}
	m, err := Compile(spread.Apply(mu.Topology), Options{})
	if err != nil {
		b.Fatal(err)
	}
	var rb *Rebalance
	b.ReportAllocs()
	for b.Loop() {
		if rb, err = PlanRebalance(m, RebalanceOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(rb.Moves)), "moves")
	b.ReportMetric(float64(len(rb.Blocked)), "blocked")
	b.ReportMetric(rb.CostTarget/rb.CostBefore, "cost/before")
}

// TestRebalanceNamespaced: moves and Target name pods and services by their keys (POD.NS,
// NAME.NS), and the target applies to the topology.
func TestRebalanceNamespaced(t *testing.T) {
	top := &Topology{
		Nodes:   []Node{{Name: "a"}, {Name: "b"}},
		Latency: []Latency{{From: "a", To: "b", MS: 5}},
		Services: []Service{
			{Name: "x", Namespace: "shop", Pods: []Pod{{Name: "x-0", Node: "a"}}},
			{Name: "y", Namespace: "shop", Pods: []Pod{{Name: "y-0", Node: "b"}}},
		},
		Calls:   []Call{{From: "x.shop", To: "y.shop"}},
		Ingress: []Ingress{{Service: "x.shop", RPS: 10}},
	}
	m := compilePlaced(t, top)
	rb := mustRebalance(t, m, RebalanceOptions{})
	checkRebalance(t, "namespaced", m, rb)
	if len(rb.Moves) != 1 || !strings.HasSuffix(rb.Moves[0].Pod, ".shop") || !strings.HasSuffix(rb.Moves[0].Service, ".shop") {
		t.Fatalf("%+v", rb)
	}
	applied := rb.Placement().Apply(top)
	if a, b := applied.Services[0].Pods[0].Node, applied.Services[1].Pods[0].Node; a != b {
		t.Fatalf("applied target: x-0 on %s, y-0 on %s", a, b)
	}
}

// A budget that runs out at once still gives a valid plan (never worse than staying), and
// says it was cut short; without a budget nothing is cut.
func TestRebalanceBudget(t *testing.T) {
	m := compilePlaced(t, farWorld())
	if rb := mustRebalance(t, m, RebalanceOptions{}); rb.Truncated {
		t.Errorf("no budget, yet truncated")
	}
	rb := mustRebalance(t, m, RebalanceOptions{Budget: time.Nanosecond})
	checkRebalance(t, "budget 1ns", m, rb)
	if !rb.Truncated {
		t.Errorf("a 1 ns budget did not cut the search")
	}
	if rb.CostTarget > rb.CostBefore*(1+1e-9) {
		t.Errorf("cut plan %v is worse than staying (%v)", rb.CostTarget, rb.CostBefore)
	}
}

// The previous plan's target steers the plan among equally cheap ones: a on n1 and b on n3,
// every pair 10 ms apart, can meet on n1 or on n3 (one move either way, cost 0). Without a
// previous target the plan picks one; with the other as Previous it heads there instead. A
// previous target that no longer fits (a replica more, a node gone) is ignored.
func TestRebalancePrevious(t *testing.T) {
	nodes := map[string]int64{"n1": 0, "n2": 0, "n3": 0, "n4": 0}
	order := []string{"n1", "n2", "n3", "n4"}
	lat := map[[2]string]float64{}
	for i, a := range order {
		for _, b := range order[i+1:] {
			lat[[2]string{a, b}] = 10
		}
	}
	m := compilePlaced(t, rebalanceWorld(nodes, order, lat, map[string][]string{"a": {"n1"}, "b": {"n3"}},
		[]string{"a", "b"}, [][2]string{{"a", "b"}}))
	free := mustRebalance(t, m, RebalanceOptions{})
	if len(free.Moves) != 1 || free.CostTarget != 0 {
		t.Fatalf("without a previous target: moves %+v, cost %v; want one move to cost 0", free.Moves, free.CostTarget)
	}
	meet := free.Moves[0].To
	other := map[string]string{"n1": "n3", "n3": "n1"}[meet]
	want := map[string]map[string]int{"a": {other: 1}, "b": {other: 1}}
	if !reflect.DeepEqual(free.TargetCounts, map[string]map[string]int{"a": {meet: 1}, "b": {meet: 1}}) {
		t.Fatalf("TargetCounts %v, want a and b on %s", free.TargetCounts, meet)
	}
	steered := mustRebalance(t, m, RebalanceOptions{Previous: want})
	if len(steered.Moves) != 1 || steered.Moves[0].To != other || steered.CostTarget != 0 {
		t.Fatalf("with Previous %v: moves %+v, cost %v; want one move to %s", want, steered.Moves, steered.CostTarget, other)
	}
	for _, stale := range []map[string]map[string]int{
		{"a": {other: 2}, "b": {other: 1}}, // a has one pod
		{"a": {"n9": 1}, "b": {"n9": 1}},   // no node n9
		{"a": {other: 1}},                  // b missing
	} {
		got := mustRebalance(t, m, RebalanceOptions{Previous: stale})
		if len(got.Moves) != 1 || got.Moves[0].To != meet {
			t.Errorf("with a previous target that does not fit (%v): moves %+v, want the plan without it (to %s)", stale, got.Moves, meet)
		}
	}
}

// PreviousTolerance keeps the previous target against a cheaper one within it: a has a pod on
// every node (the spread cap pins them), b one pod on n4; b is cheapest on n1 (Σ RTT from a's
// pods 30 ms), 3 % dearer on n2 (31 ms). With b on n2 as the previous target, a 5 % tolerance
// keeps it and the default (1 %) does not; a previous target 33 % dearer (n3) is dropped.
func TestRebalancePreviousTolerance(t *testing.T) {
	nodes := map[string]int64{"n1": 0, "n2": 0, "n3": 0, "n4": 0}
	order := []string{"n1", "n2", "n3", "n4"}
	lat := map[[2]string]float64{{"n1", "n2"}: 10, {"n1", "n3"}: 10, {"n1", "n4"}: 10, {"n2", "n3"}: 10, {"n2", "n4"}: 11, {"n3", "n4"}: 20}
	m := compilePlaced(t, rebalanceWorld(nodes, order, lat, map[string][]string{"a": {"n1", "n2", "n3", "n4"}, "b": {"n4"}},
		[]string{"a", "b"}, [][2]string{{"a", "b"}}))
	all := map[string]int{"n1": 1, "n2": 1, "n3": 1, "n4": 1}
	for _, tc := range []struct {
		prevB string
		tol   float64
		want  string
	}{
		{"", 0.05, "n1"},
		{"n2", 0, "n1"},
		{"n2", 0.05, "n2"},
		{"n3", 0.05, "n1"},
	} {
		opt := RebalanceOptions{PreviousTolerance: tc.tol}
		if tc.prevB != "" {
			opt.Previous = map[string]map[string]int{"a": all, "b": {tc.prevB: 1}}
		}
		rb := mustRebalance(t, m, opt)
		if len(rb.Moves) != 1 || rb.Moves[0].Service != "b" || rb.Moves[0].To != tc.want {
			t.Errorf("previous b on %q, tolerance %v: moves %+v, want b to %s", tc.prevB, tc.tol, rb.Moves, tc.want)
		}
	}
}
