package optimizer

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestPodCPU(t *testing.T) {
	// One service, load 100 rps over two pods of weights 1 and 3: ℓ = 25 and 75.
	cases := []struct {
		name     string
		svcCap   *float64
		podCap   [2]*float64
		cpu      int64
		want     [2]float64
		ingress  float64
		weights  [2]float64
		wantLoad [2]float64
	}{
		{name: "no service rate: the request", cpu: 500, want: [2]float64{500, 500}},
		{name: "service rate × weight", svcCap: ptr(100.0), cpu: 500, want: [2]float64{500 * 25.0 / 100, 500 * 75.0 / 300}},
		{name: "pod rate overrides", svcCap: ptr(100.0), podCap: [2]*float64{ptr(50.0), nil}, cpu: 1000, want: [2]float64{1000 * 25.0 / 50, 1000 * 75.0 / 300}},
		{name: "saturated: at most the request", podCap: [2]*float64{ptr(10.0), ptr(150.0)}, cpu: 400, want: [2]float64{400, 400 * 75.0 / 150}},
		{name: "no request: none", svcCap: ptr(100.0), cpu: 0, want: [2]float64{0, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			top := &Topology{
				Nodes: []Node{{Name: "a", Cores: 2}},
				Services: []Service{{Name: "s", CPU: c.cpu, CapacityRPS: c.svcCap, Pods: []Pod{
					{Name: "s-0", Node: "a", Weight: ptr(1.0), CapacityRPS: c.podCap[0]},
					{Name: "s-1", Node: "a", Weight: ptr(3.0), CapacityRPS: c.podCap[1]},
				}}},
				Ingress: []Ingress{{Service: "s", RPS: 100}},
			}
			m, err := Compile(top, Options{})
			if err != nil {
				t.Fatal(err)
			}
			for k := range 2 {
				if got := m.PodCPU(0, k); math.Abs(got-c.want[k]) > 1e-9 {
					t.Errorf("pod %d: PodCPU %v, want %v", k, got, c.want[k])
				}
			}
			split, err := m.Split()
			if err != nil {
				t.Fatal(err)
			}
			if got, want := split.Nodes[0].Utilization, (c.want[0]+c.want[1])/2000; math.Abs(got-want) > 1e-12 {
				t.Errorf("utilisation %v, want %v", got, want)
			}
		})
	}
}

func TestQueueTerm(t *testing.T) {
	const cap = 0.9
	// Alone on its node (o = 0) below the cap: lata-q's M/M/1 term, 1000·ℓ/(μ−ℓ).
	for _, rho := range []float64{0, 0.1, 0.5, 0.89} {
		mu := 200.0
		if got, want := queueTerm(rho, 0, cap), queueCost(rho*mu, mu); math.Abs(got-want) > 1e-9*want {
			t.Errorf("rho %v: %v, want lata-q's %v", rho, got, want)
		}
	}
	// Shared cores: the rate scaled by 1 − o, so 1000·ℓ/(μ(1−o) − ℓ).
	if got, want := queueTerm(0.2, 0.5, cap), 1000*20/(100*0.5-20); math.Abs(got-want) > 1e-9 {
		t.Errorf("o 0.5: %v, want %v", got, want)
	}
	// Past the cap: continuous, increasing, finite.
	below, at, above := queueTerm(0.3, 0.6-1e-12, cap), queueTerm(0.3, 0.6, cap), queueTerm(0.3, 0.9, cap)
	if math.Abs(below-at) > 1e-6 || !(above > at) || math.IsInf(queueTerm(0.5, 2, cap), 0) {
		t.Errorf("past the cap: %v %v %v", below, at, above)
	}
}

// withLoad gives a random placement topology service rates, cores and load: every service a
// capacity_rps between its pod load and 2× it, a third of the pods a capacity of their own,
// nodes of 1–4 cores.
func withLoad(top *Topology, r *rand.Rand) *Topology {
	for i := range top.Nodes {
		top.Nodes[i].Cores = 1 + r.IntN(4)
		top.Nodes[i].CPU = 1000 * int64(top.Nodes[i].Cores)
		top.Nodes[i].Memory = 1 << 20
	}
	m, err := Compile(top, Options{Unplaced: true})
	if err != nil {
		panic(err)
	}
	for s := range top.Services {
		svc := &top.Services[s]
		per := m.Services[s].Load / float64(svc.Replicas)
		svc.CapacityRPS = ptr(per * (1 + r.Float64()))
		for k := 0; k < svc.Replicas; k++ {
			pod := Pod{Name: fmt.Sprintf("%s-%d", svc.Name, k)}
			if r.IntN(3) == 0 {
				pod.CapacityRPS = ptr(per * (1.2 + r.Float64()))
			}
			svc.Pods = append(svc.Pods, pod)
		}
	}
	return top
}

// plannedUtilization recomputes every node's planned utilisation from the topology's raw
// fields (the formula of docs/architecture.md), independently of PodCPU.
func plannedUtilization(m *Model, placement map[string]string) map[string]float64 {
	used := map[string]float64{}
	for s, svc := range m.Topology.Services {
		total := 0.0
		for _, p := range svc.Pods {
			total += p.CapacityWeight()
		}
		for _, p := range svc.Pods {
			load := m.Services[s].Load * p.CapacityWeight() / total
			cpu := float64(svc.CPU)
			mu := 0.0
			if svc.CapacityRPS != nil {
				mu = *svc.CapacityRPS * p.CapacityWeight()
			}
			if p.CapacityRPS != nil {
				mu = *p.CapacityRPS
			}
			if mu > 0 && load < mu {
				cpu *= load / mu
			}
			used[placement[QualifiedName(p.Name, svc.Namespace)]] += cpu
		}
	}
	out := map[string]float64{}
	for _, n := range m.Nodes {
		out[n.Name] = used[n.Name] / (1000 * float64(n.CoreCount()))
	}
	return out
}

// plannedQueueing recomputes the queueing of a placement from the topology's raw fields: per
// pod with a service rate, 1000·ℓ/(μ(1−o) − ℓ), o the share of its node's cores its node's
// other pods use (below lata-q's cap; the instances that reach it are not compared).
func plannedQueueing(m *Model, placement map[string]string) (q float64, capped bool) {
	util := plannedUtilization(m, placement)
	for s, svc := range m.Topology.Services {
		total := 0.0
		for _, p := range svc.Pods {
			total += p.CapacityWeight()
		}
		for _, p := range svc.Pods {
			load := m.Services[s].Load * p.CapacityWeight() / total
			mu := 0.0
			if svc.CapacityRPS != nil {
				mu = *svc.CapacityRPS * p.CapacityWeight()
			}
			if p.CapacityRPS != nil {
				mu = *p.CapacityRPS
			}
			if mu == 0 {
				continue
			}
			node := placement[QualifiedName(p.Name, svc.Namespace)]
			var cores int
			for _, n := range m.Nodes {
				if n.Name == node {
					cores = n.CoreCount()
				}
			}
			own := float64(svc.CPU) * min(1, load/mu) / (1000 * float64(cores))
			eff := mu * (1 - (util[node] - own))
			if (util[node]-own)+load/mu >= m.UtilizationCap {
				capped = true
			}
			q += 1000 * load / (eff - load)
		}
	}
	return q, capped
}

// TestPlaceHeadroom: on random loaded instances every policy keeps every node's planned
// utilisation within the limit, or says the instance is infeasible, naming the service; and
// the limit binds on some of them (the unconstrained placement crosses it).
func TestPlaceHeadroom(t *testing.T) {
	const instances, limit = 120, 0.7
	binding, infeasible, compared := 0, 0, 0
	for seed := uint64(0); seed < instances; seed++ {
		r := rand.New(rand.NewPCG(seed, 0x4ead))
		top := withLoad(genPlaceTopology(seed, placeGenConfig{nodes: 5, services: 5, replicas: 4}), r)
		free, err := Compile(top, Options{Unplaced: true})
		if err != nil {
			t.Fatal(err)
		}
		limited, err := Compile(top, Options{Unplaced: true, MaxNodeUtilization: limit})
		if err != nil {
			t.Fatal(err)
		}
		if pl, err := Place(free, LARP); err == nil {
			for _, u := range plannedUtilization(free, pl.Placement) {
				if u > limit {
					binding++
					break
				}
			}
		}
		for _, policy := range PlacementPolicies() {
			label := fmt.Sprintf("seed %d %s", seed, policy)
			pl, err := Place(limited, policy)
			if err != nil {
				if !errors.Is(err, ErrInfeasible) || !strings.Contains(err.Error(), "service \"") {
					t.Fatalf("%s: %v", label, err)
				}
				if policy == LARP {
					infeasible++
				}
				continue
			}
			checkPlacement(t, label, limited, pl)
			if q, capped := plannedQueueing(limited, pl.Placement); !capped {
				compared++
				if math.Abs(q-pl.Queueing) > 1e-9*(1+q) {
					t.Fatalf("%s: queueing %v, recomputed %v", label, pl.Queueing, q)
				}
			}
			for _, use := range pl.Utilization {
				if want := plannedUtilization(limited, pl.Placement)[use.Node]; math.Abs(use.Utilization-want) > 1e-12 {
					t.Fatalf("%s: node %s utilisation %v, recomputed %v", label, use.Node, use.Utilization, want)
				}
			}
			for node, u := range plannedUtilization(limited, pl.Placement) {
				if u > limit+1e-9 {
					t.Fatalf("%s: node %s planned utilisation %.4f over the limit %v", label, node, u, limit)
				}
			}
		}
	}
	t.Logf("%d instances: the limit binds on %d, %d infeasible under it; queueing recomputed on %d placements", instances, binding, infeasible, compared)
	if binding == 0 || infeasible == instances || compared == 0 {
		t.Fatalf("the instances do not exercise the limit: binding %d, infeasible %d of %d", binding, infeasible, instances)
	}
}

func TestPlaceHeadroomInfeasible(t *testing.T) {
	// Two nodes of 2 cores; 4 pods that each use a full core at their planned load (capacity
	// 100 rps, load 100 rps each, request 1000m): 2 cores each would be 100 %, over 0.7.
	top := &Topology{
		Nodes:    []Node{{Name: "a", Cores: 2}, {Name: "b", Cores: 2}},
		Latency:  []Latency{{From: "a", To: "b", MS: 1}},
		Services: []Service{{Name: "web", CPU: 1000, Replicas: 4, CapacityRPS: ptr(100.0)}},
		Ingress:  []Ingress{{Service: "web", RPS: 400}},
	}
	m, err := Compile(top, Options{Unplaced: true, MaxNodeUtilization: 0.7})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Place(m, LARP)
	if !errors.Is(err, ErrInfeasible) || !strings.Contains(err.Error(), `service "web": headroom`) {
		t.Fatalf("want an infeasible error naming web's headroom, got %v", err)
	}
	// At a load of 0.35 cores a pod it fits: two per node use exactly 0.7.
	top.Ingress[0].RPS = 140
	if m, err = Compile(top, Options{Unplaced: true, MaxNodeUtilization: 0.7}); err != nil {
		t.Fatal(err)
	}
	if _, err := Place(m, LARP); err != nil {
		t.Fatalf("at 0.7 exactly: %v", err)
	}
	if _, err := Compile(top, Options{Unplaced: true, MaxNodeUtilization: 1.5}); err == nil || !strings.Contains(err.Error(), "max node utilization 1.5") {
		t.Fatalf("limit 1.5: want an error naming it, got %v", err)
	}
}

// TestRebalanceHeadroom: a rebalance from a placement over the limit ends within it, and no
// move takes a node over it.
func TestRebalanceHeadroom(t *testing.T) {
	over := 0 // instances whose current placement is over the limit
	for seed := uint64(0); seed < 40; seed++ {
		r := rand.New(rand.NewPCG(seed, 0x4eb))
		top := withLoad(genPlaceTopology(seed, placeGenConfig{nodes: 4, services: 4, replicas: 3}), r)
		for s := range top.Services {
			top.Services[s].Replicas = 0
			for k := range top.Services[s].Pods {
				top.Services[s].Pods[k].Node = top.Nodes[r.IntN(len(top.Nodes))].Name
			}
		}
		m, err := Compile(top, Options{MaxNodeUtilization: 0.7})
		if err != nil {
			t.Fatal(err)
		}
		at := map[string]string{}
		for _, sm := range m.Services {
			for _, p := range sm.Pods {
				at[p.Name] = m.Nodes[p.Node].Name
			}
		}
		for _, u := range plannedUtilization(m, at) {
			if u > 0.7 {
				over++
				break
			}
		}
		rb, err := PlanRebalance(m, RebalanceOptions{})
		if err != nil {
			if !errors.Is(err, ErrInfeasible) {
				t.Fatalf("seed %d: %v", seed, err)
			}
			continue
		}
		for _, mv := range rb.Moves {
			at[mv.Pod] = mv.To
			if u := plannedUtilization(m, at)[mv.To]; u > 0.7+1e-9 {
				t.Fatalf("seed %d: move %s → %s takes the node to %.3f", seed, mv.Pod, mv.To, u)
			}
		}
		for node, u := range plannedUtilization(m, rb.Target) {
			if u > 0.7+1e-9 {
				t.Fatalf("seed %d: target leaves %s at %.3f", seed, node, u)
			}
		}
	}
}

// TestRebalanceRepairsHeadroom: a current placement over the limit is repaired in the fewest
// moves (one), not kept for being the cheapest.
func TestRebalanceRepairsHeadroom(t *testing.T) {
	top := &Topology{
		Nodes:   []Node{{Name: "a", Cores: 2}, {Name: "b", Cores: 2}},
		Latency: []Latency{{From: "a", To: "b", MS: 10}},
		Services: []Service{
			{Name: "front", CPU: 1000, CapacityRPS: ptr(200.0), Pods: []Pod{{Name: "front-0", Node: "a"}}},
			{Name: "mid", CPU: 1000, CapacityRPS: ptr(200.0), Pods: []Pod{{Name: "mid-0", Node: "a"}}},
			{Name: "back", CPU: 1000, CapacityRPS: ptr(200.0), Pods: []Pod{{Name: "back-0", Node: "a"}}},
		},
		Calls:   []Call{{From: "front", To: "mid"}, {From: "mid", To: "back"}},
		Ingress: []Ingress{{Service: "front", RPS: 100}},
	}
	// Each pod uses 500m at its planned load: a holds 0.75 of its cores.
	m, err := Compile(top, Options{MaxNodeUtilization: 0.7})
	if err != nil {
		t.Fatal(err)
	}
	rb := mustRebalance(t, m, RebalanceOptions{})
	if len(rb.Moves) != 1 || rb.Moves[0].To != "b" || len(rb.Blocked) != 0 || rb.CostBefore != 0 || rb.CostTarget != 1000 {
		t.Fatalf("want one pod moved to b: %+v", rb)
	}
	// Without the limit and without service rates (no queueing part), nothing moves.
	for i := range top.Services {
		top.Services[i].CapacityRPS = nil
	}
	if m, err = Compile(top, Options{}); err != nil {
		t.Fatal(err)
	}
	if rb := mustRebalance(t, m, RebalanceOptions{}); len(rb.Moves) != 0 {
		t.Fatalf("without a limit nothing moves: %+v", rb.Moves)
	}
}
