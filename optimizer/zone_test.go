package optimizer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// zoneTopology turns a random topology into one whose latency is per zone: node i is in zone
// i mod zones (r/z0 …), except that the last node has no zone (a zone of its own, named after
// it); the zone latencies are random and symmetric, a zone to itself included, with ties when
// ties is set. perNode is the same topology with every node pair given its zones' latency.
func zoneTopology(seed uint64, c genConfig, zones int, ties bool) (perZone, perNode *Topology) {
	t := genTopology(seed, c)
	r := rand.New(rand.NewPCG(seed, 0x20e))
	for i := range t.Nodes {
		if i < len(t.Nodes)-1 || len(t.Nodes) == 1 {
			t.Nodes[i].Locality = fmt.Sprintf("r/z%d/sub%d", i%zones, i)
		}
	}
	names, zoneOf := TopologyZones(t.Nodes)
	lat := map[[2]int]float64{}
	perZone = t.Clone()
	perZone.LatencyGranularity = LatencyPerZone
	perZone.Latency = nil
	for g := range names {
		for h := g; h < len(names); h++ {
			ms := math.Round(r.Float64()*20000) / 1000
			if ties {
				ms = float64(r.IntN(3) * 5)
			}
			if g == h {
				ms = math.Round(r.Float64()*500) / 1000
			}
			lat[[2]int{g, h}], lat[[2]int{h, g}] = ms, ms
			perZone.Latency = append(perZone.Latency, Latency{From: names[g], To: names[h], MS: ms})
		}
	}
	return perZone, perNodeOf(t, zoneOf, lat)
}

// perNodeOf is t with every ordered node pair, a node to itself included, given its zones'
// latency lat[{zone(u), zone(v)}] (zoneOf as TopologyZones gives it).
func perNodeOf(t *Topology, zoneOf []int, lat map[[2]int]float64) *Topology {
	perNode := t.Clone()
	perNode.Latency = nil
	for u := range t.Nodes {
		for v := range t.Nodes {
			perNode.Latency = append(perNode.Latency, Latency{From: t.Nodes[u].Name, To: t.Nodes[v].Name, MS: lat[[2]int{zoneOf[u], zoneOf[v]}]})
		}
	}
	return perNode
}

func TestZoneOf(t *testing.T) {
	for _, c := range []struct{ locality, want string }{
		{"eu/eu-1a/rack-3", "eu/eu-1a"},
		{"eu/eu-1a", "eu/eu-1a"},
		{"eu", "n1"}, // a region without a zone: a zone of its own
		{"", "n1"},
		{"/z", "/z"},
	} {
		if got := ZoneOf(Node{Name: "n1", Locality: c.locality}); got != c.want {
			t.Errorf("ZoneOf(locality %q) = %q, want %q", c.locality, got, c.want)
		}
	}
}

func TestCompileZoneLatency(t *testing.T) {
	top, err := ParseTopology(strings.NewReader(`
latency_granularity: zone
nodes:
  - {name: a1, locality: eu/a/x}
  - {name: a2, locality: eu/a/y}
  - {name: b1, locality: eu/b}
  - {name: lone}
latency:
  - {from: eu/a, to: eu/b, ms: 4}
  - {from: eu/b, to: eu/a, ms: 5}
  - {from: eu/a, to: eu/a, ms: 0.5}
  - {from: lone, to: eu/a, ms: 9}
services:
  - {name: api, pods: [{name: api-0, node: a1}]}
`), "test")
	if err != nil {
		t.Fatal(err)
	}
	def := 7.0
	m, err := Compile(top, Options{DefaultLatencyMS: &def})
	if err != nil {
		t.Fatal(err)
	}
	if !m.Latency.Zoned() || len(m.Latency.ms) != 9 || m.Latency.Len() != 4 {
		t.Fatalf("zoned %v, %d values for %d nodes: want a 3×3 zone matrix", m.Latency.Zoned(), len(m.Latency.ms), m.Latency.Len())
	}
	idx := func(n string) int { i, _ := m.NodeIndex(n); return i }
	for _, c := range []struct {
		from, to string
		want     float64
	}{
		{"a1", "a2", 0.5}, // inside zone eu/a
		{"a2", "a2", 0.5},
		{"a1", "b1", 4}, {"b1", "a2", 5}, // each direction as given
		{"lone", "a1", 9}, {"a2", "lone", 9}, // one direction given = both
		{"lone", "b1", 7}, // never given: the default
		{"b1", "b1", 0},   // a zone to itself not given: 0
		{"lone", "lone", 0},
	} {
		if got := m.Latency.At(idx(c.from), idx(c.to)); got != c.want {
			t.Errorf("At(%s, %s) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}

func TestCompileZoneLatencyRejects(t *testing.T) {
	base := func() *Topology {
		return &Topology{LatencyGranularity: LatencyPerZone,
			Nodes:    []Node{{Name: "a1", Locality: "eu/a"}, {Name: "b1", Locality: "eu/b"}},
			Latency:  []Latency{{From: "eu/a", To: "eu/b", MS: 3}},
			Services: []Service{{Name: "api", Pods: []Pod{{Name: "api-0", Node: "a1"}}}}}
	}
	for _, c := range []struct {
		name   string
		change func(*Topology)
		want   string
	}{
		{"unknown zone", func(t *Topology) { t.Latency = append(t.Latency, Latency{From: "eu/a", To: "eu/c", MS: 1}) },
			`latency[1] eu/a → eu/c: unknown zone "eu/c"`},
		{"a node name where a zone is wanted", func(t *Topology) { t.Latency[0].From = "a1" },
			`latency[0] a1 → eu/b: unknown zone "a1"`},
		{"missing zone pair", func(t *Topology) { t.Latency = nil },
			"latency: no entry for zones eu/a ↔ eu/b (give one, or a default latency)"},
		{"duplicate", func(t *Topology) { t.Latency = append(t.Latency, t.Latency[0]) },
			"latency eu/a → eu/b: duplicate entry"},
		{"bad granularity", func(t *Topology) { t.LatencyGranularity = "rack" },
			`latency_granularity "rack": want "node" or "zone"`},
		{"too large", func(t *Topology) { t.Latency[0].MS = 2e4 },
			"latency eu/a → eu/b: 20000 ms exceeds the maximum"},
	} {
		t.Run(c.name, func(t *testing.T) {
			top := base()
			c.change(top)
			_, err := Compile(top, Options{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to name %q", err, c.want)
			}
		})
	}
}

// A zone matrix at 5,000 nodes in 50 zones holds 2,500 values, not 25 M.
func TestZoneLatencyMemory(t *testing.T) {
	top := &Topology{LatencyGranularity: LatencyPerZone}
	for i := 0; i < 5000; i++ {
		top.Nodes = append(top.Nodes, Node{Name: fmt.Sprintf("n%d", i), Locality: fmt.Sprintf("r/z%02d", i%50)})
	}
	top.Services = []Service{{Name: "api", Pods: []Pod{{Name: "api-0", Node: "n0"}}}}
	def := 3.0
	m, err := Compile(top, Options{DefaultLatencyMS: &def})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Latency.ms) != 2500 || len(m.Latency.zone) != 5000 {
		t.Fatalf("%d values, %d zone indices; want 2500 and 5000", len(m.Latency.ms), len(m.Latency.zone))
	}
	if got := m.Latency.At(1, 2); got != 3 {
		t.Fatalf("At(1, 2) = %v, want the default 3", got)
	}
}

// The zone plan expanded to pods: every caller's fractions sum to 1, every callee pod receives
// its capacity share (LATA), and the cost is the per-node plan's on the same latencies.
func TestPlanZonesExpansion(t *testing.T) {
	for i := 0; i < 60; i++ {
		c := genConfig{nodes: 2 + i%9, services: 2 + i%4, maxPods: 6, extraCalls: 1, weights: i%2 == 0, fractional: i%4 == 0}
		perZone, perNode := zoneTopology(uint64(i), c, 1+i%4, i%3 == 0)
		label := fmt.Sprintf("instance %d", i)
		zm, err := Compile(perZone, Options{})
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		nm, err := Compile(perNode, Options{})
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		for _, p := range []Policy{LATA, RoundRobin, Localization} {
			za, err := Plan(zm, p)
			if err != nil {
				t.Fatalf("%s %s: %v", label, p, err)
			}
			na := mustPlan(t, nm, p)
			for _, v := range edges(zm, za) {
				checkFractions(t, label+" "+string(p), v)
				if p != Localization {
					checkBalanced(t, label+" "+string(p), v)
				}
			}
			// Where the plans must agree: LATA's optimal cost (both within 1.5 quanta per rps
			// of the optimum); round-robin and localization route by route.
			switch p {
			case LATA:
				if math.Abs(za.Cost-na.Cost) > 3*CostQuantumMS*totalRPS(zm)+1e-9 {
					t.Fatalf("%s: zone plan cost %v, per-node plan %v", label, za.Cost, na.Cost)
				}
			default:
				for k := range za.Calls {
					zf, nf := za.Calls[k].Fractions(), na.Calls[k].Fractions()
					for caller, row := range nf {
						for callee, f := range row {
							if math.Abs(zf[caller][callee]-f) > 1e-12 {
								t.Fatalf("%s %s: %s → %s: zone plan %v, per-node plan %v", label, p, caller, callee, zf[caller][callee], f)
							}
						}
					}
					if len(za.Calls[k].Routes) != len(na.Calls[k].Routes) {
						t.Fatalf("%s %s: %d routes, per-node plan %d", label, p, len(za.Calls[k].Routes), len(na.Calls[k].Routes))
					}
				}
			}
		}
	}
}

// A caller pod takes its zone's split; inside a callee zone the pods share by weight.
func TestPlanZonesSplitsByZoneAndWeight(t *testing.T) {
	top, err := ParseTopology(strings.NewReader(`
latency_granularity: zone
nodes:
  - {name: a1, locality: r/a}
  - {name: a2, locality: r/a}
  - {name: b1, locality: r/b}
latency:
  - {from: r/a, to: r/b, ms: 10}
services:
  - name: web
    pods: [{name: web-0, node: a1}, {name: web-1, node: a2}, {name: web-2, node: b1}]
  - name: db
    pods: [{name: db-0, node: a1, weight: 1}, {name: db-1, node: a2, weight: 3}, {name: db-2, node: b1, weight: 2}]
calls: [{from: web, to: db}]
ingress: [{service: web, rps: 60}]
`), "test")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Compile(top, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := mustPlan(t, m, LATA)
	// Zone r/a sends 40 rps and receives its share 40 (weights 4 of 6): all local, split 1:3;
	// zone r/b sends 20, receives 20: local.
	want := map[string]map[string]float64{
		"web-0": {"db-0": 0.25, "db-1": 0.75},
		"web-1": {"db-0": 0.25, "db-1": 0.75},
		"web-2": {"db-2": 1},
	}
	got := a.Calls[0].Fractions()
	for caller, row := range want {
		for callee, f := range row {
			if math.Abs(got[caller][callee]-f) > 1e-9 {
				t.Errorf("%s → %s: %v, want %v (all: %v)", caller, callee, got[caller][callee], f, got)
			}
		}
		if len(got[caller]) != len(row) {
			t.Errorf("%s routes %v, want %v", caller, got[caller], row)
		}
	}
	if a.Cost != 0 {
		t.Errorf("cost %v, want 0 (every route inside its zone)", a.Cost)
	}
	if _, err := ZoneGrouping(m); err != nil {
		t.Error(err)
	}
	nm, _ := Compile(&Topology{Nodes: []Node{{Name: "a"}}, Services: []Service{{Name: "s", Pods: []Pod{{Name: "s-0", Node: "a"}}}}}, Options{})
	if _, err := ZoneGrouping(nm); err == nil || !strings.Contains(err.Error(), "per node, not per zone") {
		t.Errorf("ZoneGrouping of a per-node model: %v", err)
	}
}

// The Planner on a zone topology gives Plan's allocation after each change (it plans in full).
func TestPlannerZones(t *testing.T) {
	perZone, _ := zoneTopology(7, genConfig{nodes: 8, services: 4, maxPods: 5, extraCalls: 2, weights: true}, 3, false)
	var pl Planner
	for step := 0; step < 5; step++ {
		next := perZone.Clone()
		next.Latency[step%len(next.Latency)].MS += float64(step)
		r, err := pl.Plan(next)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Compile(next, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Model.Latency.At(0, 1) != m.Latency.At(0, 1) {
			t.Fatalf("step %d: the recompiled zone latency %v, a full compile %v", step, r.Model.Latency.At(0, 1), m.Latency.At(0, 1))
		}
		want := mustPlan(t, m, LATA)
		if r.Allocation.Cost != want.Cost || len(r.Allocation.Calls) != len(want.Calls) {
			t.Fatalf("step %d: planner cost %v, Plan %v", step, r.Allocation.Cost, want.Cost)
		}
		pl.Pushed(r)
		perZone = next
	}
}

// lata-q per zone: the caller pods' loads are their share of their zone's, and each caller's
// fractions sum to 1.
func TestPlanZonesLATAQ(t *testing.T) {
	perZone, _ := zoneTopology(3, genConfig{nodes: 6, services: 3, maxPods: 4, extraCalls: 1}, 2, false)
	mu := 1000.0
	for i := range perZone.Services {
		perZone.Services[i].CapacityRPS = &mu
	}
	m, err := Compile(perZone, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := mustPlan(t, m, LATAQ)
	for k, c := range a.Calls {
		sums := map[string]float64{}
		for _, r := range c.Routes {
			sums[r.Caller] += r.Fraction
		}
		for _, p := range m.Services[m.Calls[k].From].Pods {
			if math.Abs(sums[p.Name]-1) > 1e-9 {
				t.Fatalf("%s → %s: caller %s fractions sum to %v", c.From, c.To, p.Name, sums[p.Name])
			}
		}
	}
}

// Place costs its result with the zone plan, on a model whose file gives replicas, not pods.
func TestPlaceZonesReplicas(t *testing.T) {
	top, err := ParseTopology(strings.NewReader(`
latency_granularity: zone
nodes:
  - {name: a1, locality: r/a}
  - {name: b1, locality: r/b}
latency:
  - {from: r/a, to: r/b, ms: 4}
services:
  - {name: api, replicas: 2}
  - {name: db, replicas: 1}
calls:
  - {from: api, to: db}
ingress:
  - {service: api, rps: 10}
`), "test")
	if err != nil {
		t.Fatal(err)
	}
	m := compileUnplaced(t, top)
	for _, p := range PlacementPolicies() {
		pl, err := PlaceWithOptions(m, p, PlaceOptions{})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if len(pl.Placement) != 3 {
			t.Fatalf("%s: placement %v, want 3 pods", p, pl.Placement)
		}
	}
}
