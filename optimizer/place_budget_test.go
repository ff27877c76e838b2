package optimizer

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// spreadPlaceConfig is the at-scale instance: 5000 pods of 12 services on 500 nodes in 10
// zones, so each service has ≈420 pods, one per node on most nodes (spread cap 1), and every
// call edge is a transport of ≈420 × 420 nodes.
var spreadPlaceConfig = placeGenConfig{nodes: 500, services: 12, replicas: 1, zones: 10, calls: 20, exact: true, pods: 5000, slack: 1.3}

// TestPlaceBudgetLargeInstance places the at-scale instance with a 2 s budget: the call
// returns within the budget plus a margin (work under way finishes, then the result is
// costed), with a valid placement no worse than k8s-spread's, and says what was cut.
func TestPlaceBudgetLargeInstance(t *testing.T) {
	if testing.Short() || placeRace {
		t.Skip("timing: skipped with -short and under the race detector")
	}
	m := compileUnplaced(t, genPlaceTopology(1, spreadPlaceConfig))
	if got := countPods(m); got != 5000 || len(m.Nodes) != 500 {
		t.Fatalf("instance has %d pods, %d nodes", got, len(m.Nodes))
	}
	start := time.Now()
	base, err := Place(m, K8sSpread)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("k8s-spread: %v, cost %.0f", time.Since(start).Round(time.Millisecond), base.Cost)
	const budget, margin = 2 * time.Second, 3 * time.Second
	start = time.Now()
	pl, err := PlaceWithOptions(m, LARP, PlaceOptions{Budget: budget})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	checkPlacement(t, "larp (budget)", m, pl)
	t.Logf("budget %v: %v, cost %.0f %s k8s-spread, truncated %v, cut %+v", budget, elapsed.Round(time.Millisecond),
		pl.Cost, ratio(pl.Cost, base.Cost), pl.Truncated, pl.Cut)
	if elapsed > budget+margin {
		t.Errorf("took %v, budget %v (+%v margin)", elapsed, budget, margin)
	}
	if pl.Cost > base.Cost*(1+1e-9) {
		t.Errorf("cost %v, worse than k8s-spread's %v", pl.Cost, base.Cost)
	}
	if pl.Truncated != (pl.Cut != nil) {
		t.Errorf("truncated %v but cut %+v", pl.Truncated, pl.Cut)
	}
}

// TestPlaceBudgetCuts checks what a budget does on medium instances: a step budget cuts the
// search deterministically (same placement for any GOMAXPROCS), a spent wall-time budget
// leaves only the starts that are always built, and either way the placement is valid, says
// it was cut, and is no worse than k8s-spread's; with no budget the result is Place's.
func TestPlaceBudgetCuts(t *testing.T) {
	cfg := placeGenConfig{nodes: 16, services: 24, replicas: 6, zones: 4, calls: 36, slack: 1.3}
	for seed := uint64(0); seed < 4; seed++ {
		m := compileUnplaced(t, genPlaceTopology(seed, cfg))
		base, err := Place(m, K8sSpread)
		if err != nil {
			t.Fatal(err)
		}
		full, err := Place(m, LARP)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			opts PlaceOptions
			cut  bool
		}{
			{"none", PlaceOptions{}, false},
			{"steps=20", PlaceOptions{Steps: 20}, true},
			{"budget=1ns", PlaceOptions{Budget: time.Nanosecond}, true},
		} {
			t.Run(fmt.Sprintf("seed%d/%s", seed, tc.name), func(t *testing.T) {
				var first *Placement
				for _, procs := range []int{1, 2} {
					prev := runtime.GOMAXPROCS(procs)
					pl, err := PlaceWithOptions(m, LARP, tc.opts)
					runtime.GOMAXPROCS(prev)
					if err != nil {
						t.Fatal(err)
					}
					checkPlacement(t, tc.name, m, pl)
					if pl.Truncated != tc.cut || (pl.Cut != nil) != tc.cut {
						t.Fatalf("truncated %v, cut %+v; want truncated %v", pl.Truncated, pl.Cut, tc.cut)
					}
					if pl.Cost > base.Cost*(1+1e-9) {
						t.Errorf("cost %v, worse than k8s-spread's %v", pl.Cost, base.Cost)
					}
					switch tc.name {
					case "none":
						if placementJSON(t, pl) != placementJSON(t, full) {
							t.Errorf("no budget gives %v, Place %v", pl, full)
						}
					case "budget=1ns":
						// Only the k8s spread start is built; no search runs to its end.
						if c := pl.Cut; c.StartsBuilt != 1 || c.SearchesFinished != 0 || c.Passes != 0 {
							t.Errorf("cut %+v, want 1 start built and no search", c)
						}
					case "steps=20":
						if c := pl.Cut; c.StartsBuilt != c.Starts || c.SearchesFinished == c.Searches {
							t.Errorf("cut %+v, want every start built and a search cut", c)
						}
						if first != nil && placementJSON(t, pl) != placementJSON(t, first) {
							t.Errorf("GOMAXPROCS=%d gives %v, GOMAXPROCS=1 %v", procs, pl, first)
						}
					}
					first = pl
				}
			})
		}
	}
}

// TestPlacementJSONTruncated checks that truncated and cut appear in JSON only when the
// search was cut.
func TestPlacementJSONTruncated(t *testing.T) {
	for _, tc := range []struct {
		pl   Placement
		want string
	}{
		{Placement{Policy: LARP, Placement: map[string]string{"a-0": "n"}, Cost: 1}, `{"policy":"larp","placement":{"a-0":"n"},"cost":1,"queueing":0}`},
		{Placement{Policy: LARP, Placement: map[string]string{"a-0": "n"}, Cost: 1, Truncated: true,
			Cut: &PlacementCut{Starts: 129, StartsBuilt: 4, Searches: 1, Passes: 2}},
			`{"policy":"larp","placement":{"a-0":"n"},"cost":1,"queueing":0,"truncated":true,"cut":{"starts":129,"starts_built":4,"searches":1,"searches_finished":0,"passes":2}}`},
	} {
		got, err := json.Marshal(&tc.pl)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.want {
			t.Errorf("got %s\nwant %s", got, tc.want)
		}
	}
}

func placementJSON(t *testing.T, pl *Placement) string {
	t.Helper()
	b, err := json.Marshal(pl)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
