package optimizer

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// trueCost is the true objective of a placement: the LATA cost of the placed topology plus its
// queueing with shared cores (Model.Split on the placed topology).
func trueCost(t *testing.T, m *Model, placement map[string]string) (network, queueing float64) {
	t.Helper()
	placed, err := Compile((&Placement{Placement: placement}).Apply(m.Topology), Options{UtilizationCap: m.UtilizationCap})
	if err != nil {
		t.Fatal(err)
	}
	split, err := placed.Split()
	if err != nil {
		t.Fatal(err)
	}
	return split.Network, split.Queueing
}

// networkOnly is the placement of the network-only search (LARP before issue 38), unbounded.
func networkOnly(t *testing.T, m *Model) map[string]string {
	t.Helper()
	pp, err := newPlaceProblem(m)
	if err != nil {
		t.Fatal(err)
	}
	net := *pp
	net.queued = false
	nodes, _, err := net.larpSearch(larpDefault, larpBudget{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := pp.placement(LARP, nodes)
	if err != nil {
		t.Fatal(err)
	}
	return pl.Placement
}

// scaleCapacity multiplies every capacity_rps of top by f (f large: light load).
func scaleCapacity(top *Topology, f float64) *Topology {
	c := top.Clone()
	for s := range c.Services {
		if v := c.Services[s].CapacityRPS; v != nil {
			*v *= f
		}
		for k := range c.Services[s].Pods {
			if v := c.Services[s].Pods[k].CapacityRPS; v != nil {
				*v *= f
			}
		}
	}
	return c
}

// TestObjectiveWithQueueing: on random loaded instances LARP's placement (network + queueing)
// is never worse on the true objective than the network-only search's, often better; at light
// load (capacities ×1000) it is as good on the network cost too, within the queueing's share.
func TestObjectiveWithQueueing(t *testing.T) {
	const instances = 100
	better, equal, infeasible := 0, 0, 0
	lightNet := 0.0 // the largest relative difference in network cost at light load
	var gains []float64
	for seed := uint64(0); seed < instances; seed++ {
		r := rand.New(rand.NewPCG(seed, 0x0b1))
		top := withLoad(genPlaceTopology(seed, placeGenConfig{nodes: 5, services: 5, replicas: 4}), r)
		for _, tc := range []struct {
			name  string
			top   *Topology
			light bool
		}{{"loaded", top, false}, {"light", scaleCapacity(top, 1000), true}} {
			label := fmt.Sprintf("seed %d %s", seed, tc.name)
			m, err := Compile(tc.top, Options{Unplaced: true})
			if err != nil {
				t.Fatal(err)
			}
			pl, err := PlaceWithOptions(m, LARP, PlaceOptions{})
			if errors.Is(err, ErrInfeasible) {
				infeasible++
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", label, err)
			}
			checkPlacement(t, label, m, pl)
			newNet, newQ := trueCost(t, m, pl.Placement)
			if math.Abs(newNet-pl.Cost) > 1e-9*(1+newNet) || math.Abs(newQ-pl.Queueing) > 1e-9*(1+newQ) {
				t.Fatalf("%s: placement says %v + %v, the placed topology %v + %v", label, pl.Cost, pl.Queueing, newNet, newQ)
			}
			oldNet, oldQ := trueCost(t, m, networkOnly(t, m))
			newTotal, oldTotal := newNet+newQ, oldNet+oldQ
			if newTotal > oldTotal*(1+1e-9) {
				t.Fatalf("%s: network + queueing %v (%v + %v), worse than the network-only placement's %v (%v + %v)",
					label, newTotal, newNet, newQ, oldTotal, oldNet, oldQ)
			}
			if tc.light {
				// Q_p = 1000 ρ_p/(1 − z_p) = 1000 ρ_p + Q_p z_p: only the second term depends on
				// the placement, and at light load it is second order. The two placements'
				// network costs differ by at most what it can trade.
				floor := queueFloor(m)
				if d := math.Abs(newNet - oldNet); d > (oldQ-floor)+(newQ-floor)+1e-9*(1+oldNet) {
					t.Fatalf("%s: light load: network %v vs %v, queueing %v vs %v (floor %v)", label, newNet, oldNet, newQ, oldQ, floor)
				}
				lightNet = max(lightNet, math.Abs(newNet-oldNet)/max(oldNet, 1e-12))
				continue
			}
			if newTotal < oldTotal*(1-1e-9) {
				better++
				gains = append(gains, 1-newTotal/oldTotal)
			} else {
				equal++
			}
		}
	}
	mean, most := 0.0, 0.0
	for _, g := range gains {
		mean += g / float64(len(gains))
		most = max(most, g)
	}
	t.Logf("%d instances, %d infeasible; loaded: strictly better on %d (mean %.1f%%, most %.1f%% lower network + queueing), equal on %d; light: network costs within %.2g (relative)",
		instances, infeasible, better, 100*mean, 100*most, equal, lightNet)
	if better == 0 {
		t.Fatal("the queueing part never changed a placement: the test exercises nothing")
	}
}

// queueFloor is Σ 1000·ℓ_p/μ_p over the pods with a service rate: the queueing every placement
// has at least (z_p ≥ 0), from the topology's raw fields.
func queueFloor(m *Model) float64 {
	var q float64
	for s, svc := range m.Topology.Services {
		total := 0.0
		for _, p := range svc.Pods {
			total += p.CapacityWeight()
		}
		for _, p := range svc.Pods {
			mu := 0.0
			if svc.CapacityRPS != nil {
				mu = *svc.CapacityRPS * p.CapacityWeight()
			}
			if p.CapacityRPS != nil {
				mu = *p.CapacityRPS
			}
			if mu > 0 {
				q += 1000 * m.Services[s].Load * p.CapacityWeight() / total / mu
			}
		}
	}
	return q
}

// TestObjectiveWithQueueingCut: cut short by a step budget, LARP's placement is still never
// worse on network + queueing than the network-only search's under the same budget.
func TestObjectiveWithQueueingCut(t *testing.T) {
	cut := 0
	for seed := uint64(0); seed < 40; seed++ {
		r := rand.New(rand.NewPCG(seed, 0xc07))
		top := withLoad(genPlaceTopology(seed, placeGenConfig{nodes: 6, services: 6, replicas: 4}), r)
		m, err := Compile(top, Options{Unplaced: true})
		if err != nil {
			t.Fatal(err)
		}
		opts := PlaceOptions{Steps: 20}
		pl, err := PlaceWithOptions(m, LARP, opts)
		if errors.Is(err, ErrInfeasible) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if pl.Truncated {
			cut++
		}
		pp, err := newPlaceProblem(m)
		if err != nil {
			t.Fatal(err)
		}
		net := *pp
		net.queued = false
		nodes, _, err := net.larpSearch(larpDefault, newLarpBudget(opts), nil)
		if err != nil {
			t.Fatal(err)
		}
		old, err := pp.placement(LARP, nodes)
		if err != nil {
			t.Fatal(err)
		}
		if newTotal, oldTotal := pl.Cost+pl.Queueing, old.Cost+old.Queueing; newTotal > oldTotal*(1+1e-9) {
			t.Fatalf("seed %d: cut: %v, network-only under the same budget %v", seed, newTotal, oldTotal)
		}
	}
	if cut == 0 {
		t.Fatal("no search was cut: the test exercises nothing")
	}
	t.Logf("%d searches cut", cut)
}

// TestLARPSeed: the network-only placement handed to the search on network + queueing as a
// start bounds its result, also where the search's own starts are worse (one greedy run, no
// local search).
func TestLARPSeed(t *testing.T) {
	tune := larpTuning{allStarts: false, searchUnits: 0}
	worse := 0 // instances whose own start is worse than the seed
	for seed := uint64(0); seed < 40; seed++ {
		r := rand.New(rand.NewPCG(seed, 0x5eed))
		top := withLoad(genPlaceTopology(seed, placeGenConfig{nodes: 5, services: 5, replicas: 4}), r)
		m, err := Compile(top, Options{Unplaced: true})
		if err != nil {
			t.Fatal(err)
		}
		pp, err := newPlaceProblem(m)
		if errors.Is(err, ErrInfeasible) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		net := *pp
		net.queued = false
		start, _, err := net.larpSearch(larpDefault, larpBudget{}, nil)
		if errors.Is(err, ErrInfeasible) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		own, _, err := pp.larpSearch(tune, larpBudget{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := pp.larpSearch(tune, larpBudget{}, start)
		if err != nil {
			t.Fatal(err)
		}
		cost := func(nodes []int) float64 {
			st := pp.newState()
			st.load(nodes)
			return st.cost()
		}
		if cost(got) > cost(start)*(1+1e-12) {
			t.Fatalf("seed %d: %v, worse than the seed's %v", seed, cost(got), cost(start))
		}
		if cost(own) > cost(start)*(1+1e-9) {
			worse++
		}
	}
	if worse == 0 {
		t.Fatal("the search's own start was never worse than the seed: the test exercises nothing")
	}
	t.Logf("the search's own start was worse than the seed on %d instances", worse)
}
