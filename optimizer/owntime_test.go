package optimizer

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// ownTimeWorld: front (f-0 on n1, f-1 on n2; 60 req/s of ingress) calls back.shop (b-0 on n1
// at its own 100 req/s, weight 1; b-1 on n2 at the service's 20 req/s × weight 3 = 60), which
// also takes 20 req/s of ingress: 5 to b-0 and 15 to b-1 by weight.
func ownTimeWorld() *Topology {
	return &Topology{
		Nodes:   []Node{{Name: "n1"}, {Name: "n2"}},
		Latency: []Latency{{From: "n1", To: "n2", MS: 5}},
		Services: []Service{
			{Name: "front", Pods: []Pod{{Name: "f-0", Node: "n1"}, {Name: "f-1", Node: "n2"}}},
			{Name: "back", Namespace: "shop", CapacityRPS: ptr(20.0), Pods: []Pod{
				{Name: "b-0", Node: "n1", CapacityRPS: ptr(100.0)},
				{Name: "b-1", Node: "n2", Weight: ptr(3.0)},
			}},
		},
		Calls:   []Call{{From: "front", To: "back.shop"}},
		Ingress: []Ingress{{Service: "front", RPS: 60}, {Service: "back.shop", RPS: 20}},
	}
}

// ownTimeRoutes plans front → back.shop: f-0 sends 30 req/s to b-0; f-1 sends 10 to b-0 and
// toB1 to b-1.
func ownTimeRoutes(toB1 float64) *Allocation {
	return &Allocation{Policy: LATAQ, Calls: []CallAllocation{{From: "front", To: "back.shop", Routes: []Route{
		{Caller: "f-0", Callee: "b-0.shop", Fraction: 1, RPS: 30},
		{Caller: "f-1", Callee: "b-0.shop", Fraction: 10 / (10 + toB1), RPS: 10},
		{Caller: "f-1", Callee: "b-1.shop", Fraction: toB1 / (10 + toB1), RPS: toB1},
	}}}}
}

// TestPredictedOwnTimeMS checks the prediction against a hand computation: the request-weighted
// mean of each pod's M/M/1 sojourn 1000/(μ − ℓ) ms at its planned load ℓ (routes plus its
// share of the ingress by weight).
func TestPredictedOwnTimeMS(t *testing.T) {
	withFront := ownTimeWorld()
	withFront.Services[0].CapacityRPS = ptr(100.0)
	for _, tc := range []struct {
		name  string
		top   *Topology
		alloc *Allocation
		want  map[string]float64
	}{
		// b-0: 30 + 10 + 5 = 45 of 100 → 1000/55 ms; b-1: 20 + 15 = 35 of 60 → 1000/25 ms.
		// front has no service rate: no prediction.
		{"hand", ownTimeWorld(), ownTimeRoutes(20), map[string]float64{"back.shop": (45*1000/55.0 + 35*1000/25.0) / 80}},
		// front's pods take 30 of 100 each (ingress by weight): 1000/70 ms.
		{"ingress only", withFront, ownTimeRoutes(20), map[string]float64{
			"front": 1000 / 70.0, "back.shop": (45*1000/55.0 + 35*1000/25.0) / 80}},
		// b-1 planned at 45 + 15 = 60, its service rate: no finite sojourn, no prediction.
		{"a pod at its rate", ownTimeWorld(), ownTimeRoutes(45), map[string]float64{}},
		// back's pods request 2 cores: each is M/M/2, whose sojourn is 1/(μ₁(1 − ρ²)) with
		// μ₁ = μ/2, ρ = ℓ/μ (b-0: 45 of 100, b-1: 35 of 60); 2.1 cores (a sidecar's 0.1) too.
		{"two cores", withCPU(ownTimeWorld(), 2000), ownTimeRoutes(20), map[string]float64{
			"back.shop": (45*mm2(45, 100) + 35*mm2(35, 60)) / 80}},
		{"two cores and a sidecar", withCPU(ownTimeWorld(), 2100), ownTimeRoutes(20), map[string]float64{
			"back.shop": (45*mm2(45, 100) + 35*mm2(35, 60)) / 80}},
		// 1.4 cores: one server, M/M/1.
		{"one core and a bit", withCPU(ownTimeWorld(), 1400), ownTimeRoutes(20), map[string]float64{"back.shop": (45*1000/55.0 + 35*1000/25.0) / 80}},
		// No allocation: the ingress alone, b-0 at 5 of 100, b-1 at 15 of 60.
		{"no allocation", ownTimeWorld(), nil, map[string]float64{"back.shop": (5*1000/95.0 + 15*1000/45.0) / 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PredictedOwnTimeMS(tc.top, tc.alloc)
			if d := cmp.Diff(tc.want, got, cmpopts.EquateApprox(1e-12, 0)); d != "" {
				t.Errorf("predicted own time, ms (-want +got):\n%s", d)
			}
		})
	}
}

// TestPredictedOwnTimeMatchesQueueCost: on lata-q's own plan, each service's predicted own time
// times its load is that service's part of the plan's QueueCost (Σ 1000·ℓ/(μ−ℓ)).
func TestPredictedOwnTimeMatchesQueueCost(t *testing.T) {
	top := closedLoopPair(80, 200)
	a, err := Plan(compileTop(t, top), LATAQ)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Saturated) > 0 || !(a.QueueCost > 0) {
		t.Fatalf("lata-q's plan: saturated %v, queue cost %v; the test needs a plan with queueing", a.Saturated, a.QueueCost)
	}
	got := PredictedOwnTimeMS(top, a)
	if len(got) != 1 {
		t.Fatalf("predictions %v, want b's only (a has no service rate)", got)
	}
	if sum := got["b"] * 100; math.Abs(sum-a.QueueCost) > 1e-9*a.QueueCost {
		t.Errorf("b's predicted own time %.6g ms × 100 req/s = %.9g, want the plan's queue cost %.9g", got["b"], sum, a.QueueCost)
	}
}

// withCPU sets back.shop's CPU request, millicores.
func withCPU(t *Topology, milli int64) *Topology {
	t.Services[1].CPU = milli
	return t
}

// mm2 is the M/M/2 mean sojourn in ms of a pod of total rate mu at load l: 1/(μ₁(1 − ρ²)).
func mm2(l, mu float64) float64 {
	rho := l / mu
	return 1000 / (mu / 2 * (1 - rho*rho))
}
