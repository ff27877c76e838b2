package optimizer

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/edgeflow/edgeflow/examples"
)

func bookinfo(t testing.TB) *Topology {
	t.Helper()
	top, err := ParseTopology(bytes.NewReader(examples.Bookinfo()), "bookinfo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return top
}

// jittered returns t with every latency multiplied by a factor drawn uniformly from
// [1−j, 1+j].
func jittered(t *Topology, rng *rand.Rand, j float64) *Topology {
	c := t.Clone()
	for i := range c.Latency {
		c.Latency[i].MS *= 1 - j + 2*j*rng.Float64()
	}
	return c
}

// push plans t and, if the planner says so, records it as pushed.
func push(t *testing.T, pl *Planner, top *Topology) *PlanResult {
	t.Helper()
	r, err := pl.Plan(top)
	if err != nil {
		t.Fatal(err)
	}
	if r.Push {
		pl.Pushed(r)
	}
	return r
}

func TestPlannerDamping(t *testing.T) {
	base := bookinfo(t)
	pl := &Planner{}
	if r := push(t, pl, base); !r.Push || !r.MembershipChanged {
		t.Fatalf("first plan: push %v, membership changed %v; want both", r.Push, r.MembershipChanged)
	}
	if r := push(t, pl, base.Clone()); r.Push || r.Moved != 0 {
		t.Errorf("the same topology again: push %v, moved %v; want suppressed, 0", r.Push, r.Moved)
	}
	// Every latency from n1 ×10: LATA moves traffic off n1's paths.
	far := base.Clone()
	for i := range far.Latency {
		if far.Latency[i].From == "n1" {
			far.Latency[i].MS *= 10
		}
	}
	if r := push(t, pl, far); !r.Push || r.Moved < DefaultDamping || r.MembershipChanged {
		t.Errorf("a large latency change: push %v, moved %v, membership %v; want pushed", r.Push, r.Moved, r.MembershipChanged)
	}
	// A pod more is membership: pushed whatever moves.
	more := far.Clone()
	more.Services[1].Pods = append(more.Services[1].Pods, Pod{Name: "details-9", Node: "n4"})
	if r := push(t, pl, more); !r.Push || !r.MembershipChanged {
		t.Errorf("a new pod: push %v, membership %v; want pushed as membership", r.Push, r.MembershipChanged)
	}
	// Negative damping pushes every recompute.
	always := &Planner{Damping: -1}
	push(t, always, base)
	if r := push(t, always, base); !r.Push {
		t.Errorf("damping −1: the same topology was not pushed")
	}
}

// Moved is the fraction of the traffic whose route changed, against the last push: drift that
// adds up is pushed once it reaches the threshold.
func TestPlannerMovedMeasuresAgainstLastPush(t *testing.T) {
	a := &Allocation{Calls: []CallAllocation{{From: "a", To: "b", Routes: []Route{
		{Caller: "a-0", Callee: "b-0", Fraction: 1, RPS: 60},
		{Caller: "a-1", Callee: "b-1", Fraction: 1, RPS: 40},
	}}}}
	b := &Allocation{Calls: []CallAllocation{{From: "a", To: "b", Routes: []Route{
		{Caller: "a-0", Callee: "b-0", Fraction: 0.9, RPS: 54},
		{Caller: "a-0", Callee: "b-1", Fraction: 0.1, RPS: 6},
		{Caller: "a-1", Callee: "b-1", Fraction: 1, RPS: 40},
	}}}}
	if got := moved(a, b); got < 0.0599 || got > 0.0601 {
		t.Errorf("moved = %v, want 0.06 (6 of 100 req/s)", got)
	}
	if got := moved(b, a); got < 0.0599 || got > 0.0601 {
		t.Errorf("moved back = %v, want 0.06", got)
	}
	if got := moved(a, a); got != 0 {
		t.Errorf("moved(a, a) = %v", got)
	}
}

// Raw ±10 % latency jitter straight into the planner (no averaging window, no hysteresis):
// LATA's optimum flips often, and damping holds back the flips that are only ties broken the
// other way. (The whole input path — Prometheus's window, the source's hysteresis, damping —
// is tested in e2e/live: TestNoisyLatencyNoPushStorm.)
func TestPlannerJitterNoStorm(t *testing.T) {
	base := bookinfo(t)
	rng := rand.New(rand.NewPCG(1, 2))
	damped, undamped := &Planner{}, &Planner{Damping: -1}
	push(t, damped, base)
	push(t, undamped, base)
	var pushes, changes int
	var last *Allocation
	for range 60 {
		top := jittered(base, rng, 0.10)
		if r := push(t, damped, top); r.Push {
			pushes++
		}
		r := push(t, undamped, top)
		if last != nil && moved(last, r.Allocation) > 0 {
			changes++
		}
		last = r.Allocation
	}
	t.Logf("60 jittered recomputes: %d changed the weights, %d pushed with damping", changes, pushes)
	if pushes >= changes {
		t.Errorf("damping pushed %d of the %d recomputes that changed the weights", pushes, changes)
	}
}
