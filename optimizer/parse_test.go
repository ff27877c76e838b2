package optimizer

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The keys targetPort and serviceAccount, camelCase, were the topology file's before
// target_port and service_account: a file written with them loads as one with the new keys.
func TestParseFormerKeys(t *testing.T) {
	const (
		current = `
nodes: [{name: n1}]
services:
  - name: a
    ports: [{name: http, port: 80, target_port: 8080}, {port: 81}]
    pods: [{name: a-0, node: n1, service_account: web}, {name: a-1, node: n1}]
`
		former = `
nodes: [{name: n1}]
services:
  - name: a
    ports: [{name: http, port: 80, targetPort: 8080}, {port: 81}]
    pods: [{name: a-0, node: n1, serviceAccount: web}, {name: a-1, node: n1}]
`
		formerJSON = `{"nodes": [{"name": "n1"}], "services": [{"name": "a",
  "ports": [{"name": "http", "port": 80, "targetPort": 8080}, {"port": 81}],
  "pods": [{"name": "a-0", "node": "n1", "serviceAccount": "web"}, {"name": "a-1", "node": "n1"}]}]}`
	)
	want, err := ParseTopology(strings.NewReader(current), "current.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p, pd := want.Services[0].Ports[0], want.Services[0].Pods[0]; p.TargetPort != 8080 || pd.ServiceAccount != "web" {
		t.Fatalf("target_port %d, service_account %q: want 8080, web", p.TargetPort, pd.ServiceAccount)
	}
	for name, src := range map[string]string{"yaml": former, "json": formerJSON} {
		t.Run(name, func(t *testing.T) {
			got, err := ParseTopology(strings.NewReader(src), "former")
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("the former keys read otherwise than the new (-new +former):\n%s", d)
			}
		})
	}
}

// Giving an item both the former and the new key is an error naming the item and the line; a
// key neither old nor new is still unknown, inside Port and Pod as everywhere.
func TestParseFormerKeysRejects(t *testing.T) {
	cases := []struct{ name, src, want string }{
		{"both port keys", `
nodes: [{name: n1}]
services: [{name: a, ports: [{name: http, port: 80, target_port: 8080,
                              targetPort: 8081}]}]`,
			`line 4: port "http": both target_port and targetPort, its former name: give only target_port`},
		{"both port keys, unnamed port", `
nodes: [{name: n1}]
services: [{name: a, ports: [{port: 80, targetPort: 8080, target_port: 8080}]}]`,
			`line 3: port 80: both target_port and targetPort`},
		{"both pod keys", `
nodes: [{name: n1}]
services:
  - name: a
    pods:
      - name: a-0
        service_account: web
        serviceAccount: web`,
			`line 8: pod "a-0": both service_account and serviceAccount, its former name: give only service_account`},
		{"unknown key in a port", `
nodes: [{name: n1}]
services: [{name: a, ports: [{port: 80, targetport: 8080}]}]`,
			`line 3: field targetport not found in type optimizer.Port`},
		{"unknown key in a pod", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, serviceaccount: web}]}]`,
			`line 3: field serviceaccount not found in type optimizer.Pod`},
		{"unknown key beside a former one", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, serviceAccount: web, zone: z}]}]`,
			`line 3: field zone not found in type optimizer.Pod`},
		{"wrong type under a former key", `
nodes: [{name: n1}]
services: [{name: a, ports: [{port: 80, targetPort: http}]}]`,
			"line 3: cannot unmarshal !!str `http` into int32"},
		{"not a mapping", `
nodes: [{name: n1}]
services: [{name: a, ports: [80], pods: [a-0]}]`,
			"line 3: cannot unmarshal !!int `80` into optimizer.Port\n  line 3: cannot unmarshal !!str `a-0` into optimizer.Pod"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTopology(strings.NewReader(tc.src), "bad.yaml")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bad.yaml") {
				t.Fatalf("error %v, want it to name bad.yaml and contain %q", err, tc.want)
			}
		})
	}
}
