package optimizer

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/edgeflow/edgeflow/examples"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// withCapacities gives services (not the first, and each with probability ½) pod service rates
// so that the service's load is 1/headroom of its capped capacity, and sometimes ingress of its
// own (a background load). Rates are per pod when perPod, else per service (times weight).
func withCapacities(t *testing.T, top *Topology, seed uint64, headroom func(r *rand.Rand) float64, perPod bool) *Topology {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	top = top.Clone()
	chosen := map[int]bool{}
	for s := 1; s < len(top.Services); s++ {
		if r.IntN(2) == 0 {
			chosen[s] = true
			if r.IntN(3) == 0 {
				top.Ingress = append(top.Ingress, Ingress{Service: top.Services[s].Name, RPS: math.Round(1 + r.Float64()*50)})
			}
		}
	}
	m, err := Compile(top, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for s := range len(top.Services) { // in order: the draws below make the instance
		if !chosen[s] {
			continue
		}
		sm := &m.Services[s]
		base := sm.Load / (DefaultUtilizationCap * sm.TotalWeight()) * headroom(r)
		if !perPod {
			v := base
			top.Services[s].CapacityRPS = &v
			continue
		}
		mus := make([]float64, len(sm.Pods))
		var total float64
		for i, p := range sm.Pods {
			bg := sm.Ingress * p.Weight / sm.TotalWeight()
			mus[i] = max(base*p.Weight*(0.5+1.5*r.Float64()), 1.2*bg/DefaultUtilizationCap, 1e-3)
			total += mus[i]
		}
		if need := sm.Load / DefaultUtilizationCap * 1.01; total < need {
			for i := range mus {
				mus[i] *= need / total
			}
		}
		for i := range mus {
			v := mus[i]
			top.Services[s].Pods[i].CapacityRPS = &v
		}
	}
	return top
}

// flowLoads returns every pod's load when the requests follow a's fractions: ingress by
// weight, and each caller pod sends what it receives times the edge's rate, in topological
// order (independently of the routes' rps).
func flowLoads(m *Model, a *Allocation) map[string]float64 {
	load := map[string]float64{}
	for _, s := range m.Order {
		svc := &m.Services[s]
		for _, p := range svc.Pods {
			load[p.Name] += svc.Ingress * p.Weight / svc.TotalWeight()
		}
		for k, e := range m.Calls {
			if e.From != s {
				continue
			}
			for _, r := range a.Calls[k].Routes {
				load[r.Callee] += load[r.Caller] * e.Rate * r.Fraction
			}
		}
	}
	return load
}

// objective is lata-q's objective of a, exactly: Σ rps × latency over the routes, at the loads
// of requests following the fractions, plus 1000·ℓ/(μ−ℓ) for every pod of a service with a
// service rate that a does not list as saturated (+Inf if a pod is at or past its μ).
func objective(m *Model, a *Allocation) float64 {
	load := flowLoads(m, a)
	var total float64
	for k, c := range a.Calls {
		for _, r := range c.Routes {
			total += load[r.Caller] * m.Calls[k].Rate * r.Fraction * r.LatencyMS
		}
	}
	for _, svc := range m.Services {
		if !hasCapacity(&svc) || slices.ContainsFunc(a.Saturated, func(why string) bool { return strings.Contains(why, fmt.Sprintf("service %q", svc.Name)) }) {
			continue
		}
		for _, q := range svc.Pods {
			if q.Weight == 0 {
				continue
			}
			if load[q.Name] >= q.CapacityRPS {
				return math.Inf(1)
			}
			total += queueCost(load[q.Name], q.CapacityRPS)
		}
	}
	return total
}

// queuedEdges is edges for a lata-q allocation: each caller pod supplies what the requests
// following the fractions load it with (flowLoads), not its share by weight. lata-q takes a
// service that lata serves from callers loaded by weight at its shares by weight, which lata
// meets within its rounding (1e-6 relative, see checkBalanced): the rps are held to that.
func queuedEdges(m *Model, a *Allocation) []edgeView {
	load := flowLoads(m, a)
	vs := edges(m, a)
	for i := range vs {
		v := &vs[i]
		v.rpsTol = 1e-6
		for _, p := range v.callers {
			v.supply[p.Name] = load[p.Name] * v.e.Rate
		}
	}
	return vs
}

// podLoads returns every callee pod's load under a: ingress by weight plus its routes' rps.
func podLoads(m *Model, a *Allocation) map[string]float64 {
	load := map[string]float64{}
	for _, s := range m.Services {
		for _, p := range s.Pods {
			load[p.Name] = s.Ingress * p.Weight / s.TotalWeight()
		}
	}
	for _, c := range a.Calls {
		for _, r := range c.Routes {
			load[r.Callee] += r.RPS
		}
	}
	return load
}

// linearQueue is the linearised queueing cost above the background, at load ℓ.
func linearQueue(p PodRef, bg, load float64, cap float64, res int) float64 {
	var c float64
	x := bg
	for _, s := range queueSegments(0, podQueue{mu: p.CapacityRPS}, bg, cap, res) {
		c += s.slope * math.Max(0, math.Min(s.width, load-x))
		x += s.width
	}
	return c
}

// queuedOptimum solves service b's linearised lata-q problem with gonum's dense simplex: flows
// f(piece, pod), segment loads y ≤ width (slack z), each pod's inflow = Σ its y.
func queuedOptimum(t *testing.T, m *Model, b int, load map[string]float64) (opt, rps float64) {
	t.Helper()
	svc := &m.Services[b]
	type piece struct {
		node int
		rps  float64
	}
	var pieces []piece
	for _, e := range m.Calls {
		if e.To != b {
			continue
		}
		a := &m.Services[e.From]
		for _, p := range a.Pods {
			if x := load[p.Name] * e.Rate; x > 0 {
				pieces = append(pieces, piece{p.Node, x})
				rps += x
			}
		}
	}
	var pods []int
	var segs [][]queueSegment
	for q, p := range svc.Pods {
		if p.Weight > 0 {
			pods = append(pods, q)
			segs = append(segs, queueSegments(q, podQueue{mu: p.CapacityRPS}, svc.Ingress*p.Weight/svc.TotalWeight(), m.UtilizationCap, m.queueResolution()))
		}
	}
	nf := len(pieces) * len(pods)
	ns := 0
	for _, s := range segs {
		ns += len(s)
	}
	vars := nf + 2*ns
	rows := len(pieces) + len(pods) + ns
	A := mat.NewDense(rows, vars, nil)
	bv := make([]float64, rows)
	c := make([]float64, vars)
	for i, pc := range pieces {
		bv[i] = pc.rps
		for k, q := range pods {
			c[i*len(pods)+k] = m.Latency.At(pc.node, svc.Pods[q].Node)
			A.Set(i, i*len(pods)+k, 1)
			A.Set(len(pieces)+k, i*len(pods)+k, 1)
		}
	}
	col := nf
	row := len(pieces) + len(pods)
	for k := range pods {
		for _, s := range segs[k] {
			c[col] = s.slope
			A.Set(len(pieces)+k, col, -1)
			A.Set(row, col, 1)
			A.Set(row, col+ns, 1)
			bv[row] = s.width
			col++
			row++
		}
	}
	opt, _, err := lp.Simplex(c, A, bv, 1e-10, nil)
	if err != nil {
		t.Fatalf("lp oracle on %s: %v", svc.Name, err)
	}
	return opt, rps
}

// TestLATAQOptimal checks lata-q on random instances against an LP of the linearised problem
// (each callee service's, fed by its callers' planned loads), and that every caller's
// fractions sum to 1, the routes' rps are what the requests following the fractions really
// send, and no pod is loaded past its cap.
func TestLATAQOptimal(t *testing.T) {
	shapes := []genConfig{
		{nodes: 3, services: 3, maxPods: 3},
		{nodes: 4, services: 4, maxPods: 3, weights: true, extraCalls: 2},
		{nodes: 3, services: 4, maxPods: 3, weights: true, fractional: true, extraCalls: 2},
		{nodes: 2, services: 3, maxPods: 3, ties: true},
	}
	instances := 400
	if testing.Short() {
		instances = 40
	}
	var checked, asLATA int
	for seed := uint64(0); seed < uint64(instances); seed++ {
		shape := shapes[seed%uint64(len(shapes))]
		headroom := func(r *rand.Rand) float64 { return 1.02 + r.Float64()*4 }
		top := withCapacities(t, genTopology(seed, shape), seed, headroom, seed%2 == 1)
		m, err := Compile(top, Options{})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		// A coarser linearisation keeps the dense LP small; the solve is the same code.
		m.resolution = 5 + int(seed%3)*5
		served, err := Plan(m, LATAQ)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		lata, err := Plan(m, LATA)
		if err != nil {
			t.Fatal(err)
		}
		// What Plan serves is never worse than lata in lata-q's exact objective, and is lata's
		// when it says so.
		if q, l := objective(m, served), objective(m, lata); q > l*(1+1e-9) {
			t.Fatalf("seed %d: lata-q serves a plan of objective %v, lata's is %v", seed, q, l)
		}
		if served.ServedAsLATA {
			asLATA++
			if !reflect.DeepEqual(served.Calls, lata.Calls) {
				t.Fatalf("seed %d: served as lata, but not lata's routes", seed)
			}
		}
		// The rest checks lata-q's own plan, whether served or not.
		_, st, _, err := planFrom(m, LATAQ, nil)
		if err != nil {
			t.Fatal(err)
		}
		a := &Allocation{Policy: LATAQ, Calls: st.raw}
		for _, v := range queuedEdges(m, a) {
			checkFractions(t, "lata-q", v)
		}
		load := flowLoads(m, a)
		for name, l := range podLoads(m, a) {
			if math.Abs(l-load[name]) > 1e-6*(1+load[name]) {
				t.Fatalf("seed %d: pod %s: the routes' rps load it with %v, the requests following the fractions with %v", seed, name, l, load[name])
			}
		}
		for b := range m.Services {
			svc := &m.Services[b]
			if !hasCapacity(svc) {
				continue
			}
			var latency float64
			for k, e := range m.Calls {
				if e.To == b {
					latency += a.Calls[k].Cost
				}
			}
			var queue float64
			for _, p := range svc.Pods {
				if p.Weight == 0 {
					continue
				}
				if capLoad := m.UtilizationCap * p.CapacityRPS; load[p.Name] > capLoad*(1+1e-6) {
					t.Fatalf("seed %d: pod %s load %v past its cap %v", seed, p.Name, load[p.Name], capLoad)
				}
				queue += linearQueue(p, svc.Ingress*p.Weight/svc.TotalWeight(), load[p.Name], m.UtilizationCap, m.queueResolution())
			}
			opt, rps := queuedOptimum(t, m, b, load)
			if rps == 0 {
				continue
			}
			checked++
			got := latency + queue
			tol := 1e-6*(1+opt) + 1.5*CostQuantumMS*rps
			if got > opt+tol || got < opt-tol {
				t.Fatalf("seed %d service %s: lata-q costs %v (latency %v + linearised queue %v), LP optimum %v", seed, svc.Name, got, latency, queue, opt)
			}
		}
	}
	t.Logf("%d services checked against gonum's LP simplex; lata's plan served on %d of %d instances", checked, asLATA, instances)
	if checked < instances/2 {
		t.Fatalf("only %d services checked; the generator drifted", checked)
	}
}

// twoTier is a caller service with pods on every node calling a callee service with one pod on
// each of the first k nodes, each of service rate mu, ingress rps into the caller.
func twoTier(seed uint64, nodes, k int, mu, rps float64) *Topology {
	top := genTopology(seed, genConfig{nodes: nodes, services: 2, maxPods: 1})
	top.Services[0].Pods = nil
	for u := range nodes {
		top.Services[0].Pods = append(top.Services[0].Pods, Pod{Name: "a-" + top.Nodes[u].Name, Node: top.Nodes[u].Name})
	}
	top.Services[1].Pods = nil
	for u := range k {
		top.Services[1].Pods = append(top.Services[1].Pods, Pod{Name: "b-" + top.Nodes[u].Name, Node: top.Nodes[u].Name})
	}
	top.Services[1].CapacityRPS = ptr(mu)
	top.Ingress = []Ingress{{Service: top.Services[0].Name, RPS: rps}}
	top.Calls[0].Rate = nil
	return top
}

// TestLATAQIdle: far below capacity, every caller sends everything to its nearest callee pod
// (of equal μ), as localization does.
func TestLATAQIdle(t *testing.T) {
	for seed := uint64(0); seed < 50; seed++ {
		m, err := Compile(twoTier(seed, 6, 3, 1e6, 1), Options{})
		if err != nil {
			t.Fatal(err)
		}
		a, err := Plan(m, LATAQ)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range queuedEdges(m, a) {
			checkFractions(t, "lata-q", v)
			for _, r := range v.call.Routes {
				best := math.Inf(1)
				for _, q := range v.callees {
					best = math.Min(best, m.Latency.At(v.node[r.Caller], q.Node))
				}
				if got := m.Latency.At(v.node[r.Caller], v.node[r.Callee]); got > best+CostQuantumMS {
					t.Fatalf("seed %d: %s sends %v to %s at %v ms; its nearest callee is at %v ms", seed, r.Caller, r.Fraction, r.Callee, got, best)
				}
			}
		}
	}
}

// TestLATAQSaturated: at the cap (load = cap·Σμ, μ ∝ weight) every pod is at its cap, which is
// lata's share, and the latency cost is lata's.
func TestLATAQSaturated(t *testing.T) {
	for seed := uint64(0); seed < 50; seed++ {
		// A chain: each callee service has one incoming edge, so its pod loads are that edge's.
		top := genTopology(seed, genConfig{nodes: 4, services: 3, maxPods: 5, weights: true, fractional: seed%2 == 1})
		m0, err := Compile(top, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for s := 1; s < len(top.Services); s++ {
			top.Services[s].CapacityRPS = ptr(m0.Services[s].Load / (DefaultUtilizationCap * m0.Services[s].TotalWeight()))
		}
		m, err := Compile(top, Options{})
		if err != nil {
			t.Fatal(err)
		}
		q, err := Plan(m, LATAQ)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		l, err := Plan(m, LATA)
		if err != nil {
			t.Fatal(err)
		}
		var rps float64
		for _, v := range queuedEdges(m, q) {
			checkFractions(t, "lata-q", v)
			checkBalanced(t, "lata-q", v) // lata's shares, within 1e-6
			for _, s := range v.supply {
				rps += s
			}
		}
		if tol := 1e-6*(1+l.Cost) + 1.5*CostQuantumMS*rps; math.Abs(q.Cost-l.Cost) > tol {
			t.Fatalf("seed %d: saturated lata-q latency cost %v, lata %v", seed, q.Cost, l.Cost)
		}
	}
}

// TestLATAQWithoutCapacityIsLATA: with no capacity_rps, lata-q is lata, bit for bit.
func TestLATAQWithoutCapacityIsLATA(t *testing.T) {
	m, err := Compile(genTopology(11, genConfig{nodes: 5, services: 6, maxPods: 5, weights: true, extraCalls: 4}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	q, err := Plan(m, LATAQ)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Plan(m, LATA)
	if err != nil {
		t.Fatal(err)
	}
	if q.Cost != l.Cost || q.QueueCost != 0 {
		t.Fatalf("lata-q cost %v queue %v, lata %v", q.Cost, q.QueueCost, l.Cost)
	}
	for k := range l.Calls {
		a, b := l.Calls[k].Routes, q.Calls[k].Routes
		if len(a) != len(b) {
			t.Fatalf("edge %d: %d routes, lata %d", k, len(b), len(a))
		}
		for j := range a {
			if a[j] != b[j] {
				t.Fatalf("edge %d route %d: %+v, lata %+v", k, j, b[j], a[j])
			}
		}
	}
}

// TestLATAQCap: the cap holds for any cap, and a load beyond cap·Σμ is an error naming the
// service, wrapping ErrInvalidTopology.
func TestLATAQCap(t *testing.T) {
	for _, capU := range []float64{0.5, 0.8, 0.95} {
		// 3 callee pods of μ = 100: capped capacity 300·cap; the load is 99 % of it.
		top := twoTier(1, 6, 3, 100, 0.99*300*capU)
		m, err := Compile(top, Options{UtilizationCap: capU})
		if err != nil {
			t.Fatal(err)
		}
		a, err := Plan(m, LATAQ)
		if err != nil {
			t.Fatal(err)
		}
		for name, l := range flowLoads(m, a) {
			if strings.HasPrefix(name, "b-") && l > capU*100*(1+1e-6) {
				t.Fatalf("cap %v: pod %s at %v rps, past %v", capU, name, l, capU*100)
			}
		}
		if !(a.QueueCost > 0) {
			t.Fatalf("cap %v: queue cost %v", capU, a.QueueCost)
		}
		over := twoTier(1, 6, 3, 100, 1.01*300*capU)
		m, err = Compile(over, Options{UtilizationCap: capU})
		if err != nil {
			t.Fatal(err)
		}
		// Past the cap lata-q cannot keep every pod under it: the service is served as lata
		// (its saturated limit) and named in Saturated.
		got, err := Plan(m, LATAQ)
		if err != nil {
			t.Fatalf("cap %v, load past it: %v", capU, err)
		}
		if len(got.Saturated) != 1 || !strings.Contains(got.Saturated[0], `service "s1"`) {
			t.Fatalf("cap %v, load past it: saturated %q, want service s1", capU, got.Saturated)
		}
		lata, err := Plan(m, LATA)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.Calls, lata.Calls) {
			t.Fatalf("cap %v, load past it: the saturated service is not served as lata", capU)
		}
	}
}

func TestCompileCapacity(t *testing.T) {
	cases := []struct {
		name string
		edit func(top *Topology)
		want string // "" for valid
	}{
		{"service", func(top *Topology) { top.Services[1].CapacityRPS = ptr(50.0) }, ""},
		{"pods", func(top *Topology) {
			for i := range top.Services[1].Pods {
				top.Services[1].Pods[i].CapacityRPS = ptr(50.0)
			}
		}, ""},
		{"zero service", func(top *Topology) { top.Services[1].CapacityRPS = ptr(0.0) }, `service "s1": capacity_rps`},
		{"NaN pod", func(top *Topology) {
			top.Services[1].CapacityRPS = ptr(5.0)
			top.Services[1].Pods[0].CapacityRPS = ptr(math.NaN())
		}, `pod "b-n0" (service "s1"): capacity_rps`},
		{"infinite pod", func(top *Topology) {
			top.Services[1].CapacityRPS = ptr(5.0)
			top.Services[1].Pods[0].CapacityRPS = ptr(math.Inf(1))
		}, `pod "b-n0" (service "s1"): capacity_rps`},
		{"some pods only", func(top *Topology) { top.Services[1].Pods[0].CapacityRPS = ptr(5.0) }, `pod "b-n0" has capacity_rps but pod "b-n1" has none`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			top := twoTier(1, 3, 2, 1, 1)
			top.Services[1].CapacityRPS = nil
			c.edit(top)
			m, err := Compile(top, Options{})
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if mu := m.Services[1].Pods[1].CapacityRPS; mu != 50 {
					t.Fatalf("μ = %v, want 50", mu)
				}
				return
			}
			if !errors.Is(err, ErrInvalidTopology) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	if _, err := Compile(twoTier(1, 3, 2, 1, 1), Options{UtilizationCap: 1}); !errors.Is(err, ErrInvalidTopology) {
		t.Fatalf("utilization cap 1: error %v", err)
	}
}

// demoBookinfo is the bundled Bookinfo with the demo's pods: one worker, 6 ms mean service
// time, so μ = 1000/6 rps each.
func demoBookinfo(t *testing.T) *Topology {
	t.Helper()
	top, err := ParseTopology(bytes.NewReader(examples.Bookinfo()), "bookinfo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for i := range top.Services {
		top.Services[i].CapacityRPS = ptr(1000.0 / 6)
	}
	return top
}

// TestLATAQChainCap: on Bookinfo's chain productpage → reviews → ratings, with every pod at
// μ = 1000/6 rps (the demo's pods), the requests that follow the plan load no pod past its cap
// at any load up to the cap, and the routes' rps are those loads. Solving each callee service
// from its callers' shares by weight (not their planned loads) puts ratings-0 at 153 rps
// against a cap of 150 at 450 rps in.
func TestLATAQChainCap(t *testing.T) {
	top := demoBookinfo(t)
	for _, rps := range []float64{50, 150, 300, 450} {
		top.Ingress[0].RPS = rps
		m, err := Compile(top, Options{})
		if err != nil {
			t.Fatal(err)
		}
		a, err := Plan(m, LATAQ)
		if err != nil {
			t.Fatal(err)
		}
		if len(a.Saturated) > 0 {
			t.Fatalf("%v rps: saturated %q", rps, a.Saturated)
		}
		load := flowLoads(m, a)
		for name, l := range podLoads(m, a) {
			if math.Abs(l-load[name]) > 1e-6*(1+load[name]) {
				t.Fatalf("%v rps: pod %s: the routes' rps load it with %v, the requests following the fractions with %v", rps, name, l, load[name])
			}
		}
		for _, s := range m.Services {
			for _, p := range s.Pods {
				if capLoad := m.UtilizationCap * p.CapacityRPS; load[p.Name] > capLoad*(1+1e-6) {
					t.Fatalf("%v rps: pod %s at %.2f rps, past its cap %.2f", rps, p.Name, load[p.Name], capLoad)
				}
			}
		}
	}
}

// TestLATAQSaturatedByCapacity: a service whose load is past the utilisation cap of its
// measured capacity, with one pod slower than its peer (66 and 44 req/s, equal weights, 100 req/s
// at cap 0.9), is served by capacity — every pod at the same utilisation, 100/110 — not by weight,
// which would load the slow pod past its capacity (50 > 44); lata-q's plan is never lata's when
// lata overloads a pod more. With a third pod, so that the service fits under the cap, nothing is
// saturated and no pod is past the cap.
func TestLATAQSaturatedByCapacity(t *testing.T) {
	for seed := uint64(0); seed < 20; seed++ {
		top := twoTier(seed, 4, 2, 66, 100)
		top.Services[1].Pods[1].CapacityRPS = ptr(44.0)
		m, err := Compile(top, Options{UtilizationCap: 0.9})
		if err != nil {
			t.Fatal(err)
		}
		a, err := Plan(m, LATAQ)
		if err != nil {
			t.Fatal(err)
		}
		if len(a.Saturated) != 1 {
			t.Fatalf("seed %d: saturated %q, want the callee service", seed, a.Saturated)
		}
		load := flowLoads(m, a)
		for _, p := range top.Services[1].Pods {
			mu := 66.0
			if p.CapacityRPS != nil {
				mu = *p.CapacityRPS
			}
			if got, want := load[p.Name], 100*mu/110; math.Abs(got-want) > 0.5 {
				t.Errorf("seed %d: pod %s (μ %v) planned %.2f req/s, want %.2f (by capacity)", seed, p.Name, mu, got, want)
			}
		}
	}
}
