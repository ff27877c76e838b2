package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/kubetest"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// clusterFixture starts a real kube-apiserver holding a small mesh in namespace "shop": web
// (on edge-1 and edge-2) calls api (on edge-1 and edge-3), and writes the call graph file.
func clusterFixture(t *testing.T) (kubeconfig, calls string) {
	t.Helper()
	c := kubeapi.Start(t, kubeapi.Options{})
	ctx := kubeapi.Context(t)
	k := kubeapi.NewKubelet(t, ctx, c.Client, "shop", 8080)
	k.Namespace()
	for _, n := range []string{"edge-1", "edge-2", "edge-3"} {
		k.Node(n)
	}
	k.Service("web", true)
	k.Service("api", true)
	k.Service("db", false) // unmanaged: not in the topology
	k.Pod("web", "web-1", "edge-1", "198.18.1.11", true)
	k.Pod("web", "web-2", "edge-2", "198.18.1.12", true)
	k.Pod("api", "api-1", "edge-1", "198.18.1.21", true)
	k.Pod("api", "api-3", "edge-3", "198.18.1.23", true)
	k.Pod("api", "api-9", "edge-3", "198.18.1.29", false) // not ready: left out
	k.Pod("db", "db-1", "edge-2", "198.18.1.31", true)
	calls = filepath.Join(t.TempDir(), "calls.yaml")
	writeFile(t, calls, "calls: [{from: web.shop, to: api.shop}]\ningress: [{service: web.shop, rps: 100}]\n")
	return c.Kubeconfig, calls
}

// "What would LATA do on my cluster now?": plan and place read the live cluster, and serve
// follows it, through the same flags.
func TestCommandsOnALiveCluster(t *testing.T) {
	kubeconfig, calls := clusterFixture(t)
	common := []string{"--kubeconfig", kubeconfig, "--calls", calls, "--default-latency", "20"}

	code, out, errOut := runCLI(t, "", append([]string{"plan", "-o", "json"}, common...)...)
	if code != 0 {
		t.Fatalf("plan: exit %d: %s", code, errOut)
	}
	var alloc optimizer.Allocation
	if err := json.Unmarshal([]byte(out), &alloc); err != nil {
		t.Fatalf("plan -o json: %v\n%s", err, out)
	}
	if len(alloc.Calls) != 1 || alloc.Calls[0].From != "web.shop" || alloc.Calls[0].To != "api.shop" {
		t.Fatalf("plan on the cluster: calls %+v, want web.shop → api.shop", alloc.Calls)
	}
	// web-1 shares edge-1 with api-1: LATA sends it there; web-2 (edge-2) takes api-3.
	routes := map[string]string{}
	for _, r := range alloc.Calls[0].Routes {
		if r.Fraction > 0.999 {
			routes[r.Caller] = r.Callee
		}
		if strings.HasPrefix(r.Callee, "api-9") {
			t.Errorf("not-ready pod api-9 has a route: %+v", r)
		}
	}
	if routes["web-1.shop"] != "api-1.shop" || routes["web-2.shop"] != "api-3.shop" {
		t.Errorf("plan routes %v, want web-1.shop→api-1.shop and web-2.shop→api-3.shop", routes)
	}
	// 50 rps each: web-1 → api-1 costs 0 (same node), web-2 → api-3 costs 50 × 20 ms.
	if alloc.Cost != 1000 {
		t.Errorf("plan cost %v, want 1000", alloc.Cost)
	}

	t.Run("kubectl's loading rules", func(t *testing.T) { kubectlLoadingRules(t, kubeconfig, calls, alloc.Cost) })

	if code, out, errOut := runCLI(t, "", append([]string{"plan", "-o", "table"}, common...)...); code != 0 || !strings.Contains(out, "web.shop → api.shop") {
		t.Errorf("plan -o table: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, "", append([]string{"place", "-o", "json"}, common...)...); code != 0 || !strings.Contains(out, `"api-3.shop"`) {
		t.Errorf("place -o json: exit %d\n%s%s", code, out, errOut)
	}

	// rebalance (dry-run, the default): web-2 would join api-3 on edge-3 (cost 1000 → 0), but
	// the fixture's pods are bare: the move is shown and skipped.
	code, out, errOut = runCLI(t, "", append([]string{"rebalance", "-o", "json"}, common...)...)
	if code != 0 {
		t.Fatalf("rebalance: exit %d: %s", code, errOut)
	}
	var rep rebalancer.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("rebalance -o json: %v\n%s", err, out)
	}
	if !rep.DryRun || rep.CostBefore != 1000 || rep.CostTarget != 0 || len(rep.Moves) != 1 ||
		rep.Moves[0].Reason != rebalancer.ReasonBarePod || rep.Moves[0].Namespace != "shop" {
		t.Errorf("rebalance report %+v: want dry-run, 1000 → 0, one move skipped as bare_pod", rep)
	}
	if code, out, errOut := runCLI(t, "", append([]string{"rebalance", "-o", "yaml"}, common...)...); code != 0 || !strings.Contains(out, "cost_before: 1000\n") {
		t.Errorf("rebalance -o yaml: exit %d, want the keys of -o json (cost_before: 1000)\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "", append([]string{"rebalance"}, common...)...)
	if code != 0 || !strings.Contains(out, "gain 100.0%") || !strings.Contains(out, "dry-run") || !strings.Contains(out, "bare_pod") {
		t.Errorf("rebalance -o table: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("edgeflow rebalance:\n%s", out)

	// serve: the xDS server follows the cluster; /readyz lists the Kubernetes input.
	serve := startServeProcess(t, append([]string{"serve", "--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0", "--rebalance"}, common...)...)
	stderr := serve.stderr
	var metricsURL string
	re := regexp.MustCompile(`metrics (http://\S+)/metrics, .*topology from the cluster`)
	testkit.Eventually(t, 15*time.Second, "the listening line", func() bool {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			metricsURL = m[1]
		}
		return metricsURL != ""
	})
	testkit.Eventually(t, 15*time.Second, "/readyz", func() bool { code, _ := httpGet(metricsURL + "/readyz"); return code == 200 })
	_, body := httpGet(metricsURL + "/readyz")
	if !strings.Contains(body, "[+]kubernetes") {
		t.Errorf("/readyz does not list the Kubernetes input:\n%s", body)
	}
	metrics := func() string { _, body := httpGet(metricsURL + "/metrics"); return body }
	if v := metricValue(metrics(), "edgeflow_cluster_topologies_total"); v != "1" {
		t.Errorf("edgeflow_cluster_topologies_total = %q, want 1", v)
	}
	if !strings.Contains(metrics(), `edgeflow_kube_skipped{reason="not_ready"} 1`) {
		t.Errorf("the not-ready pod is not counted:\n%s", grep(metrics(), "edgeflow_kube_skipped"))
	}
	// serve --rebalance: the (dry-run) rebalancer runs once at start, without a Lease (dry-run
	// writes nothing).
	testkit.Eventually(t, 15*time.Second, "a rebalancer run", func() bool {
		return strings.Contains(metrics(), `edgeflow_rebalance_runs_total{result="ok"} 1`)
	})
	if v := metricValue(metrics(), "edgeflow_rebalance_leader"); v != "0" {
		t.Errorf("a dry-run rebalancer took part in the leader election (edgeflow_rebalance_leader %q)", v)
	}
	if !strings.Contains(metrics(), `edgeflow_rebalance_moves_skipped_total{reason="bare_pod"} 1`) {
		t.Errorf("serve --rebalance: the bare pod's move is not counted:\n%s", grep(metrics(), "edgeflow_rebalance"))
	}
	if err := serve.stop(); err != nil {
		t.Errorf("serve returned %v", err)
	}

	t.Run("bounded", func(t *testing.T) { boundedOnALiveCluster(t, common) })
}

// boundedOnALiveCluster: serve --max-managed-services 1 on the real API server keeps api (the
// first of shop's two managed Services by name) and refuses web: a log line and /readyz name
// it, edgeflow_kube_skipped{reason="over_cap"} counts it, and api is still served (published).
// Before the bound, both were managed.
func boundedOnALiveCluster(t *testing.T, common []string) {
	serve := startServeProcess(t, append([]string{"serve", "--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0", "--max-managed-services", "1"}, common...)...)
	var metricsURL string
	re := regexp.MustCompile(`metrics (http://\S+)/metrics, .*topology from the cluster`)
	testkit.Eventually(t, 15*time.Second, "the listening line", func() bool {
		if m := re.FindStringSubmatch(serve.stderr.String()); m != nil {
			metricsURL = m[1]
		}
		return metricsURL != ""
	})
	testkit.Eventually(t, 15*time.Second, "/readyz", func() bool { code, _ := httpGet(metricsURL + "/readyz"); return code == 200 })
	if _, body := httpGet(metricsURL + "/readyz"); !strings.Contains(body, "1 managed services beyond --max-managed-services refused: shop/web") {
		t.Errorf("/readyz does not name the refused service:\n%s", body)
	}
	_, metrics := httpGet(metricsURL + "/metrics")
	if !strings.Contains(metrics, `edgeflow_kube_skipped{reason="over_cap"} 1`) {
		t.Errorf("the refused service is not counted:\n%s", grep(metrics, "edgeflow_kube_skipped"))
	}
	if log := serve.stderr.String(); !strings.Contains(log, "refused=shop/web") || !strings.Contains(log, "max=1") {
		t.Errorf("no log line naming the refused service:\n%s", log)
	}
	if err := serve.stop(); err != nil {
		t.Errorf("serve returned %v", err)
	}
}

// Cluster inputs that cannot work are bad input: exit 2, nothing on stdout.
func TestClusterBadInput(t *testing.T) {
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls.yaml")
	writeFile(t, calls, "calls: [{from: a, to: b}]\n")
	withNodes := filepath.Join(dir, "nodes.yaml")
	writeFile(t, withNodes, "nodes: [{name: n1}]\ncalls: [{from: a, to: b}]\n")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	writeFile(t, kubeconfig, "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\ncontexts: [{name: c, context: {cluster: c}}]\ncurrent-context: c\n")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no call graph", []string{"plan", "--kubeconfig", kubeconfig}, "--calls FILE"},
		{"calls file with nodes", []string{"plan", "--kubeconfig", kubeconfig, "--calls", withNodes}, "only calls and ingress"},
		{"bad selector", []string{"plan", "--kubeconfig", kubeconfig, "--calls", calls, "-l", "a in (b"}, "selector"},
		{"rebalance threshold", []string{"rebalance", "--kubeconfig", kubeconfig, "--calls", calls, "--threshold", "2"}, "threshold"},
		{"rebalance webhook without TLS", []string{"rebalance", "--kubeconfig", kubeconfig, "--calls", calls, "--webhook-address", ":8443"}, "--webhook-tls-cert"},
		{"rebalance acting outside a pod without a lease namespace", []string{"rebalance", "--kubeconfig", kubeconfig, "--calls", calls, "--dry-run=false"}, "--lease-namespace is required outside a pod"},
		{"rebalance placement timeout", []string{"rebalance", "--kubeconfig", kubeconfig, "--calls", calls, "--placement-timeout", "0s"}, "placement timeout"},
		{"negative kube-qps", []string{"plan", "--kubeconfig", kubeconfig, "--calls", calls, "--kube-qps", "-1"}, "--kube-qps"},
		{"serve --rebalance from a file", []string{"serve", "-f", calls, "--xds-address", "127.0.0.1:0", "--rebalance"}, "--rebalance needs the cluster flags"},
		{"bad prometheus url", []string{"plan", "--kubeconfig", kubeconfig, "--prometheus-url", "::not a url"}, "URL"},
		{"bad node match", []string{"plan", "--kubeconfig", kubeconfig, "--calls", calls, "--node-match", "hostname"}, `--node-match "hostname": want name or internal-ip`},
		{"bad latency granularity", []string{"plan", "--kubeconfig", kubeconfig, "--calls", calls, "--latency-granularity", "rack"}, `--latency-granularity "rack": want auto, node or zone`},
		{"serve: bad latency granularity", []string{"serve", "--kubeconfig", kubeconfig, "--calls", calls, "--xds-address", "127.0.0.1:0", "--latency-granularity", "pod"}, `--latency-granularity "pod"`},
		{"max node pairs not positive", []string{"place", "--kubeconfig", kubeconfig, "--calls", calls, "--max-node-pairs", "0"}, "--max-node-pairs 0: want a positive number"},
		{"rebalance: negative max node pairs", []string{"rebalance", "--kubeconfig", kubeconfig, "--calls", calls, "--max-node-pairs", "-5"}, "--max-node-pairs -5"},
		{"bad ip family", []string{"plan", "--kubeconfig", kubeconfig, "--calls", calls, "--ip-family", "IPv5"}, `--ip-family "IPv5": want IPv4 or IPv6`},
		{"bad probe pins", []string{"serve", "--kubeconfig", kubeconfig, "--xds-address", "127.0.0.1:0", "--probe-pins", "all"}, `--probe-pins "all": want targets or off`},
		{"probe loss out of range", []string{"plan", "--kubeconfig", kubeconfig, "--prometheus-url", "http://p", "--max-probe-loss", "1.5"}, "MaxProbeLoss"},
		{"unknown context", []string{"plan", "--kubeconfig", kubeconfig, "--calls", calls, "--context", "edge-west"}, `context "edge-west" does not exist`},
		{"uninstall: unknown context", []string{"uninstall", "--kubeconfig", kubeconfig, "--context", "edge-west"}, `context "edge-west" does not exist`},
		{"unreadable CA file", []string{"plan", "--kubeconfig", kubeconfig, "--prometheus-url", "https://p", "--prometheus-ca-file", "/nonexistent/ca.pem"}, "ca.pem"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", c.args...)
			if code != 2 || out != "" || !strings.Contains(errOut, c.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want 2, nothing, naming %q", code, out, errOut, c.want)
			}
		})
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A password in --prometheus-url reaches Prometheus (basic auth) but appears nowhere in
// /readyz or the logs, even while Prometheus fails.
func TestServeNeverPrintsThePrometheusPassword(t *testing.T) {
	const secret = "Pa55-w0rd-s3cret"
	kubeconfig, _ := clusterFixture(t)
	var mu sync.Mutex
	var gotPass string
	promSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pass, _ := r.BasicAuth()
		mu.Lock()
		gotPass = pass
		mu.Unlock()
		http.Error(w, "temporarily down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(promSrv.Close)
	promURL := strings.Replace(promSrv.URL, "http://", "http://edgeflow:"+secret+"@", 1)

	stderr := startServeProcess(t, "serve", "--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0", "--kubeconfig", kubeconfig,
		"--prometheus-url", promURL, "--log-level", "debug").stderr
	var metricsURL string
	re := regexp.MustCompile(`metrics (http://\S+)/metrics, `)
	testkit.Eventually(t, 15*time.Second, "the listening line", func() bool {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			metricsURL = m[1]
		}
		return metricsURL != ""
	})
	var body string
	testkit.Eventually(t, 15*time.Second, "/readyz naming the failing Prometheus", func() bool {
		_, body = httpGet(metricsURL + "/readyz")
		return strings.Contains(body, "[-]prometheus") && strings.Contains(body, "503")
	})
	mu.Lock()
	sent := gotPass
	mu.Unlock()
	if sent != secret {
		t.Errorf("basic auth password sent to Prometheus: %q, want the URL's", sent)
	}
	t.Logf("/readyz:\n%s", body)
	if strings.Contains(body, secret) {
		t.Errorf("/readyz shows the password:\n%s", body)
	}
	if !strings.Contains(body, "xxxxx") {
		t.Errorf("/readyz does not name the (redacted) URL:\n%s", body)
	}
	if logs := stderr.String(); strings.Contains(logs, secret) {
		t.Errorf("the logs show the password:\n%s", grep(logs, secret))
	}
}

// kubectlLoadingRules runs the binary without --kubeconfig or $KUBECONFIG, with a HOME whose
// ~/.kube/config holds the fixture's cluster as context "live" beside a current-context "dead"
// that reaches nothing: plan --context live and uninstall --dry-run --context live find the
// fixture's cluster, as kubectl would; an unknown context is bad input naming it.
func kubectlLoadingRules(t *testing.T, kubeconfig, calls string, wantCost float64) {
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	live := cfg.Contexts[cfg.CurrentContext]
	if live == nil {
		t.Fatalf("the fixture's kubeconfig has no current-context %q", cfg.CurrentContext)
	}
	cfg.Contexts = map[string]*clientcmdapi.Context{"live": live, "dead": {Cluster: "dead"}}
	cfg.Clusters["dead"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	cfg.CurrentContext = "dead"
	home := t.TempDir()
	if err := clientcmd.WriteToFile(*cfg, filepath.Join(home, ".kube", "config")); err != nil {
		t.Fatal(err)
	}
	bin := testkit.Binary(t)
	edgeflow := func(args ...string) (int, string, string) {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH")}
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), out.String(), errOut.String()
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, out.String(), errOut.String()
	}
	code, out, errOut := edgeflow("plan", "-o", "json", "--context", "live", "--calls", calls, "--default-latency", "20", "--inputs-timeout", "20s")
	var alloc optimizer.Allocation
	if err := json.Unmarshal([]byte(out), &alloc); code != 0 || err != nil || alloc.Cost != wantCost {
		t.Errorf("plan --context live with ~/.kube/config: exit %d, cost %v (want %v), %v\n%s%s", code, alloc.Cost, wantCost, err, out, errOut)
	}
	if code, out, errOut := edgeflow("uninstall", "--dry-run", "--context", "live"); code != 0 {
		t.Errorf("uninstall --dry-run --context live with ~/.kube/config: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := edgeflow("plan", "--context", "nope", "--calls", calls); code != exitBadInput || !strings.Contains(errOut, `context "nope" does not exist`) {
		t.Errorf("plan --context nope: exit %d, stderr %q; want 2 naming the context", code, errOut)
	}
}

// --capacity-history-windows reaches the watcher: the cluster source reads that many windows of
// pod load from Prometheus's history (pod-load queries evaluated at past times, one
// --prometheus-window apart) before its first live round; 0 reads none. Its default is the
// windows the estimator sums.
func TestCapacityHistoryWindowsReachesTheWatcher(t *testing.T) {
	t.Parallel()
	if def := newServeCommand().Flags().Lookup("capacity-history-windows").DefValue; def != strconv.Itoa(estimate.DefaultWindows) {
		t.Errorf("--capacity-history-windows defaults to %s, want %d", def, estimate.DefaultWindows)
	}
	for _, windows := range []int{3, 0} {
		t.Run(strconv.Itoa(windows), func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var times []string // the evaluation times of the pod-load queries, "" for now
			promSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if err := r.ParseForm(); err == nil && strings.Contains(r.Form.Get("query"), "by (namespace, pod") {
					mu.Lock()
					times = append(times, r.Form.Get("time"))
					mu.Unlock()
				}
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[]}}`)
			}))
			t.Cleanup(promSrv.Close)
			var f clusterFlags
			f.register(&cobra.Command{}) // the defaults
			f.prometheusURL, f.promWindow, f.probePins, f.capacityHistory = promSrv.URL, time.Minute, prom.PinOff, windows
			logger := slog.New(slog.DiscardHandler)
			inf, err := kube.NewInformers(kube.InformersConfig{Client: kubetest.NewClientset(), EndpointSlices: true})
			if err != nil {
				t.Fatal(err)
			}
			c, err := f.cluster(inf, optimizer.Options{}, nil, nil, logger, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			inf.Start(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx, &latestTopology{}) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
				inf.Stop()
			})
			var asked []string // the distinct times before the first live pod-load query
			testkit.Eventually(t, 15*time.Second, "a live pod-load query", func() bool {
				mu.Lock()
				defer mu.Unlock()
				asked = nil
				for _, ts := range times {
					if ts == "" {
						return true
					}
					if !slices.Contains(asked, ts) {
						asked = append(asked, ts)
					}
				}
				return false
			})
			if len(asked) != windows {
				t.Fatalf("pod-load queries asked at %d past times before the live round (%v), want %d", len(asked), asked, windows)
			}
			for i := 1; i < len(asked); i++ {
				newer, _ := strconv.ParseFloat(asked[i-1], 64)
				older, _ := strconv.ParseFloat(asked[i], 64)
				if newer-older != 60 {
					t.Errorf("evaluation times %v: want them one --prometheus-window (60 s) apart, newest first", asked)
				}
			}
		})
	}
}
