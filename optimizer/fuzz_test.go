package optimizer

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/edgeflow/edgeflow/examples"
)

// checkAllocation holds any accepted topology's allocation to the contract: fractions sum to 1
// and balanced policies give every callee its share.
func checkAllocation(t *testing.T, m *Model) {
	for _, p := range Policies() {
		a, err := Plan(m, p)
		if err != nil {
			t.Fatalf("%s: Plan failed on a valid topology: %v", p, err)
		}
		if math.IsNaN(a.Cost) || math.IsInf(a.Cost, 0) || a.Cost < 0 {
			t.Fatalf("%s: cost %v", p, a.Cost)
		}
		for _, v := range edges(m, a) {
			checkFractions(t, string(p), v)
			if p != Localization {
				checkBalanced(t, string(p), v)
			}
		}
	}
}

// FuzzParseTopology feeds arbitrary text to the parser and, when it is accepted, to every policy.
func FuzzParseTopology(f *testing.F) {
	f.Add(examples.Bookinfo())
	f.Add(examples.DAG())
	f.Add([]byte(validTopology))
	f.Add([]byte(baselineTopology))
	f.Add([]byte(`{"nodes":[{"name":"n"}],"services":[{"name":"s","pods":[{"name":"p","node":"n","weight":1e308}]}]}`))
	f.Add([]byte("nodes: [{name: n}]\nservices: [{name: s, ports: [{port: 80, targetPort: 81}], pods: [{name: p, node: n, serviceAccount: sa}]}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		top, err := ParseTopology(bytes.NewReader(data), "fuzz")
		if err != nil {
			return
		}
		m, err := Compile(top, Options{})
		if err != nil {
			return
		}
		checkAllocation(t, m)
	})
}

// FuzzPlan builds small structured topologies from fuzz bytes (latencies, weights, placement,
// rates), so the fuzzer explores the solver's input rather than YAML syntax.
func FuzzPlan(f *testing.F) {
	f.Add([]byte{3, 2, 4, 1, 9, 0, 200, 7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add([]byte{1, 1, 1, 0, 0, 0, 0, 0})
	f.Add(bytes.Repeat([]byte{255}, 64))
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := int(data[0])
			data = data[1:]
			return b
		}
		top := &Topology{}
		nodes := 1 + next()%6
		for i := 0; i < nodes; i++ {
			top.Nodes = append(top.Nodes, Node{Name: fmt.Sprint("n", i)})
		}
		for u := 0; u < nodes; u++ {
			for v := u + 1; v < nodes; v++ {
				top.Latency = append(top.Latency, Latency{From: top.Nodes[u].Name, To: top.Nodes[v].Name, MS: float64(next()) / 4})
			}
		}
		services := 2 + next()%3
		for s := 0; s < services; s++ {
			svc := Service{Name: fmt.Sprint("s", s)}
			for p := 0; p < 1+next()%7; p++ {
				w := float64(next()%5) / 2
				svc.Pods = append(svc.Pods, Pod{Name: fmt.Sprintf("s%d-%d", s, p), Node: top.Nodes[next()%nodes].Name, Weight: &w})
			}
			top.Services = append(top.Services, svc)
			if s > 0 {
				rate := float64(next()) / 16
				top.Calls = append(top.Calls, Call{From: fmt.Sprint("s", next()%s), To: svc.Name, Rate: &rate})
			}
		}
		top.Ingress = []Ingress{{Service: "s0", RPS: float64(next() * 3)}}
		m, err := Compile(top, Options{})
		if err != nil {
			return // e.g. a service whose weights are all zero
		}
		checkAllocation(t, m)
	})
}
