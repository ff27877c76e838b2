package optimizer

import (
	"math"
	"slices"
	"testing"
)

// closedLoopPair: a (a1 on n1, a2 on n2, 100 req/s of ingress) calls b (b1 on n1, b2 on n2),
// 10 ms between the nodes; b's pods serve mu1 and mu2 requests/s.
func closedLoopPair(mu1, mu2 float64) *Topology {
	return &Topology{
		Nodes:   []Node{{Name: "n1"}, {Name: "n2"}},
		Latency: []Latency{{From: "n1", To: "n2", MS: 10}},
		Services: []Service{
			{Name: "a", Pods: []Pod{{Name: "a1", Node: "n1"}, {Name: "a2", Node: "n2"}}},
			{Name: "b", Pods: []Pod{{Name: "b1", Node: "n1", CapacityRPS: ptr(mu1)}, {Name: "b2", Node: "n2", CapacityRPS: ptr(mu2)}}},
		},
		Calls:   []Call{{From: "a", To: "b"}},
		Ingress: []Ingress{{Service: "a", RPS: 100}},
	}
}

func fraction(a *Allocation, caller, callee string) float64 {
	return a.Call("a", "b").Fractions()[caller][callee]
}

// TestClosedLoopStep: a recompute on new capacities moves the routes in force Step of the way
// to lata-q's new plan; the same topology again moves half the rest, and so on, each push
// smaller than the last, until damping holds the plan (no oscillation).
func TestClosedLoopStep(t *testing.T) {
	pl := &Planner{Policy: ClosedLoop}
	r, err := pl.Plan(closedLoopPair(200, 200))
	if err != nil {
		t.Fatal(err)
	}
	if !r.Push || r.Allocation.Policy != ClosedLoop {
		t.Fatalf("first plan: push %v, policy %q; want a push of closed-loop", r.Push, r.Allocation.Policy)
	}
	if f := fraction(r.Allocation, "a1", "b1"); f != 1 {
		t.Fatalf("idle: a1 → b1 %v, want 1 (lata-q localises far below capacity)", f)
	}
	pl.Pushed(r)

	// b1 slows to 80 req/s: lata-q moves part of a1's 50 req/s to b2; closed-loop half of it.
	slow := closedLoopPair(80, 200)
	target, err := Plan(compileTop(t, slow), LATAQ)
	if err != nil {
		t.Fatal(err)
	}
	want := fraction(target, "a1", "b1")
	if !(want < 0.95) {
		t.Fatalf("lata-q's target keeps a1 → b1 at %v; the test needs a move", want)
	}
	prev, prevMoved := 1.0, math.Inf(1)
	pushes := 0
	for i := range 20 {
		r, err = pl.Plan(slow)
		if err != nil {
			t.Fatal(err)
		}
		got := fraction(r.Allocation, "a1", "b1")
		if step := prev + DefaultStep*(want-prev); !r.Push {
			if got != step && math.Abs(got-step) > 1e-9 {
				t.Fatalf("recompute %d: held, but its allocation has a1 → b1 %v, not the step %v", i, got, step)
			}
			break
		} else if math.Abs(got-step) > 1e-9 {
			t.Fatalf("recompute %d: a1 → b1 %v, want %v (from %v, Step of the way to %v)", i, got, step, prev, want)
		}
		if !(r.Moved < prevMoved) {
			t.Fatalf("recompute %d moved %v, not less than the last push's %v", i, r.Moved, prevMoved)
		}
		if r.Gain < DefaultDamping {
			t.Fatalf("recompute %d pushed with a gain of %v < damping", i, r.Gain)
		}
		pl.Pushed(r)
		pushes++
		prev, prevMoved = got, r.Moved
	}
	if pushes == 0 || pushes > 8 {
		t.Fatalf("%d pushes before damping held; want 1–8", pushes)
	}
	if r.Push {
		t.Fatal("still pushing after 20 recomputes of the same topology")
	}
	// What is in force is within the damping threshold of the target's objective.
	m := compileTop(t, slow)
	_, inForce := applyFractions(m, ClosedLoop, fractionsOf(m, pl.last), nil)
	_, best := applyFractions(m, ClosedLoop, fractionsOf(m, target), nil)
	if inForce.total() > best.total()*(1+2*DefaultDamping) {
		t.Fatalf("held at objective %v, lata-q's plan %v: more than 2 %% off", inForce.total(), best.total())
	}
}

// TestClosedLoopOverloadTakesFullStep: when the routes in force would load a pod past its new
// service rate, the new plan is taken whole and pushed.
func TestClosedLoopOverloadTakesFullStep(t *testing.T) {
	pl := &Planner{Policy: ClosedLoop}
	r, err := pl.Plan(closedLoopPair(200, 200))
	if err != nil {
		t.Fatal(err)
	}
	pl.Pushed(r)
	slow := closedLoopPair(40, 200) // a1 sends b1 50 req/s: past 40
	r, err = pl.Plan(slow)
	if err != nil {
		t.Fatal(err)
	}
	target, err := Plan(compileTop(t, slow), LATAQ)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Push {
		t.Fatal("not pushed though the routes in force overload b1")
	}
	if got, want := fraction(r.Allocation, "a1", "b1"), fraction(target, "a1", "b1"); math.Abs(got-want) > 1e-9 {
		t.Fatalf("a1 → b1 %v, want lata-q's %v (the full step)", got, want)
	}
	if load := 100.0 / 2 * fraction(r.Allocation, "a1", "b1"); load > 0.9*40+1e-6 {
		t.Fatalf("b1 gets %v req/s from a1, over the cap of 0.9 × 40", load)
	}
}

// TestClosedLoopWithoutCapacityIsLATA: without a service rate closed-loop plans what lata plans
// and holds it (no capacity, nothing to step toward); b, never measured, is pooled (its callers
// balance least-request over its pods while the estimator learns it).
func TestClosedLoopWithoutCapacityIsLATA(t *testing.T) {
	top := closedLoopPair(0, 0)
	for i := range top.Services[1].Pods {
		top.Services[1].Pods[i].CapacityRPS = nil
	}
	pl := &Planner{Policy: ClosedLoop}
	r, err := pl.Plan(top)
	if err != nil {
		t.Fatal(err)
	}
	lata, err := Plan(compileTop(t, top), LATA)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"b1", "b2"} {
		if got, want := fraction(r.Allocation, "a1", q), fraction(lata, "a1", q); got != want {
			t.Errorf("a1 → %s %v, lata %v", q, got, want)
		}
	}
	if !slices.Equal(r.Allocation.Pooled, []string{"b"}) {
		t.Errorf("pooled %v, want [b] (never measured)", r.Allocation.Pooled)
	}
	pl.Pushed(r)
	if r, err = pl.Plan(top); err != nil || r.Push {
		t.Fatalf("the same topology again: push %v, err %v; want held", r.Push, err)
	}
}

// TestClosedLoopFallbackTakesLATA: when b loses its service rates (the model-error breaker
// tripped it), the closed loop takes lata's routes into b at once and pushes them, though
// lata-q's objective alone (no queueing term left for b, lata's balanced routes cost network)
// would hold the localised routes in force.
func TestClosedLoopFallbackTakesLATA(t *testing.T) {
	top := closedLoopPair(200, 200)
	top.Services[0].Pods[0].Weight = ptr(3.0) // a1 takes 75 req/s, a2 25
	pl := &Planner{Policy: ClosedLoop}
	r, err := pl.Plan(top)
	if err != nil {
		t.Fatal(err)
	}
	if f := fraction(r.Allocation, "a1", "b1"); f != 1 {
		t.Fatalf("idle: a1 → b1 %v, want 1 (lata-q localises far below capacity)", f)
	}
	pl.Pushed(r)
	lataTop := top.Clone()
	for i := range lataTop.Services[1].Pods {
		lataTop.Services[1].Pods[i].CapacityRPS = nil
	}
	lata, err := Plan(compileTop(t, lataTop), LATA)
	if err != nil {
		t.Fatal(err)
	}
	want := fraction(lata, "a1", "b1")
	if !(want < 0.9) {
		t.Fatalf("lata's a1 → b1 is %v; the test needs lata to balance (send part of a1's load to b2)", want)
	}
	if r, err = pl.Plan(lataTop); err != nil {
		t.Fatal(err)
	}
	if !r.Push {
		t.Fatalf("b fell back to lata, not pushed (moved %v, gain %v)", r.Moved, r.Gain)
	}
	if got := fraction(r.Allocation, "a1", "b1"); math.Abs(got-want) > 1e-9 {
		t.Errorf("a1 → b1 %v, want lata's %v (the full step)", got, want)
	}
	if r.Gain >= DefaultDamping {
		t.Errorf("gain %v: the objective alone would have pushed; the test shows nothing", r.Gain)
	}
	if len(r.Allocation.Pooled) > 0 {
		t.Errorf("pooled %v: b was measured before, so it falls back to lata, not to least-request", r.Allocation.Pooled)
	}
	pl.Pushed(r)
	if r, err = pl.Plan(lataTop); err != nil || r.Push {
		t.Fatalf("the same topology again: push %v, err %v; want held", r.Push, err)
	}
}

func compileTop(t *testing.T, top *Topology) *Model {
	t.Helper()
	m, err := Compile(top, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestClosedLoopPoolsNearSaturation: a callee service whose load reaches the utilisation cap of
// its capacity is pooled (least-request over all its pods), pushed at once; it stays pooled
// while its load is within PoolHysteresis under the cap and is banded again, pushed, below
// that. A service served from outside (a) is never pooled, however loaded.
func TestClosedLoopPoolsNearSaturation(t *testing.T) {
	at := func(rps float64) *Topology {
		top := closedLoopPair(100, 100) // b: Σμ = 200 req/s; the cap 0.9 is 180 req/s
		top.Ingress[0].RPS = rps
		top.Services[0].Pods[0].CapacityRPS = ptr(1.0) // a is far over its capacity: never pooled
		top.Services[0].Pods[1].CapacityRPS = ptr(1.0)
		return top
	}
	pl := &Planner{Policy: ClosedLoop}
	steps := []struct {
		rps    float64
		pooled bool
		push   bool // the pooling changed: pushed whatever the damping says
	}{
		{100, false, true},  // first plan: pushed, b at 0.5 of Σμ
		{170, false, false}, // 0.85: under the cap
		{185, true, true},   // 0.925 ≥ 0.9: pooled, pushed though the routes hardly move
		{165, true, false},  // 0.825: within the hysteresis, stays pooled
		{155, false, true},  // 0.775 < 0.8: banded again, pushed
		{175, false, false}, // 0.875: under the cap again, stays banded
	}
	for i, s := range steps {
		r, err := pl.Plan(at(s.rps))
		if err != nil {
			t.Fatal(err)
		}
		got := len(r.Allocation.Pooled) == 1 && r.Allocation.Pooled[0] == "b"
		if len(r.Allocation.Pooled) > 1 || (len(r.Allocation.Pooled) == 1 && !got) {
			t.Fatalf("step %d (%v req/s): pooled %v, want b at most", i, s.rps, r.Allocation.Pooled)
		}
		if got != s.pooled {
			t.Errorf("step %d (%v req/s): pooled %v, want b pooled = %v", i, s.rps, r.Allocation.Pooled, s.pooled)
		}
		if s.push && !r.Push {
			t.Errorf("step %d (%v req/s): not pushed; a change of pooling must be", i, s.rps)
		}
		if r.Push {
			pl.Pushed(r)
		}
	}
}
