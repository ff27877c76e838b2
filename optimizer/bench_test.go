package optimizer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// meshTopology is the whole-mesh benchmark input: services × ~podsPerService pods on nodes
// placed at random points of a 2-D plane (latency = 0.5 ms + distance, so it is a metric), and a
// random call DAG with callsPerService forward edges per service (~2 → ~400 edges for 200).
func meshTopology(seed uint64, nodes, services, podsPerService, callsPerService int) *Topology {
	r := rand.New(rand.NewPCG(seed, 1))
	t := &Topology{}
	xs, ys := make([]float64, nodes), make([]float64, nodes)
	for i := range nodes {
		t.Nodes = append(t.Nodes, Node{Name: fmt.Sprintf("node-%03d", i), CPU: 16000, Memory: 65536})
		xs[i], ys[i] = r.Float64()*40, r.Float64()*40
	}
	for u := range nodes {
		for v := u + 1; v < nodes; v++ {
			d := math.Hypot(xs[u]-xs[v], ys[u]-ys[v])
			t.Latency = append(t.Latency, Latency{From: t.Nodes[u].Name, To: t.Nodes[v].Name, MS: math.Round((0.5+d)*1000) / 1000})
		}
	}
	for s := range services {
		svc := Service{Name: fmt.Sprintf("svc-%03d", s), CPU: 200, Memory: 128}
		for p := range podsPerService - 2 + r.IntN(5) {
			svc.Pods = append(svc.Pods, Pod{Name: fmt.Sprintf("svc-%03d-%d", s, p), Node: t.Nodes[r.IntN(nodes)].Name})
		}
		t.Services = append(t.Services, svc)
	}
	seen := map[[2]int]bool{}
	for s := 0; s < services-1; s++ {
		for range callsPerService {
			to := s + 1 + r.IntN(min(services-s-1, 20))
			if !seen[[2]int{s, to}] {
				seen[[2]int{s, to}] = true
				t.Calls = append(t.Calls, Call{From: t.Services[s].Name, To: t.Services[to].Name})
			}
		}
	}
	for s := 0; s < services; s += 20 {
		t.Ingress = append(t.Ingress, Ingress{Service: t.Services[s].Name, RPS: 100})
	}
	return t
}

// BenchmarkPlanMesh is a full recompute of a whole mesh: 200 services × ~10 pods on 100 nodes,
// ~400 call edges. "recompute" validates and indexes the topology and solves every edge; "solve"
// is Plan alone on an already compiled model.
func BenchmarkPlanMesh(b *testing.B) {
	top := meshTopology(1, 100, 200, 10, 2)
	m, err := Compile(top, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("mesh: %d nodes, %d services, %d call edges", len(m.Nodes), len(m.Services), len(m.Calls))
	b.Run("recompute", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m, err := Compile(top, Options{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := Plan(m, LATA); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("solve", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Plan(m, LATA); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// replicaTopology is two services with many replicas on few nodes: callers × callees pods
// spread over nodes (on random points of a plane, as meshTopology), one call edge.
func replicaTopology(seed uint64, nodes, callers, callees int) *Topology {
	r := rand.New(rand.NewPCG(seed, 2))
	t := meshTopology(seed, nodes, 0, 0, 0)
	for s, pods := range []int{callers, callees} {
		svc := Service{Name: fmt.Sprintf("svc-%d", s)}
		for p := range pods {
			svc.Pods = append(svc.Pods, Pod{Name: fmt.Sprintf("svc-%d-%d", s, p), Node: t.Nodes[r.IntN(nodes)].Name})
		}
		t.Services = append(t.Services, svc)
	}
	t.Calls = []Call{{From: "svc-0", To: "svc-1"}}
	t.Ingress = []Ingress{{Service: "svc-0", RPS: 1000}}
	return t
}

// BenchmarkPlanManyReplicas is one call edge between 2000 caller and 2000 callee pods on 20
// nodes: the solve works on nodes, so its memory does not grow with pods × pods.
func BenchmarkPlanManyReplicas(b *testing.B) {
	m, err := Compile(replicaTopology(1, 20, 2000, 2000), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Plan(m, LATA); err != nil {
			b.Fatal(err)
		}
	}
}
