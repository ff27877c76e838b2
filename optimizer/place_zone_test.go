package optimizer

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// placeZoneTopology turns a random placement instance into one whose latency is per zone:
// each node in one of zones zones (r/z0 …) at random (a node without a zone is refused by the
// zone plan when it holds every pod of a service); random zone latencies, asymmetric in every
// third instance, with ties in every fourth. perNode is the same instance with every node
// pair given its zones' latency.
func placeZoneTopology(seed uint64, c placeGenConfig, zones int) (perZone, perNode *Topology) {
	t := genPlaceTopology(seed, c)
	r := rand.New(rand.NewPCG(seed, 0x2a0e))
	for i := range t.Nodes {
		t.Nodes[i].Locality = fmt.Sprintf("r/z%d/sub%d", r.IntN(zones), i)
	}
	names, zoneOf := TopologyZones(t.Nodes)
	lat := map[[2]int]float64{}
	perZone = t.Clone()
	perZone.LatencyGranularity = LatencyPerZone
	perZone.Latency = nil
	for g := range names {
		for h := range names {
			ms := 0.5 + math.Round(r.Float64()*30000)/1000
			switch {
			case g == h:
				ms = math.Round(r.Float64()*400) / 1000
			case seed%4 == 0:
				ms = float64(1 + r.IntN(3)*5)
			case seed%3 != 0 && h < g:
				ms = lat[[2]int{h, g}] // symmetric
			}
			lat[[2]int{g, h}] = ms
			perZone.Latency = append(perZone.Latency, Latency{From: names[g], To: names[h], MS: ms})
		}
	}
	return perZone, perNodeOf(t, zoneOf, lat)
}

// TestPlaceZoneEqualsNode checks that placing with zone-granular latency (zones×zones tables)
// gives exactly the placement of the same instance with every node pair given its zones'
// latency (n×n tables), under every policy; and the same start nodes for larp's far-point
// rule, which Place only runs beyond maxStarts nodes. The reported cost is the LATA plan's,
// made between zones in the first case, so it agrees within the zone plan's tolerance (see
// TestPlanZonesExpansion); the placements being equal, the per-node cost of the zone
// placement is the per-node placement's.
func TestPlaceZoneEqualsNode(t *testing.T) {
	instances := 40
	if placeRace {
		instances = 10
	}
	compared := 0
	for i := 0; i < instances; i++ {
		seed := uint64(i)
		cfg := placeGenConfig{nodes: 4 + i%37, services: 2 + i%7, replicas: 1 + i%5, calls: 2 + i%9, slack: 1.2 + float64(i%3)/5}
		perZone, perNode := placeZoneTopology(seed, cfg, 2+i%5)
		zm, nm := compileUnplaced(t, perZone), compileUnplaced(t, perNode)
		if !zm.Latency.Zoned() || nm.Latency.Zoned() {
			t.Fatalf("instance %d: zoned %v and %v, want true and false", i, zm.Latency.Zoned(), nm.Latency.Zoned())
		}
		label := fmt.Sprintf("instance %d (%d nodes, %d zones)", i, len(zm.Nodes), len(zm.Latency.Zones()))
		for _, p := range PlacementPolicies() {
			zp, zerr := PlaceWithOptions(zm, p, PlaceOptions{})
			np, nerr := PlaceWithOptions(nm, p, PlaceOptions{})
			if (zerr == nil) != (nerr == nil) {
				t.Fatalf("%s %s: error %v per zone, %v per node", label, p, zerr, nerr)
			}
			if zerr != nil {
				continue
			}
			if !maps.Equal(zp.Placement, np.Placement) {
				t.Fatalf("%s %s: placement per zone\n%v\nper node\n%v", label, p, zp.Placement, np.Placement)
			}
			if math.Abs(zp.Cost-np.Cost) > 3*CostQuantumMS*totalRPS(zm)+1e-9 {
				t.Fatalf("%s %s: cost %v per zone, %v per node", label, p, zp.Cost, np.Cost)
			}
			compared++
		}
		zpp, err := newPlaceProblem(zm)
		if err != nil {
			continue // infeasible alone: compared above
		}
		npp, err := newPlaceProblem(nm)
		if err != nil {
			t.Fatal(err)
		}
		for k := 1; k < len(zm.Nodes); k += 3 {
			if z, n := zpp.startNodes(k), npp.startNodes(k); fmt.Sprint(z) != fmt.Sprint(n) {
				t.Fatalf("%s: startNodes(%d) %v per zone, %v per node", label, k, z, n)
			}
		}
	}
	if compared < instances {
		t.Fatalf("only %d placements compared", compared)
	}
}

// TestPlaceZoneMemory checks that the placement problem of 5,000 nodes in 50 zones holds
// zones×zones latency tables (2,500 entries each), not n×n ones (25 M entries, 400 MB), and
// that building it allocates far less than one n×n table.
func TestPlaceZoneMemory(t *testing.T) {
	const nodes, zones = 5000, 50
	top := &Topology{LatencyGranularity: LatencyPerZone}
	for i := 0; i < nodes; i++ {
		top.Nodes = append(top.Nodes, Node{Name: fmt.Sprintf("n%d", i), Locality: fmt.Sprintf("r/z%02d", i%zones), CPU: 4000, Memory: 8192})
	}
	for s := 0; s < 20; s++ {
		top.Services = append(top.Services, Service{Name: fmt.Sprintf("svc%d", s), Replicas: 10, CPU: 100, Memory: 128})
		if s > 0 {
			top.Calls = append(top.Calls, Call{From: fmt.Sprintf("svc%d", s-1), To: fmt.Sprintf("svc%d", s)})
		}
	}
	top.Ingress = []Ingress{{Service: "svc0", RPS: 100}}
	def := 3.0
	m, err := Compile(top, Options{Unplaced: true, DefaultLatencyMS: &def})
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	pp, err := newPlaceProblem(m)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if len(pp.lat.q) != zones*zones || len(pp.lat.sym) != zones*zones || pp.lat.w != zones || len(pp.lat.zone) != nodes {
		t.Fatalf("tables of %d and %d entries, width %d, %d zone indices; want %d, %d, %d, %d",
			len(pp.lat.q), len(pp.lat.sym), pp.lat.w, len(pp.lat.zone), zones*zones, zones*zones, zones, nodes)
	}
	const dense = nodes * nodes * 16
	if got := after.TotalAlloc - before.TotalAlloc; got > dense/100 {
		t.Fatalf("newPlaceProblem allocated %d bytes, want under 1%% of the %d bytes of n×n tables", got, dense)
	} else {
		t.Logf("newPlaceProblem at %d nodes in %d zones allocated %d bytes (n×n tables: %d)", nodes, zones, got, dense)
	}
}
