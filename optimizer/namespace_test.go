package optimizer

import (
	"strings"
	"testing"
)

// Two namespaces may hold services and pods of the same name; they are told apart by Key and
// PodKey, and default-namespace names read exactly as before.
const namespacedTopology = `
nodes: [{name: n1}, {name: n2}]
latency: [{from: n1, to: n2, ms: 4}]
services:
  - {name: web, pods: [{name: web-0, node: n1}, {name: web-1, node: n2}]}
  - name: reviews
    namespace: shop
    ports: [{name: http, port: 9080, target_port: 8080}]
    pods: [{name: r-0, node: n1, ip: 10.1.0.1}, {name: r-1, node: n2, ip: 10.1.0.2}]
  - name: reviews
    namespace: blog
    ports: [{port: 80}]
    pods: [{name: r-0, node: n2, ip: 10.2.0.1}]
calls: [{from: web, to: reviews.shop}, {from: web.default, to: reviews.blog, rate: 0.5}]
ingress: [{service: web, rps: 10}]
`

func TestNamespaces(t *testing.T) {
	top, err := ParseTopology(strings.NewReader(namespacedTopology), "ns.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Compile(top, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, s := range m.Services {
		keys = append(keys, s.Name)
	}
	if got, want := strings.Join(keys, " "), "web reviews.shop reviews.blog"; got != want {
		t.Errorf("service keys %q, want %q", got, want)
	}
	if got := m.Services[1].Pods[0].Name; got != "r-0.shop" {
		t.Errorf("pod key %q, want r-0.shop", got)
	}
	if _, ok := m.ServiceIndex("web.default"); !ok {
		t.Error(`"web.default" does not name the default-namespace service web`)
	}
	shop := &top.Services[1]
	if got, want := shop.IstioClusterName(9080, ""), "outbound|9080||reviews.shop.svc.cluster.local"; got != want {
		t.Errorf("IstioClusterName = %q, want %q", got, want)
	}
	if got, want := top.Services[0].IstioClusterName(80, ""), "outbound|80||web.default.svc.cluster.local"; got != want {
		t.Errorf("IstioClusterName = %q, want %q", got, want)
	}
	if got, want := shop.IstioClusterName(9080, "edge.example"), "outbound|9080||reviews.shop.svc.edge.example"; got != want {
		t.Errorf("IstioClusterName with a cluster domain = %q, want %q", got, want)
	}
	if got := shop.Endpoint(&shop.Pods[0]); got != "10.1.0.1:8080" {
		t.Errorf("Endpoint = %q, want the target port 10.1.0.1:8080", got)
	}
	blog := &top.Services[2]
	if got := blog.Endpoint(&blog.Pods[0]); got != "10.2.0.1:80" {
		t.Errorf("Endpoint = %q, want the service port when no target port: 10.2.0.1:80", got)
	}
	a, err := Plan(m, LATA)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range a.Calls {
		for _, r := range c.Routes {
			if c.To == "reviews.blog" && r.Callee != "r-0.blog" {
				t.Errorf("route to %s names callee %q", c.To, r.Callee)
			}
		}
	}
	if len(a.Calls) != 2 {
		t.Fatalf("%d call allocations, want 2", len(a.Calls))
	}
}

func TestNamespaceRejects(t *testing.T) {
	cases := []struct{ name, src, want string }{
		{"duplicate in namespace", `
nodes: [{name: n1}]
services: [{name: a, namespace: x, pods: [{name: a-0, node: n1}]}, {name: a, namespace: x, pods: [{name: a-1, node: n1}]}]`,
			`service "a.x": duplicate name`},
		{"default spelled out is the same service", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}, {name: a, namespace: default, pods: [{name: a-1, node: n1}]}]`,
			`service "a": duplicate name`},
		{"dot in namespace", `
nodes: [{name: n1}]
services: [{name: a, namespace: x.y, pods: [{name: a-0, node: n1}]}]`, `namespace "x.y" contains a dot`},
		{"port out of range", `
nodes: [{name: n1}]
services: [{name: a, namespace: x, ports: [{port: 70000}], pods: [{name: a-0, node: n1}]}]`,
			`service "a.x": ports[0]: port 70000 (target 0) out of range`},
		{"duplicate port name", `
nodes: [{name: n1}]
services: [{name: a, ports: [{name: http, port: 80}, {name: http, port: 81}], pods: [{name: a-0, node: n1}]}]`,
			`service "a": ports[1]: duplicate port name "http"`},
		{"duplicate pod in one namespace", `
nodes: [{name: n1}]
services: [{name: a, namespace: x, pods: [{name: p, node: n1}]}, {name: b, namespace: x, pods: [{name: p, node: n1}]}]`,
			`pod "p.x": duplicate name (in services "a.x" and "b.x")`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			top, err := ParseTopology(strings.NewReader(tc.src), "bad.yaml")
			if err == nil {
				_, err = Compile(top, Options{})
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
