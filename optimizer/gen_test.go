package optimizer

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// genConfig shapes a random topology.
type genConfig struct {
	nodes, services, maxPods, extraCalls int
	// weights draws random pod weights (integers 1..4, or fractional if fractional is set).
	weights, fractional bool
	// ties rounds latencies to a few values, so optima are degenerate.
	ties bool
}

// genTopology returns a random valid topology: a call DAG over services (a chain plus extra
// forward edges), pods on random nodes, and a random symmetric latency matrix with 3 decimals.
func genTopology(seed uint64, c genConfig) *Topology {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	t := &Topology{}
	for i := 0; i < c.nodes; i++ {
		t.Nodes = append(t.Nodes, Node{Name: fmt.Sprintf("n%d", i), CPU: 4000, Memory: 8192})
	}
	for u := 0; u < c.nodes; u++ {
		for v := u; v < c.nodes; v++ {
			ms := math.Round(r.Float64()*20000) / 1000
			if c.ties {
				ms = float64(r.IntN(3) * 5)
			}
			if u == v {
				if r.IntN(2) == 0 {
					continue // missing self latency = 0
				}
				ms = math.Round(r.Float64()*500) / 1000
			}
			t.Latency = append(t.Latency, Latency{From: t.Nodes[u].Name, To: t.Nodes[v].Name, MS: ms})
		}
	}
	for s := 0; s < c.services; s++ {
		svc := Service{Name: fmt.Sprintf("s%d", s), CPU: 100, Memory: 64}
		for p := 0; p < 1+r.IntN(c.maxPods); p++ {
			pod := Pod{Name: fmt.Sprintf("s%d-%d", s, p), Node: t.Nodes[r.IntN(c.nodes)].Name}
			if c.weights {
				w := float64(1 + r.IntN(4))
				if c.fractional {
					w = 0.05 + r.Float64()*3
				}
				pod.Weight = &w
			}
			svc.Pods = append(svc.Pods, pod)
		}
		t.Services = append(t.Services, svc)
	}
	for s := 0; s+1 < c.services; s++ {
		rate := math.Round((0.2+r.Float64()*2)*100) / 100
		t.Calls = append(t.Calls, Call{From: t.Services[s].Name, To: t.Services[s+1].Name, Rate: &rate})
	}
	seen := map[[2]int]bool{}
	for e := 0; e < c.extraCalls && c.services > 2; e++ {
		a := r.IntN(c.services - 2)
		b := a + 2 + r.IntN(c.services-a-2)
		if !seen[[2]int{a, b}] {
			seen[[2]int{a, b}] = true
			t.Calls = append(t.Calls, Call{From: t.Services[a].Name, To: t.Services[b].Name})
		}
	}
	t.Ingress = []Ingress{{Service: t.Services[0].Name, RPS: math.Round(1+r.Float64()*500) / 1}}
	return t
}
