package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/edgeflow/edgeflow/optimizer"
)

func TestPlanGolden(t *testing.T) {
	t.Parallel()
	for _, example := range []string{"bookinfo", "dag"} {
		file := filepath.Join("..", "..", "examples", example+".yaml")
		for _, p := range optimizer.Policies() {
			t.Run(example+"/"+string(p), func(t *testing.T) {
				code, out, errOut := runCLI(t, "", "plan", "-f", file, "--policy", string(p), "-o", "json")
				if code != 0 {
					t.Fatalf("exit %d: %s", code, errOut)
				}
				golden(t, fmt.Sprintf("plan/%s.%s.json", example, p), out)
			})
		}
		t.Run(example+"/table", func(t *testing.T) {
			code, out, errOut := runCLI(t, "", "plan", "-f", file)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			golden(t, "plan/"+example+".lata.txt", out)
		})
	}
}

func TestPlanJSONContract(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, "", "plan", "-f", "../../examples/bookinfo.yaml", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got struct {
		Policy string  `json:"policy"`
		Cost   float64 `json:"cost"`
		Calls  []struct {
			From, To string
			Routes   []struct {
				Caller, Callee string
				Fraction, RPS  float64
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not the contract's JSON: %v\n%s", err, out)
	}
	if got.Policy != "lata" || got.Cost <= 0 || len(got.Calls) != 3 {
		t.Fatalf("policy %q cost %v calls %d; want lata, a positive cost, 3 call edges", got.Policy, got.Cost, len(got.Calls))
	}
	for _, c := range got.Calls {
		sums := map[string]float64{}
		for _, r := range c.Routes {
			sums[r.Caller] += r.Fraction
		}
		for caller, s := range sums {
			if s < 1-1e-9 || s > 1+1e-9 {
				t.Errorf("%s→%s: caller %s fractions sum to %v", c.From, c.To, caller, s)
			}
		}
	}
}

func TestPlanReadsStdinAndYAML(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("../../examples/dag.yaml")
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, string(src), "plan", "-f", "-", "-o", "yaml", "--policy", "round-robin")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "policy: round-robin\n") {
		t.Errorf("yaml output starts %q", out[:min(len(out), 40)])
	}
}

func TestPlanBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	missingPair := write("missing.yaml", `
nodes: [{name: n1}, {name: n2}]
services: [{name: a, pods: [{name: a-0, node: n1}]}, {name: b, pods: [{name: b-0, node: n2}]}]
calls: [{from: a, to: b}]
`)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"cycle", []string{"plan", "-f", write("cycle.yaml", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: n1}]}, {name: b, pods: [{name: b-0, node: n1}]}]
calls: [{from: a, to: b}, {from: b, to: a}]
`)}, "calls form a cycle: a → b → a"},
		{"unknown node", []string{"plan", "-f", write("node.yaml", `
nodes: [{name: n1}]
services: [{name: a, pods: [{name: a-0, node: edge-x}]}]
`)}, `unknown node "edge-x"`},
		{"NaN latency", []string{"plan", "-f", write("nan.yaml", `
nodes: [{name: n1}, {name: n2}]
latency: [{from: n1, to: n2, ms: .nan}]
services: [{name: a, pods: [{name: a-0, node: n1}]}]
`)}, "ms is NaN"},
		{"missing latency pair", []string{"plan", "-f", missingPair}, "no entry for n1 ↔ n2"},
		{"syntax", []string{"plan", "-f", write("syntax.yaml", "nodes: [")}, "syntax.yaml"},
		{"no such file", []string{"plan", "-f", filepath.Join(dir, "absent.yaml")}, "absent.yaml"},
		{"unknown policy", []string{"plan", "-f", missingPair, "--policy", "fastest"}, `unknown policy "fastest"`},
		{"unknown output", []string{"plan", "-f", missingPair, "--default-latency", "3", "-o", "xml"}, `unknown output format "xml"`},
		{"missing -f", []string{"plan"}, `no topology: give -f FILE, or a cluster: --kubeconfig, $KUBECONFIG, ~/.kube/config`},
		{"-f and --kubeconfig", []string{"plan", "-f", missingPair, "--kubeconfig", "k"}, `--kubeconfig reads the topology from a cluster`},
		{"-f and --context", []string{"plan", "-f", missingPair, "--context", "edge"}, `--context reads the topology from a cluster`},
		{"-f and --prometheus-url", []string{"plan", "-f", missingPair, "--prometheus-url", "http://p"}, `--prometheus-url reads the topology from a cluster`},
		{"-f and -l", []string{"plan", "-f", missingPair, "-l", "app=web"}, `--selector reads the topology from a cluster`},
		{"place: -f and --calls", []string{"place", "-f", missingPair, "--calls", "calls.yaml"}, `--calls reads the topology from a cluster`},
		{"-f and --latency-granularity", []string{"plan", "-f", missingPair, "--latency-granularity", "zone"}, `--latency-granularity reads the topology from a cluster`},
		{"unreadable kubeconfig", []string{"plan", "--kubeconfig", "/nonexistent/kubeconfig", "--calls", "x.yaml", "--prometheus-url", "::"}, `kubeconfig`},
		{"extra argument", []string{"plan", "-f", missingPair, "oops"}, "takes no arguments"},
		{"unknown command", []string{"plon"}, "unknown command"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", c.args...)
			if code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			if out != "" {
				t.Errorf("stdout must be empty on bad input, got %q", out)
			}
			if !strings.Contains(errOut, c.want) {
				t.Errorf("stderr %q does not name %q", errOut, c.want)
			}
		})
	}
	// The same file is fine once a default latency is given.
	if code, _, errOut := runCLI(t, "", "plan", "-f", missingPair, "--default-latency", "7"); code != 0 {
		t.Errorf("with --default-latency: exit %d: %s", code, errOut)
	}
}

// TestPlanTableLATAQ: the table of a lata-q plan adds its queueing cost, and says when lata's
// routes are served (Bookinfo with the demo's pods, μ = 1000/6 rps: lata-q's own plan at 150
// req/s, lata's at 300).
func TestPlanTableLATAQ(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(filepath.Join("..", "..", "examples", "bookinfo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rps     string
		asLATA  bool
		queueAt string
	}{{"150", false, "5215.4"}, {"300", true, "16772.7"}} {
		top := strings.Replace(string(src), "rps: 100}", "rps: "+c.rps+"}", 1)
		top = strings.ReplaceAll(top, "    cpu: 500\n", "    cpu: 500\n    capacity_rps: 166.66666666666666\n")
		top = strings.ReplaceAll(top, "    cpu: 250\n", "    cpu: 250\n    capacity_rps: 166.66666666666666\n")
		code, out, errOut := runCLI(t, top, "plan", "-f", "-", "--policy", "lata-q")
		if code != 0 {
			t.Fatalf("%s rps: exit %d: %s", c.rps, code, errOut)
		}
		if want := "over the pods with a service rate: " + c.queueAt + " ms·req/s"; !strings.Contains(out, want) {
			t.Errorf("%s rps: no %q in\n%s", c.rps, want, out)
		}
		if got := strings.Contains(out, "lata's routes are served"); got != c.asLATA {
			t.Errorf("%s rps: lata's routes served %v, want %v:\n%s", c.rps, got, c.asLATA, out)
		}
	}
}

// plan -o istio prints DestinationRules that parse back, one per call edge of the example,
// each selecting its caller's pods, with weights of every from-locality summing to 100.
func TestPlanIstio(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, "", "plan", "-f", "../../examples/bookinfo.yaml", "-o", "istio")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "# edgeflow: planned per node (4 localities)") {
		t.Errorf("output does not start by saying the granularity:\n%s", out)
	}
	docs := strings.Split(out, "---\n")
	if len(docs) != 3 {
		t.Fatalf("%d documents, want 3 (one per call edge)", len(docs))
	}
	for _, doc := range docs {
		var dr struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
			Metadata   struct {
				Name, Namespace string
				Labels          map[string]string
			}
			Spec struct {
				Host             string
				WorkloadSelector struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				} `yaml:"workloadSelector"`
				TrafficPolicy struct {
					LoadBalancer struct {
						LocalityLbSetting struct {
							Distribute []struct {
								From string
								To   map[string]int
							}
						} `yaml:"localityLbSetting"`
					} `yaml:"loadBalancer"`
				} `yaml:"trafficPolicy"`
			}
		}
		if err := yaml.Unmarshal([]byte(doc), &dr); err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		if dr.APIVersion != "networking.istio.io/v1" || dr.Kind != "DestinationRule" || dr.Metadata.Labels["app.kubernetes.io/managed-by"] != "edgeflow" {
			t.Errorf("%s: apiVersion %s kind %s labels %v", dr.Metadata.Name, dr.APIVersion, dr.Kind, dr.Metadata.Labels)
		}
		caller := strings.Split(dr.Metadata.Name, ".")[1]
		if dr.Spec.WorkloadSelector.MatchLabels["app"] != caller || !strings.HasSuffix(dr.Spec.Host, ".default.svc.cluster.local") {
			t.Errorf("%s: selector %v host %s", dr.Metadata.Name, dr.Spec.WorkloadSelector.MatchLabels, dr.Spec.Host)
		}
		d := dr.Spec.TrafficPolicy.LoadBalancer.LocalityLbSetting.Distribute
		if len(d) == 0 {
			t.Errorf("%s: no distribute entries", dr.Metadata.Name)
		}
		for _, e := range d {
			sum := 0
			for _, w := range e.To {
				sum += w
			}
			if sum != 100 {
				t.Errorf("%s from %s: weights %v sum to %d", dr.Metadata.Name, e.From, e.To, sum)
			}
		}
	}
	// --cluster-domain names the hosts.
	_, out, _ = runCLI(t, "", "plan", "-f", "../../examples/bookinfo.yaml", "-o", "istio", "--cluster-domain", "corp.internal")
	if !strings.Contains(out, "host: reviews.default.svc.corp.internal") {
		t.Errorf("--cluster-domain not in the hosts:\n%s", out)
	}
	// A file without localities: a clear error, nothing on stdout.
	code, out, errOut = runCLI(t, "", "plan", "-f", "../../examples/dag.yaml", "-o", "istio")
	if code != 2 || out != "" || !strings.Contains(errOut, "locality") {
		t.Errorf("no localities: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestServeIstioModeFlags(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--istio-mode", "sidecar"}, `--istio-mode "sidecar"`},
		{[]string{"--istio-xds-address", "x:1"}, "--istio-xds-address is for --istio-mode=envoyfilter"},
		{[]string{"--istio-mode", "envoyfilter"}, "needs --istio-xds-address"},
		{[]string{"--istio-mode", "envoyfilter", "--istio-xds-address", "x:1", "--istio-label-nodes"}, "--istio-label-nodes is for --istio-mode=destinationrule"},
		{[]string{"--istio-mode", "destinationrule"}, "needs the cluster flags"},
	} {
		args := append([]string{"serve", "-f", "../../examples/bookinfo.yaml", "--xds-address", "127.0.0.1:0"}, tt.args...)
		code, out, errOut := runCLI(t, "", args...)
		if code != 2 || out != "" || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, errOut, tt.want)
		}
	}
}

// Every latency flag takes a duration or, as before, a bare number of milliseconds; a bad one
// is exit 2 naming the flag.
func TestLatencyFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cmd        func() *cobra.Command
		flag, give string
		want       string // the value as the flag shows it
	}{
		{newPlanCommand, "default-latency", "20ms", "20ms"},
		{newPlanCommand, "default-latency", "20", "20ms"},
		{newPlanCommand, "default-latency", "1.5ms", "1.5ms"},
		{newPlaceCommand, "default-latency", "0.25s", "250ms"},
		{newServeCommand, "default-latency", "0", "0s"},
		{newRebalanceCommand, "default-latency", "7ms", "7ms"},
		{newPlanCommand, "unreachable-latency", "5000", "5s"},
		{newPlanCommand, "unreachable-latency", "800ms", "800ms"},
		{newServeCommand, "hysteresis-latency", "2ms", "2ms"},
		{newServeCommand, "hysteresis-latency-ms", "0.5", "500µs"},
	} {
		c := tc.cmd()
		if err := c.ParseFlags([]string{"--" + tc.flag, tc.give}); err != nil {
			t.Errorf("%s --%s %s: %v", c.Name(), tc.flag, tc.give, err)
			continue
		}
		if got := c.Flags().Lookup(tc.flag).Value.String(); got != tc.want {
			t.Errorf("%s --%s %s: %s, want %s", c.Name(), tc.flag, tc.give, got, tc.want)
		}
	}
	dir := t.TempDir()
	missingPair := filepath.Join(dir, "missing.yaml")
	writeFile(t, missingPair, "nodes: [{name: n1}, {name: n2}]\nservices: [{name: a, pods: [{name: a-0, node: n1}]}, {name: b, pods: [{name: b-0, node: n2}]}]\ncalls: [{from: a, to: b}]\ningress: [{service: a, rps: 10}]\n")
	_, asMS, _ := runCLI(t, "", "plan", "-f", missingPair, "--default-latency", "7", "-o", "json")
	code, asDuration, errOut := runCLI(t, "", "plan", "-f", missingPair, "--default-latency", "7ms", "-o", "json")
	if code != 0 || asDuration != asMS || !strings.Contains(asDuration, `"cost": 70`) {
		t.Errorf("--default-latency 7ms: exit %d, %s%s; want the plan of --default-latency 7 (cost 70)\n%s", code, asDuration, errOut, asMS)
	}
	for _, bad := range []string{"fast", "-3ms", "NaN"} {
		code, out, errOut := runCLI(t, "", "plan", "-f", missingPair, "--default-latency", bad)
		if code != exitBadInput || out != "" || !strings.Contains(errOut, `--default-latency "`+bad+`": want a latency`) {
			t.Errorf("--default-latency %s: exit %d, stdout %q, stderr %q; want 2 naming the flag", bad, code, out, errOut)
		}
	}
}
