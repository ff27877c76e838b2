package optimizer

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/edgeflow/edgeflow/examples"
)

func mustCompile(t *testing.T, src string) *Model {
	t.Helper()
	top, err := ParseTopology(strings.NewReader(src), "test")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Compile(top, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustPlan(t *testing.T, m *Model, p Policy) *Allocation {
	t.Helper()
	a, err := Plan(m, p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Three callers on n1, n2, n3; callees on n1 (weight 1), n2 (weight 1) and n4 (weight 2).
const baselineTopology = `
nodes: [{name: n1}, {name: n2}, {name: n3}, {name: n4}]
latency:
  - {from: n1, to: n2, ms: 2}
  - {from: n1, to: n3, ms: 5}
  - {from: n1, to: n4, ms: 9}
  - {from: n2, to: n3, ms: 3}
  - {from: n2, to: n4, ms: 7}
  - {from: n3, to: n4, ms: 1}
services:
  - name: a
    pods: [{name: a-0, node: n1}, {name: a-1, node: n2}, {name: a-2, node: n3}]
  - name: b
    pods: [{name: b-0, node: n1}, {name: b-1, node: n2}, {name: b-2, node: n4, weight: 2}]
calls: [{from: a, to: b}]
ingress: [{service: a, rps: 120}]
`

func TestRoundRobinIgnoresLatency(t *testing.T) {
	m := mustCompile(t, baselineTopology)
	fr := mustPlan(t, m, RoundRobin).Call("a", "b").Fractions()
	for _, caller := range []string{"a-0", "a-1", "a-2"} {
		want := map[string]float64{"b-0": 0.25, "b-1": 0.25, "b-2": 0.5}
		for callee, w := range want {
			if got := fr[caller][callee]; math.Abs(got-w) > 1e-12 {
				t.Errorf("%s → %s: fraction %v, want weight share %v", caller, callee, got, w)
			}
		}
	}
}

func TestLocalizationSendsNothingFarther(t *testing.T) {
	m := mustCompile(t, baselineTopology)
	call := mustPlan(t, m, Localization).Call("a", "b")
	// a-0 and a-1 have a same-node pod; a-2 (n3) is nearest to b-2 (n4, 1 ms).
	want := map[string]string{"a-0": "b-0", "a-1": "b-1", "a-2": "b-2"}
	for _, r := range call.Routes {
		if want[r.Caller] != r.Callee {
			t.Errorf("route %s → %s (%.0f ms): localization must send only to the nearest pod %s", r.Caller, r.Callee, r.LatencyMS, want[r.Caller])
		}
	}
	// Ties are split by weight: a caller equidistant from a weight-1 and a weight-2 pod.
	m = mustCompile(t, `
nodes: [{name: n1}, {name: n2}, {name: n3}]
latency: [{from: n1, to: n2, ms: 3}, {from: n1, to: n3, ms: 3}, {from: n2, to: n3, ms: 1}]
services:
  - {name: a, pods: [{name: a-0, node: n1}]}
  - {name: b, pods: [{name: b-0, node: n2}, {name: b-1, node: n3, weight: 2}]}
calls: [{from: a, to: b}]
`)
	fr := mustPlan(t, m, Localization).Call("a", "b").Fractions()["a-0"]
	if math.Abs(fr["b-0"]-1.0/3) > 1e-12 || math.Abs(fr["b-1"]-2.0/3) > 1e-12 {
		t.Errorf("tie split %v, want b-0 1/3 and b-1 2/3", fr)
	}
}

func TestOptTrafficLocalFirstThenSpreadIgnoringDistance(t *testing.T) {
	m := mustCompile(t, baselineTopology)
	call := mustPlan(t, m, OptTraffic).Call("a", "b")
	fr := call.Fractions()
	// Each caller ships 40 rps; b-0 and b-1 have a 30 rps share each, b-2 60.
	// a-0 fills b-0 (30 of its 40) and a-1 fills b-1; their 10 rps remainders and all of
	// a-2's 40 go to b-2, the only pod with share left, although a-0 is 9 ms from it.
	if got := fr["a-0"]["b-0"]; math.Abs(got-0.75) > 1e-12 {
		t.Errorf("a-0 → b-0 (same node) = %v, want 0.75 (the pod's full share)", got)
	}
	if got := fr["a-0"]["b-2"]; math.Abs(got-0.25) > 1e-12 {
		t.Errorf("a-0 → b-2 = %v, want the 0.25 remainder", got)
	}
	if got := fr["a-2"]["b-2"]; math.Abs(got-1) > 1e-12 {
		t.Errorf("a-2 → b-2 = %v, want 1 (no local pod, only b-2 has share left)", got)
	}
	// Spill-over is in proportion to the remaining share, whatever the distance: with no
	// same-node pods at all, a caller's split equals the weight shares even though b-0 is
	// much nearer than b-1.
	m = mustCompile(t, `
nodes: [{name: n1}, {name: n2}, {name: n3}]
latency: [{from: n1, to: n2, ms: 1}, {from: n1, to: n3, ms: 50}, {from: n2, to: n3, ms: 1}]
services:
  - {name: a, pods: [{name: a-0, node: n1}]}
  - {name: b, pods: [{name: b-0, node: n2}, {name: b-1, node: n3}]}
calls: [{from: a, to: b}]
`)
	fr = mustPlan(t, m, OptTraffic).Call("a", "b").Fractions()
	if math.Abs(fr["a-0"]["b-0"]-0.5) > 1e-12 || math.Abs(fr["a-0"]["b-1"]-0.5) > 1e-12 {
		t.Errorf("spill-over %v, want 0.5/0.5 regardless of distance", fr["a-0"])
	}
}

func TestLATAUsesTheCheapBalancedRoutes(t *testing.T) {
	m := mustCompile(t, baselineTopology)
	a := mustPlan(t, m, LATA)
	// The optimum: a-0 → b-0 30 (0 ms) + b-1 10 (2 ms); a-1 → b-1 20 (0) + b-2 20 (7);
	// a-2 → b-2 40 (1 ms)... checked against every alternative by the LP property test; here
	// the hand-computed value pins the example.
	if want := 10*2.0 + 20*7.0 + 40*1.0; math.Abs(a.Cost-want) > 1e-9 {
		t.Errorf("lata cost %v, want %v", a.Cost, want)
	}
	rr := mustPlan(t, m, RoundRobin)
	if !(a.Cost < rr.Cost) {
		t.Errorf("lata %v not below round-robin %v", a.Cost, rr.Cost)
	}
}

func TestZeroWeightPods(t *testing.T) {
	m := mustCompile(t, `
nodes: [{name: n1}, {name: n2}]
latency: [{from: n1, to: n2, ms: 5}]
services:
  - {name: a, pods: [{name: a-0, node: n1}, {name: a-1, node: n2, weight: 0}]}
  - {name: b, pods: [{name: b-0, node: n1}, {name: b-1, node: n2}, {name: b-2, node: n2, weight: 0}]}
calls: [{from: a, to: b}]
ingress: [{service: a, rps: 10}]
`)
	for _, p := range Policies() {
		fr := mustPlan(t, m, p).Call("a", "b").Fractions()
		for caller, row := range fr {
			if row["b-2"] != 0 {
				t.Errorf("%s: %s sends %v to the zero-weight pod b-2", p, caller, row["b-2"])
			}
		}
		if len(fr["a-1"]) == 0 {
			t.Errorf("%s: zero-weight caller a-1 has no routes; a sidecar must never get an empty config", p)
		}
	}
	if got := mustPlan(t, m, LATA).Call("a", "b").Fractions()["a-1"]["b-1"]; got != 1 {
		t.Errorf("zero-weight caller a-1 → nearest b-1 = %v, want 1", got)
	}
}

func TestLATAPrefersShortPathsAmongOptima(t *testing.T) {
	// On the bundled Bookinfo, reviews → ratings has several optimal allocations of equal cost
	// (166.7 ms·req/s); one of them sends reviews-1 (n2) a third of its calls over the 10 ms path
	// to ratings-2 (n4). The tie-break must pick one whose longest path is 6 ms.
	top, err := ParseTopology(bytes.NewReader(examples.Bookinfo()), "bookinfo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Compile(top, Options{})
	if err != nil {
		t.Fatal(err)
	}
	call := mustPlan(t, m, LATA).Call("reviews", "ratings")
	if math.Abs(call.Cost-500.0/3) > 1e-6 {
		t.Fatalf("reviews → ratings cost %v, want the optimum 166.67", call.Cost)
	}
	for _, r := range call.Routes {
		if r.LatencyMS > 6 {
			t.Errorf("route %s → %s over %v ms: an optimal allocation exists whose longest path is 6 ms", r.Caller, r.Callee, r.LatencyMS)
		}
	}
}
