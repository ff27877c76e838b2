package optimizer

import (
	"fmt"
	"testing"
	"time"
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

// TestPlaceLargeInstance checks the large instance's placements and logs the cost and time of
// each policy and of larp's ingredients (see larpIngredients), against k8s-spread.
func TestPlaceLargeInstance(t *testing.T) {
	if testing.Short() || placeRace {
		t.Skip("large instance: skipped with -short and under the race detector")
	}
	m := compileUnplaced(t, genPlaceTopology(1, largePlaceConfig))
	var base float64
	for _, v := range larpIngredients {
		start := time.Now()
		var pl *Placement
		if v.tune != nil {
			pl = placeWith(t, m, *v.tune)
		} else {
			var err error
			if pl, err = Place(m, PlacementPolicy(v.name)); err != nil {
				t.Fatalf("%s: %v", v.name, err)
			}
		}
		elapsed := time.Since(start)
		checkPlacement(t, v.name, m, pl)
		if base == 0 {
			base = pl.Cost
		}
		t.Logf("%-40s cost %9.0f  %s k8s-spread  %v", v.name, pl.Cost, ratio(pl.Cost, base), elapsed.Round(time.Millisecond))
	}
}

func ratio(v, base float64) string { return fmt.Sprintf("×%.3f", v/base) }
