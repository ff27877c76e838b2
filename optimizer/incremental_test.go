package optimizer

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// mutate applies one random change to t (a copy): a latency pair, a call rate, an ingress rate,
// a pod added or removed, or a pod weight. It says what it did.
func mutate(t *Topology, r *rand.Rand) (*Topology, string) {
	c := t.Clone()
	switch r.IntN(6) {
	case 0, 1:
		i := r.IntN(len(c.Latency))
		c.Latency[i].MS = float64(r.IntN(20000)) / 1000
		return c, "latency " + c.Latency[i].From + "–" + c.Latency[i].To
	case 2:
		if len(c.Calls) == 0 {
			return c, "nothing"
		}
		k := r.IntN(len(c.Calls))
		v := 0.5 + r.Float64()
		c.Calls[k].Rate = &v
		return c, "rate " + c.Calls[k].From + "→" + c.Calls[k].To
	case 3:
		if len(c.Ingress) == 0 {
			return c, "nothing"
		}
		c.Ingress[0].RPS = 50 + float64(r.IntN(200))
		return c, "ingress"
	case 4:
		s := &c.Services[r.IntN(len(c.Services))]
		if len(s.Pods) > 1 && r.IntN(2) == 0 {
			s.Pods = s.Pods[:len(s.Pods)-1]
			return c, "pod removed from " + s.Name
		}
		p := s.Pods[0]
		p.Name = fmt.Sprintf("%s-x%d", s.Name, r.IntN(1e6))
		p.Node = c.Nodes[r.IntN(len(c.Nodes))].Name
		s.Pods = append(s.Pods, p)
		return c, "pod added to " + s.Name
	default:
		s := &c.Services[r.IntN(len(c.Services))]
		w := float64(1 + r.IntN(4))
		s.Pods[r.IntN(len(s.Pods))].Weight = &w
		return c, "weight in " + s.Name
	}
}

// The incremental recompute gives exactly what Compile and Plan give, after every change of a
// random sequence, for every policy; a single latency change re-solves only the edges it
// touches.
func TestPlannerIncrementalEqualsFull(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		base := genTopology(seed, genConfig{nodes: 6, services: 8, maxPods: 4, extraCalls: 6, weights: seed%2 == 0})
		base.Ingress = []Ingress{{Service: base.Services[0].Name, RPS: 100}}
		if seed%3 == 0 {
			base = withCapacities(t, base, seed, func(r *rand.Rand) float64 { return 1.2 + r.Float64() }, seed%2 == 0)
		}
		for _, p := range Policies() {
			r := rand.New(rand.NewPCG(seed, 99))
			pl := &Planner{Policy: p, Damping: -1}
			top := base
			for step := 0; step < 12; step++ {
				what := "start"
				if step > 0 {
					top, what = mutate(top, r)
				}
				got, err := pl.Plan(top)
				m, cerr := Compile(top, Options{})
				if cerr != nil {
					if err == nil {
						t.Fatalf("seed %d %s step %d (%s): planner accepted what Compile rejects: %v", seed, p, step, what, cerr)
					}
					break // e.g. lata-q over capacity after a rate change: both reject it
				}
				want, werr := Plan(m, p)
				if (err != nil) != (werr != nil) {
					t.Fatalf("seed %d %s step %d (%s): planner error %v, Plan error %v", seed, p, step, what, err, werr)
				}
				if werr != nil {
					break
				}
				if pl.inc.key != membershipKey(top) {
					t.Fatalf("seed %d %s step %d (%s): the membership key kept by part differs from one computed afresh", seed, p, step, what)
				}
				// Pooling is the Planner's (closed-loop, TestClosedLoopPoolsNearSaturation), not Plan's.
				ga := *got.Allocation
				ga.Pooled = nil
				if !reflect.DeepEqual(&ga, want) {
					t.Fatalf("seed %d %s step %d (%s): incremental allocation differs from a full one (solved %d, recompiled %v)",
						seed, p, step, what, got.Solved, got.Recompiled)
				}
			}
		}
	}
}

func TestPlannerIncrementalSolvesOnlyTouchedEdges(t *testing.T) {
	top := meshTopology(1, 100, 200, 10, 2)
	pl := &Planner{Damping: -1}
	first, err := pl.Plan(top)
	if err != nil {
		t.Fatal(err)
	}
	if first.Solved != len(first.Model.Calls) || first.Recompiled {
		t.Fatalf("first plan solved %d of %d edges (recompiled %v)", first.Solved, len(first.Model.Calls), first.Recompiled)
	}
	next := top.Clone()
	next.Latency[0].MS *= 2
	res, err := pl.Plan(next)
	if err != nil {
		t.Fatal(err)
	}
	// The edges whose callers and callees sit on the two nodes of that pair.
	u, _ := res.Model.NodeIndex(next.Latency[0].From)
	v, _ := res.Model.NodeIndex(next.Latency[0].To)
	touched := 0
	nodes := serviceNodes(res.Model)
	on := func(s, n int) bool {
		for _, x := range nodes[s] {
			if x == n {
				return true
			}
		}
		return false
	}
	for _, e := range res.Model.Calls {
		if on(e.From, u) && on(e.To, v) || on(e.From, v) && on(e.To, u) {
			touched++
		}
	}
	t.Logf("one latency pair changed: %d of %d edges re-solved (%d touch the pair), recompiled %v", res.Solved, len(res.Model.Calls), touched, res.Recompiled)
	if !res.Recompiled || res.Solved != touched {
		t.Errorf("re-solved %d edges, want the %d that touch the pair; recompiled %v", res.Solved, touched, res.Recompiled)
	}
}

// BenchmarkPlanMeshIncremental: one change on the 200-service mesh (100 nodes) — a latency
// pair, a call rate, a pod added — against a full recompute (Compile + Plan) of the same
// topology, interleaved. Reports the median of each and the ratio.
func BenchmarkPlanMeshIncremental(b *testing.B) {
	base := meshTopology(1, 100, 200, 10, 2)
	r := rand.New(rand.NewPCG(5, 5))
	changes := map[string]func(*Topology) *Topology{
		"latency": func(t *Topology) *Topology {
			c := t.Clone()
			i := r.IntN(len(c.Latency))
			c.Latency[i].MS = 0.5 + r.Float64()*50
			return c
		},
		"rate": func(t *Topology) *Topology {
			c := t.Clone()
			v := 0.5 + r.Float64()
			c.Calls[r.IntN(len(c.Calls))].Rate = &v
			return c
		},
		"pod": func(t *Topology) *Topology {
			c := t.Clone()
			s := &c.Services[r.IntN(len(c.Services))]
			p := s.Pods[0]
			p.Name = fmt.Sprintf("%s-x%d", s.Name, r.IntN(1e9))
			s.Pods = append(s.Pods, p)
			return c
		},
	}
	for _, name := range []string{"latency", "rate", "pod"} {
		change := changes[name]
		b.Run(name, func(b *testing.B) {
			pl := &Planner{Damping: -1}
			if _, err := pl.Plan(base); err != nil {
				b.Fatal(err)
			}
			cur := base
			var inc, full []time.Duration
			solved := 0
			for b.Loop() {
				next := change(cur)
				t0 := time.Now()
				res, err := pl.Plan(next)
				if err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				m, err := Compile(next, Options{})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Plan(m, LATA); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				inc, full = append(inc, t1.Sub(t0)), append(full, t2.Sub(t1))
				solved += res.Solved
				cur = next
			}
			mi, mf := median(inc), median(full)
			b.ReportMetric(float64(mi.Microseconds()), "µs-incremental")
			b.ReportMetric(float64(mf.Microseconds()), "µs-full")
			b.ReportMetric(float64(mi)/float64(mf), "ratio")
			b.ReportMetric(float64(solved)/float64(len(inc)), "edges-solved")
		})
	}
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s[len(s)/2]
}

// A pod added under a name another service already uses is rejected as Compile rejects it,
// also on the incremental path; the planner keeps working afterwards.
func TestPlannerIncrementalDuplicatePod(t *testing.T) {
	top := genTopology(3, genConfig{nodes: 4, services: 4, maxPods: 3, extraCalls: 2})
	pl := &Planner{Damping: -1}
	if _, err := pl.Plan(top); err != nil {
		t.Fatal(err)
	}
	dup := top.Clone()
	p := dup.Services[0].Pods[0]
	dup.Services[1].Pods = append(dup.Services[1].Pods, p)
	_, werr := Compile(dup, Options{})
	if _, err := pl.Plan(dup); err == nil || werr == nil || err.Error() != werr.Error() {
		t.Fatalf("planner error %v, Compile error %v: want the same error", err, werr)
	}
	next := top.Clone()
	next.Latency[0].MS += 1
	res, err := pl.Plan(next)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := Compile(next, Options{})
	want, _ := Plan(m, LATA)
	if !reflect.DeepEqual(res.Allocation, want) {
		t.Errorf("after a rejected topology the planner differs from a full plan")
	}
}
