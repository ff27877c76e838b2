package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// placeTopology is a small input: two zones of two nodes, a three-service chain.
const placeTopology = `
nodes:
  - {name: edge-a, cpu: 2000, memory: 2048}
  - {name: edge-b, cpu: 2000, memory: 2048}
  - {name: cloud-a, cpu: 4000, memory: 8192}
  - {name: cloud-b, cpu: 4000, memory: 8192}
latency:
  - {from: edge-a, to: edge-b, ms: 2}
  - {from: cloud-a, to: cloud-b, ms: 1}
  - {from: edge-a, to: cloud-a, ms: 20}
  - {from: edge-a, to: cloud-b, ms: 21}
  - {from: edge-b, to: cloud-a, ms: 22}
  - {from: edge-b, to: cloud-b, ms: 23}
  - {from: edge-a, to: edge-a, ms: 0.1}
services:
  - {name: frontend, cpu: 500, memory: 256, replicas: 3}
  - {name: reviews, cpu: 500, memory: 512, replicas: 3}
  - name: ratings
    cpu: 250
    memory: 128
    pods: [{name: ratings-main, weight: 2}, {name: ratings-spare}]
calls:
  - {from: frontend, to: reviews}
  - {from: reviews, to: ratings, rate: 0.5}
ingress:
  - {service: frontend, rps: 120}
`

func writeTopology(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestPlaceJSONContract(t *testing.T) {
	t.Parallel()
	path := writeTopology(t, placeTopology)
	for _, policy := range []string{"larp", "larp-greedy", "k8s-spread"} {
		t.Run(policy, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, "", "place", "-f", path, "--policy", policy, "-o", "json")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			var raw map[string]json.RawMessage
			if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
				t.Fatalf("stdout is not a JSON object: %v\n%s", err, stdout)
			}
			if len(raw) != 5 || raw["policy"] == nil || raw["placement"] == nil || raw["cost"] == nil || raw["queueing"] == nil || raw["utilization"] == nil {
				t.Fatalf("want exactly policy, placement, cost, queueing and utilization, got %s", stdout)
			}
			var got struct {
				Policy    string            `json:"policy"`
				Placement map[string]string `json:"placement"`
				Cost      float64           `json:"cost"`
			}
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatal(err)
			}
			if got.Policy != policy {
				t.Errorf("policy %q, want %q", got.Policy, policy)
			}
			want := []string{"frontend-0", "frontend-1", "frontend-2", "reviews-0", "reviews-1", "reviews-2", "ratings-main", "ratings-spare"}
			if len(got.Placement) != len(want) {
				t.Errorf("placement %v, want the pods %v", got.Placement, want)
			}
			for _, pod := range want {
				if !strings.HasPrefix(got.Placement[pod], "edge-") && !strings.HasPrefix(got.Placement[pod], "cloud-") {
					t.Errorf("pod %s on %q", pod, got.Placement[pod])
				}
			}
			if !(got.Cost > 0) {
				t.Errorf("cost %v", got.Cost)
			}
		})
	}
}

// TestPlaceTopologyPipesIntoPlan checks `place -o topology | plan -f -`: the placed topology is
// a valid plan input and plan's LATA cost is the cost place reported.
func TestPlaceTopologyPipesIntoPlan(t *testing.T) {
	t.Parallel()
	path := writeTopology(t, placeTopology)
	for _, policy := range []string{"larp", "larp-greedy", "k8s-spread"} {
		t.Run(policy, func(t *testing.T) {
			code, placed, stderr := runCLI(t, "", "place", "-f", path, "--policy", policy, "-o", "topology")
			if code != 0 {
				t.Fatalf("place exit %d: %s", code, stderr)
			}
			if strings.Contains(placed, "replicas") {
				t.Errorf("placed topology still has replicas:\n%s", placed)
			}
			code, planned, stderr := runCLI(t, placed, "plan", "-f", "-", "-o", "json")
			if code != 0 {
				t.Fatalf("plan of the placed topology: exit %d: %s\n%s", code, stderr, placed)
			}
			_, placeJSON, _ := runCLI(t, "", "place", "-f", path, "--policy", policy, "-o", "json")
			var p, q struct{ Cost float64 }
			if err := json.Unmarshal([]byte(placeJSON), &p); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(planned), &q); err != nil {
				t.Fatal(err)
			}
			if p.Cost != q.Cost {
				t.Errorf("place says cost %v, plan of its topology says %v", p.Cost, q.Cost)
			}
		})
	}
}

func TestPlaceDefaultLatency(t *testing.T) {
	t.Parallel()
	// No latency between the zones: an error without --default-latency.
	var kept []string
	for _, line := range strings.Split(placeTopology, "\n") {
		if !strings.Contains(line, "cloud-a, ms: 2") && !strings.Contains(line, "cloud-b, ms: 2") {
			kept = append(kept, line)
		}
	}
	path := writeTopology(t, strings.Join(kept, "\n"))
	if code, stdout, stderr := runCLI(t, "", "place", "-f", path); code != 2 || stdout != "" || !strings.Contains(stderr, "latency") {
		t.Fatalf("missing latencies: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, placed, stderr := runCLI(t, "", "place", "-f", path, "--default-latency", "30", "-o", "topology")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	// The filled-in pairs are written out, so plan needs no flag.
	if code, _, stderr := runCLI(t, placed, "plan", "-f", "-"); code != 0 {
		t.Fatalf("plan of the placed topology: exit %d: %s\n%s", code, stderr, placed)
	}
}

func TestPlaceRejectsBadInput(t *testing.T) {
	t.Parallel()
	good := writeTopology(t, placeTopology)
	tests := []struct {
		name     string
		topology string
		args     []string
		stderr   []string
	}{
		{
			name:     "cpu",
			topology: strings.Replace(placeTopology, "{name: reviews, cpu: 500,", "{name: reviews, cpu: 4500,", 1),
			stderr:   []string{"infeasible", `service "reviews"`, "cpu"},
		},
		{
			name:     "memory",
			topology: strings.Replace(placeTopology, "{name: frontend, cpu: 500, memory: 256,", "{name: frontend, cpu: 500, memory: 9000,", 1),
			stderr:   []string{"infeasible", `service "frontend"`, "memory"},
		},
		{
			name:     "spread",
			topology: strings.Replace(placeTopology, "{name: reviews, cpu: 500, memory: 512,", "{name: reviews, cpu: 500, memory: 3000,", 1),
			stderr:   []string{"infeasible", `service "reviews"`, "spread"},
		},
		{name: "policy", args: []string{"-f", good, "--policy", "best"}, stderr: []string{"unknown placement policy"}},
		{name: "output", args: []string{"-f", good, "-o", "xml"}, stderr: []string{"unknown output format"}},
		{name: "budget", args: []string{"-f", good, "--budget", "-1s"}, stderr: []string{"--budget"}},
		{name: "file", args: []string{"-f", filepath.Join(t.TempDir(), "missing.yaml")}, stderr: []string{"missing.yaml"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"place"}, tc.args...)
			if tc.topology != "" {
				args = append(args, "-f", writeTopology(t, tc.topology), "-o", "json")
			}
			code, stdout, stderr := runCLI(t, "", args...)
			if code != 2 {
				t.Errorf("exit %d, want 2 (stderr %q)", code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			for _, want := range tc.stderr {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr %q does not mention %q", stderr, want)
				}
			}
		})
	}
}

func TestPlaceTable(t *testing.T) {
	t.Parallel()
	path := writeTopology(t, placeTopology)
	code, stdout, stderr := runCLI(t, "", "place", "-f", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"SERVICE", "frontend-0", "ratings-spare", "NODE", "edge-a", "COST(larp)", "COST(k8s-spread)", "CHANGE"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table does not show %q:\n%s", want, stdout)
		}
	}
	for _, want := range []string{"PLANNED CPU(m)", "UTILIZATION", "network", "queueing", "total"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table does not show %q:\n%s", want, stdout)
		}
	}
	code, yamlOut, stderr := runCLI(t, placeTopology, "place", "-f", "-", "-o", "yaml")
	if code != 0 || !strings.Contains(yamlOut, "policy: larp") || !strings.Contains(yamlOut, "frontend-0:") {
		t.Fatalf("yaml: exit %d, stderr %q, stdout:\n%s", code, stderr, yamlOut)
	}
}

// TestPlaceBudget checks that a spent budget still gives a placement, says so on stderr, and
// adds truncated and cut to the json; a run within its budget adds neither.
func TestPlaceBudget(t *testing.T) {
	t.Parallel()
	path := writeTopology(t, placeTopology)
	code, stdout, stderr := runCLI(t, "", "place", "-f", path, "--budget", "1ns", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, "budget cut the search short") {
		t.Errorf("stderr %q does not say the budget cut the search", stderr)
	}
	var got struct {
		Placement map[string]string `json:"placement"`
		Truncated bool              `json:"truncated"`
		Cut       *struct {
			Starts      int `json:"starts"`
			StartsBuilt int `json:"starts_built"`
		} `json:"cut"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
	}
	if !got.Truncated || got.Cut == nil || got.Cut.StartsBuilt >= got.Cut.Starts || len(got.Placement) != 8 {
		t.Errorf("want a truncated placement of 8 pods with a cut, got %s", stdout)
	}
	code, stdout, stderr = runCLI(t, "", "place", "-f", path, "--budget", "0", "-o", "json")
	if code != 0 || stderr != "" || strings.Contains(stdout, "truncated") {
		t.Errorf("--budget 0: exit %d, stderr %q, stdout %s", code, stderr, stdout)
	}
}

// TestPlaceMaxNodeUtilization: the flag bounds every node's planned utilisation (without it
// larp packs caller and callee pods together), an instance that cannot keep it is an error
// naming the service with nothing on stdout, and a bad value is a usage error.
func TestPlaceMaxNodeUtilization(t *testing.T) {
	t.Parallel()
	// No pod has capacity_rps: each uses its whole request, 1000m, 0.5 of a 2-core node, and
	// the cost has no queueing part. A front and a back pod together make 1.0.
	const topology = `
nodes:
  - {name: a, cpu: 2000, memory: 4096}
  - {name: b, cpu: 2000, memory: 4096}
  - {name: c, cpu: 2000, memory: 4096}
  - {name: d, cpu: 2000, memory: 4096}
latency:
  - {from: a, to: b, ms: 5}
  - {from: a, to: c, ms: 5}
  - {from: a, to: d, ms: 5}
  - {from: b, to: c, ms: 5}
  - {from: b, to: d, ms: 5}
  - {from: c, to: d, ms: 5}
services:
  - {name: front, cpu: 1000, memory: 128, replicas: 2}
  - {name: back, cpu: 1000, memory: 128, replicas: 2}
calls:
  - {from: front, to: back}
ingress:
  - {service: front, rps: 240}
`
	path := writeTopology(t, topology)
	for _, tc := range []struct {
		limit   string
		highest float64 // the highest node utilisation wanted
	}{{"0.5", 0.5}, {"0", 1}} {
		code, stdout, stderr := runCLI(t, "", "place", "-f", path, "--max-node-utilization", tc.limit, "-o", "json")
		if code != 0 {
			t.Fatalf("limit %s: exit %d: %s", tc.limit, code, stderr)
		}
		var got struct {
			Utilization []struct {
				Node        string  `json:"node"`
				Cores       int     `json:"cores"`
				CPU         float64 `json:"cpu"`
				Utilization float64 `json:"utilization"`
			} `json:"utilization"`
		}
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatal(err)
		}
		highest := 0.0
		for _, u := range got.Utilization {
			if u.Cores != 2 || math.Abs(u.Utilization-u.CPU/2000) > 1e-12 {
				t.Errorf("limit %s: node %+v", tc.limit, u)
			}
			highest = max(highest, u.Utilization)
		}
		if len(got.Utilization) != 4 || math.Abs(highest-tc.highest) > 1e-9 {
			t.Errorf("limit %s: utilization %+v, want the highest %v", tc.limit, got.Utilization, tc.highest)
		}
	}
	code, stdout, stderr := runCLI(t, "", "place", "-f", path, "--max-node-utilization", "0.25")
	if code != 2 || stdout != "" || !strings.Contains(stderr, `headroom`) || !strings.Contains(stderr, `service "`) {
		t.Errorf("limit 0.25: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, _, stderr = runCLI(t, "", "place", "-f", path, "--max-node-utilization", "1.5")
	if code != 2 || !strings.Contains(stderr, "--max-node-utilization 1.5") {
		t.Errorf("limit 1.5: exit %d, stderr %q", code, stderr)
	}
}
