package optimizer

import (
	"fmt"
	"testing"
)

// largePlaceConfig is the benchmark instance: 1000 pods of 200 services on 100 nodes in 5
// zones (≈1 ms inside a zone, 10–40 ms across), a random call DAG of 400 edges, nodes sized
// for ≈75 % cpu and memory utilisation.
var largePlaceConfig = placeGenConfig{nodes: 100, services: 200, replicas: 9, zones: 5, calls: 400, exact: true, pods: 1000, slack: 1.3}

// BenchmarkPlace times each policy on the large instance and reports its cost relative to
// k8s-spread's (cost/k8s-spread).
func BenchmarkPlace(b *testing.B) {
	top := genPlaceTopology(1, largePlaceConfig)
	m, err := Compile(top, Options{Unplaced: true})
	if err != nil {
		b.Fatal(err)
	}
	if got := countPods(m); got != 1000 || len(m.Calls) != 400 || len(m.Nodes) != 100 {
		b.Fatalf("instance has %d pods, %d calls, %d nodes", got, len(m.Calls), len(m.Nodes))
	}
	base, err := Place(m, K8sSpread)
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range PlacementPolicies() {
		b.Run(string(p), func(b *testing.B) {
			var pl *Placement
			b.ReportAllocs()
			for b.Loop() {
				if pl, err = Place(m, p); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(pl.Cost/base.Cost, "cost/k8s-spread")
		})
	}
}

// TestPlaceLargeInstance checks the large instance's placements and logs their costs.
func TestPlaceLargeInstance(t *testing.T) {
	if testing.Short() {
		t.Skip("large instance")
	}
	m := compileUnplaced(t, genPlaceTopology(1, largePlaceConfig))
	var costs []float64
	for _, p := range PlacementPolicies() {
		pl, err := Place(m, p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		checkPlacement(t, string(p), m, pl)
		costs = append(costs, pl.Cost)
	}
	t.Logf("1000 pods / 200 services / 100 nodes: cost k8s-spread %.0f, larp-greedy %.0f (%s), larp %.0f (%s)",
		costs[0], costs[1], ratio(costs[1], costs[0]), costs[2], ratio(costs[2], costs[0]))
	if costs[2] > costs[1] || costs[2] > costs[0] {
		t.Fatalf("larp (%v) worse than a baseline %v", costs[2], costs)
	}
}

func ratio(v, base float64) string { return fmt.Sprintf("×%.3f", v/base) }
