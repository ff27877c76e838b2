package optimizer

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestGroupByLocalityMergesOverlappingLocalities(t *testing.T) {
	topo := &Topology{
		Nodes: []Node{
			{Name: "a", Locality: "r1/z1/a"},
			{Name: "b", Locality: "r1/z1"}, // covers a: "r1/z1" matches any subzone of r1/z1
			{Name: "c", Locality: "r1/z2/c"},
			{Name: "d", Locality: "r2/z1/d"},
			{Name: "e"},                    // no locality
			{Name: "f", Locality: "r1//f"}, // a subzone without a zone: Istio refuses it
		},
		Services: []Service{
			{Name: "api", Pods: []Pod{{Name: "api-0", Node: "a"}, {Name: "api-1", Node: "c"}}},
			{Name: "db", Pods: []Pod{{Name: "db-0", Node: "a"}, {Name: "db-1", Node: "b"}, {Name: "db-2", Node: "d"}, {Name: "db-3", Node: "e"}}},
		},
		Calls:   []Call{{From: "api", To: "db"}},
		Ingress: []Ingress{{Service: "api", RPS: 10}},
	}
	zero := 0.0
	grouped, g, err := GroupByLocality(topo, Options{DefaultLatencyMS: &zero})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, grp := range g.Groups {
		names = append(names, grp.Locality+"="+strings.Join(grp.Nodes, ","))
	}
	if want := []string{"r1/z1=a,b", "r1/z2/c=c", "r2/z1/d=d"}; !slices.Equal(names, want) {
		t.Errorf("groups %v, want %v", names, want)
	}
	if !slices.Equal(g.Unlocated, []string{"e", "f"}) {
		t.Errorf("unlocated %v, want [e f]", g.Unlocated)
	}
	if g.PerNode || g.Granularity() != "locality" {
		t.Errorf("granularity %s, want locality", g.Granularity())
	}
	if g.GroupOf("b") != "r1/z1" || g.GroupOf("e") != "" {
		t.Errorf("GroupOf(b) = %q, GroupOf(e) = %q", g.GroupOf("b"), g.GroupOf("e"))
	}
	db := grouped.Services[1]
	var pods []string
	for _, p := range db.Pods {
		pods = append(pods, fmt.Sprintf("%s on %s weight %g", p.Name, p.Node, *p.Weight))
	}
	if want := []string{"db@r1/z1 on r1/z1 weight 2", "db@r2/z1/d on r2/z1/d weight 1"}; !slices.Equal(pods, want) {
		t.Errorf("grouped db pods %v, want %v (db-3 is on an unlocated node)", pods, want)
	}
}

func TestGroupByLocalityLatencyIsTheTrafficWeightedMean(t *testing.T) {
	// Zone X holds a (busy: both pods of api) and b (one idle pod of db); zone Y holds c.
	topo := &Topology{
		Nodes: []Node{{Name: "a", Locality: "r/x"}, {Name: "b", Locality: "r/x"}, {Name: "c", Locality: "r/y"}},
		Latency: []Latency{
			{From: "a", To: "b", MS: 2}, {From: "a", To: "c", MS: 10}, {From: "b", To: "c", MS: 30},
		},
		Services: []Service{
			{Name: "api", Pods: []Pod{{Name: "api-0", Node: "a"}, {Name: "api-1", Node: "a"}}},
			{Name: "db", Pods: []Pod{{Name: "db-0", Node: "b"}, {Name: "db-1", Node: "c"}}},
		},
		Calls:   []Call{{From: "api", To: "db"}},
		Ingress: []Ingress{{Service: "api", RPS: 100}},
	}
	grouped, _, err := GroupByLocality(topo, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Loads: a 100 (api), b 50, c 50 (db's shares).
	// x→y: pairs (a,c) w 100·50, (b,c) w 50·50 → (5000·10 + 2500·30) / 7500.
	// x→x: (a,a) 100·100·0, (a,b) 100·50·2, (b,a) 50·100·2, (b,b) 0 → 20000 / 22500.
	want := map[[2]string]float64{
		{"r/x", "r/y"}: (5000*10 + 2500*30) / 7500.0,
		{"r/x", "r/x"}: 20000 / 22500.0,
		{"r/y", "r/y"}: 0,
	}
	for _, l := range grouped.Latency {
		if w, ok := want[[2]string{l.From, l.To}]; ok && math.Abs(l.MS-w) > 1e-9 {
			t.Errorf("latency %s → %s = %v, want %v", l.From, l.To, l.MS, w)
		}
	}
}

// Where every node is its own locality, the grouped plan is the per-pod plan up to how pods
// of one node share its flow: the cost is the same.
func TestGroupByLocalityPerNodeKeepsTheCost(t *testing.T) {
	for i := 0; i < 30; i++ {
		topo := genTopology(uint64(i), genConfig{nodes: 2 + i%5, services: 2 + i%3, maxPods: 4, extraCalls: 1, weights: i%2 == 0})
		for j := range topo.Nodes {
			topo.Nodes[j].Locality = "region/zone/" + topo.Nodes[j].Name
		}
		grouped, g, err := GroupByLocality(topo, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if !g.PerNode {
			t.Fatal("every node has its own locality, but the grouping is not per node")
		}
		m, err := Compile(topo, Options{})
		if err != nil {
			t.Fatal(err)
		}
		perPod := mustPlan(t, m, LATA)
		gm, err := Compile(grouped, Options{})
		if err != nil {
			t.Fatal(err)
		}
		byNode := mustPlan(t, gm, LATA)
		// Both are within 1.5 quanta per rps of the same optimum (plan.go).
		if math.Abs(perPod.Cost-byNode.Cost) > 3*CostQuantumMS*totalRPS(m)+1e-9 {
			t.Fatalf("instance %d: per-pod cost %v, grouped per node %v", i, perPod.Cost, byNode.Cost)
		}
	}
}

func TestGroupByLocalityErrors(t *testing.T) {
	topo := &Topology{
		Nodes:    []Node{{Name: "a", Locality: "r/z"}, {Name: "b"}},
		Latency:  []Latency{{From: "a", To: "b", MS: 1}},
		Services: []Service{{Name: "api", Pods: []Pod{{Name: "api-0", Node: "b"}}}},
	}
	if _, _, err := GroupByLocality(topo, Options{}); err == nil || !strings.Contains(err.Error(), `"api"`) {
		t.Errorf("a service whose pods are all on unlocated nodes: err %v, want one naming it", err)
	}
	topo.Nodes[0].Locality = ""
	if _, _, err := GroupByLocality(topo, Options{}); err == nil || !strings.Contains(err.Error(), "no node has a locality") {
		t.Errorf("no localities at all: err %v", err)
	}
}
