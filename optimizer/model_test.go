package optimizer

import (
	"errors"
	"math"
	"strings"
	"testing"
)

const validTopology = `
nodes: [{name: n1}, {name: n2}]
latency: [{from: n1, to: n2, ms: 4}]
services:
  - {name: a, pods: [{name: a-0, node: n1}, {name: a-1, node: n2}]}
  - {name: b, pods: [{name: b-0, node: n2}]}
calls: [{from: a, to: b}]
ingress: [{service: a, rps: 10}]
`

func TestCompileRejects(t *testing.T) {
	cases := []struct {
		name, src, want string
		opts            Options
	}{
		{"unknown pod node", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n9}]}]`, `pod "a-0" (service "a"): unknown node "n9"`, Options{}},
		{"unknown latency node", `
nodes: [{name: n1}]
latency: [{from: n1, to: n7, ms: 1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]`, `unknown node "n7"`, Options{}},
		{"unknown call service", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]
calls: [{from: a, to: ghost}]`, `calls[0] a → ghost: unknown service "ghost"`, Options{}},
		{"negative cores", `
nodes: [{name: n1, cores: -2}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]`, `node "n1": cores -2 outside [0, 65536]`, Options{}},
		{"duplicate node", `
nodes: [{name: n1}, {name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]`, `node "n1": duplicate name`, Options{}},
		{"duplicate service", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}, {name: a, pods: [{name: a-1, node: n1}]}]`, `service "a": duplicate name`, Options{}},
		{"duplicate pod", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: x, node: n1}]}, {name: b, pods: [{name: x, node: n1}]}]`, `pod "x": duplicate name (in services "a" and "b")`, Options{}},
		{"duplicate call", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}, {name: b, pods: [{name: b-0, node: n1}]}]
calls: [{from: a, to: b}, {from: a, to: b}]`, `call a → b: duplicate call edge`, Options{}},
		{"cycle", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}, {name: b, pods: [{name: b-0, node: n1}]}, {name: c, pods: [{name: c-0, node: n1}]}]
calls: [{from: a, to: b}, {from: b, to: c}, {from: c, to: b}]`, `calls form a cycle: b → c → b`, Options{}},
		{"self call", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]
calls: [{from: a, to: a}]`, `calls form a cycle: a → a`, Options{}},
		{"negative latency", `
nodes: [{name: n1}, {name: n2}]
latency: [{from: n1, to: n2, ms: -3}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]`, `latency n1 → n2: ms is negative (-3)`, Options{}},
		{"NaN latency", `
nodes: [{name: n1}, {name: n2}]
latency: [{from: n1, to: n2, ms: .nan}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]`, `latency n1 → n2: ms is NaN`, Options{}},
		{"infinite latency", `
nodes: [{name: n1}, {name: n2}]
latency: [{from: n1, to: n2, ms: .inf}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]`, `latency n1 → n2: ms is infinite`, Options{}},
		{"huge latency", `
nodes: [{name: n1}, {name: n2}]
latency: [{from: n1, to: n2, ms: 1e9}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]`, `exceeds the maximum`, Options{}},
		{"duplicate latency", `
nodes: [{name: n1}, {name: n2}]
latency: [{from: n1, to: n2, ms: 1}, {from: n1, to: n2, ms: 2}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]`, `latency n1 → n2: duplicate entry`, Options{}},
		{"negative rps", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]
ingress: [{service: a, rps: -1}]`, `ingress to "a": rps is negative`, Options{}},
		{"NaN rps", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]
ingress: [{service: a, rps: .nan}]`, `ingress to "a": rps is NaN`, Options{}},
		{"negative rate", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}, {name: b, pods: [{name: b-0, node: n1}]}]
calls: [{from: a, to: b, rate: -0.5}]`, `call a → b: rate is negative`, Options{}},
		{"infinite rate", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}, {name: b, pods: [{name: b-0, node: n1}]}]
calls: [{from: a, to: b, rate: .inf}]`, `call a → b: rate is infinite`, Options{}},
		{"negative weight", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1, weight: -1}, {name: a-1, node: n1}]}]`, `pod "a-0" (service "a"): weight is negative`, Options{}},
		{"pod without node", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0}]}]`, `pod "a-0" (service "a"): no node`, Options{}},
		{"zero total weight", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1, weight: 0}]}]`, `service "a": total pod weight is zero`, Options{}},
		{"service without pods", `
nodes: [{name: n1}]
services: [{name: a}]`, `service "a": no pods`, Options{}},
		{"missing latency pair", `
nodes: [{name: n1}, {name: n2}, {name: n3}]
latency: [{from: n1, to: n2, ms: 1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]`, `latency: no entry for n1 ↔ n3, n2 ↔ n3`, Options{}},
		{"bad default latency", `
nodes: [{name: n1}, {name: n2}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]`, `default latency -1 ms`, Options{DefaultLatencyMS: ptr(-1.0)}},
		{"ingress to unknown service", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]
ingress: [{service: b, rps: 5}]`, `ingress[0]: unknown service "b"`, Options{}},
		{"no nodes", `
services: [{name: a, pods: [{name: a-0, node: n1}]}]`, `no nodes`, Options{}},
		{"absurd replicas", `
nodes: [{name: n1}]
services: [{name: a, replicas: 1000000000}]`, `service "a": replicas 1000000000 outside [0, 100000]`, Options{Unplaced: true}},
		{"replicas mismatch", `
nodes: [{name: n1}]
services: [{name: a, replicas: 2, pods: [{name: a-0}]}]`, `1 pods listed but replicas is 2`, Options{Unplaced: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			top, err := ParseTopology(strings.NewReader(c.src), "test.yaml")
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			_, err = Compile(top, c.opts)
			if err == nil {
				t.Fatalf("Compile accepted it; want an error containing %q", c.want)
			}
			if !errors.Is(err, ErrInvalidTopology) {
				t.Errorf("error %v does not wrap ErrInvalidTopology", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error\n  %v\nwant it to name %q", err, c.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestParseRejects(t *testing.T) {
	cases := map[string]string{
		"unknown field":  "nodes: [{name: n1, zone: z}]\n",
		"wrong type":     "nodes: [{name: n1, cpu: lots}]\n",
		"empty":          "  \n",
		"two documents":  "nodes: []\n---\nnodes: []\n",
		"not a mapping":  "- a\n- b\n",
		"truncated json": `{"nodes": [{"name": "n1"}`,
	}
	for name, src := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseTopology(strings.NewReader(src), "bad.yaml"); err == nil || !strings.Contains(err.Error(), "bad.yaml") {
				t.Fatalf("got %v, want an error naming bad.yaml", err)
			}
		})
	}
}

func TestCompileAcceptsJSONAndDefaults(t *testing.T) {
	src := `{"nodes": [{"name": "n1"}, {"name": "n2"}, {"name": "n3"}],
	 "latency": [{"from": "n2", "to": "n1", "ms": 4}],
	 "services": [{"name": "a", "pods": [{"name": "a-0", "node": "n1"}]},
	              {"name": "b", "pods": [{"name": "b-0", "node": "n2"}, {"name": "b-1", "node": "n3", "weight": 3}]}],
	 "calls": [{"from": "a", "to": "b", "rate": 2}],
	 "ingress": [{"service": "a", "rps": 10}, {"service": "a", "rps": 5}]}`
	top, err := ParseTopology(strings.NewReader(src), "t.json")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Compile(top, Options{DefaultLatencyMS: ptr(20.0)})
	if err != nil {
		t.Fatal(err)
	}
	n1, _ := m.NodeIndex("n1")
	n2, _ := m.NodeIndex("n2")
	n3, _ := m.NodeIndex("n3")
	for _, c := range []struct {
		u, v int
		want float64
	}{{n1, n2, 4}, {n2, n1, 4}, {n1, n1, 0}, {n1, n3, 20}, {n3, n2, 20}} {
		if got := m.Latency.At(c.u, c.v); got != c.want {
			t.Errorf("latency %d→%d = %v, want %v", c.u, c.v, got, c.want)
		}
	}
	b, _ := m.ServiceIndex("b")
	if got := m.Services[b].Load; got != 30 {
		t.Errorf("load of b = %v, want (10+5)×2 = 30", got)
	}
	if w := m.Services[b].TotalWeight(); w != 4 {
		t.Errorf("total weight of b = %v, want 4", w)
	}
}

func TestLoadsFollowTheCallDAG(t *testing.T) {
	m := mustCompile(t, `
nodes: [{name: n1}]
services:
  - {name: a, pods: [{name: a-0, node: n1}]}
  - {name: b, pods: [{name: b-0, node: n1}]}
  - {name: c, pods: [{name: c-0, node: n1}]}
  - {name: d, pods: [{name: d-0, node: n1}]}
calls: [{from: c, to: d, rate: 3}, {from: a, to: b, rate: 2}, {from: b, to: d}, {from: a, to: c, rate: 0.5}]
ingress: [{service: a, rps: 100}, {service: c, rps: 10}]
`)
	want := map[string]float64{"a": 100, "b": 200, "c": 60, "d": 200 + 180}
	for _, s := range m.Services {
		if math.Abs(s.Load-want[s.Name]) > 1e-9 {
			t.Errorf("load of %s = %v, want %v", s.Name, s.Load, want[s.Name])
		}
	}
}

func TestLargestRemainder(t *testing.T) {
	cases := []struct {
		w     []float64
		total int64
		want  []int64
	}{
		{[]float64{1, 1, 1}, 10, []int64{4, 3, 3}},
		{[]float64{0.7, 0.2, 0.1}, 10000, []int64{7000, 2000, 1000}},
		{[]float64{1, 0, 2}, 7, []int64{2, 0, 5}},
		{[]float64{0, 0}, 5, []int64{0, 0}},
		{[]float64{1e-12, 1}, 3, []int64{0, 3}},
	}
	for _, c := range cases {
		got := LargestRemainder(c.w, c.total)
		var sum int64
		for i := range got {
			sum += got[i]
			if got[i] != c.want[i] {
				t.Errorf("LargestRemainder(%v, %d) = %v, want %v", c.w, c.total, got, c.want)
				break
			}
		}
		if c.want[0]+c.want[len(c.want)-1] > 0 && sum != c.total {
			t.Errorf("LargestRemainder(%v, %d) sums to %d", c.w, c.total, sum)
		}
	}
}

func TestNodeCoreCount(t *testing.T) {
	t.Parallel()
	top, err := ParseTopology(strings.NewReader(`
nodes:
  - {name: given, cpu: 4000, cores: 2}
  - {name: from-cpu, cpu: 3500}
  - {name: whole, cpu: 4000}
  - {name: unknown}
services: [{name: a, pods: [{name: a-0, node: given}]}]`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Compile(top, Options{DefaultLatencyMS: ptr(1.0)}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{2, 4, 4, 0} {
		if got := top.Nodes[i].CoreCount(); got != want {
			t.Errorf("node %s: %d cores, want %d", top.Nodes[i].Name, got, want)
		}
	}
}
