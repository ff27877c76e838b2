package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

const dashboardFile = "../../install/grafana/edgeflow-dashboard.json"

// dashboardQuery is one PromQL expression of the dashboard, with its panel's title.
type dashboardQuery struct{ panel, expr string }

// dashboardQueries reads every target's expression from the Grafana dashboard.
func dashboardQueries(t *testing.T) []dashboardQuery {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var qs []dashboardQuery
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("panel %q: a target without an expression", p.Title)
			}
			qs = append(qs, dashboardQuery{p.Title, tg.Expr})
		}
	}
	if len(qs) == 0 {
		t.Fatalf("%s: no queries", dashboardFile)
	}
	return qs
}

// grafanaVars replaces the dashboard's Grafana variables with what Grafana would send.
var grafanaVars = strings.NewReplacer("$__rate_interval", "30s", `"$instance"`, `".*"`)

// needTool finds a Prometheus binary; it skips without one, except under CI=true.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not on PATH (apt-get install prometheus); CI must run this test", name)
	}
	t.Skipf("%s not on PATH (apt-get install prometheus)", name)
	return ""
}

// TestDashboardQueriesParse checks every expression of the Grafana dashboard with promtool, as
// recording rules.
func TestDashboardQueriesParse(t *testing.T) {
	t.Parallel()
	promtool := needTool(t, "promtool")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, q := range dashboardQueries(t) {
		expr, _ := json.Marshal(grafanaVars.Replace(q.expr)) // a JSON string is a YAML scalar
		fmt.Fprintf(&rules, "      - record: dashboard:query_%d\n        expr: %s\n", i, expr)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s\nrules:\n%s", err, out, rules.String())
	}
	t.Logf("promtool check rules: %s", strings.TrimSpace(string(out)))
}

// startServeBinary runs the binary until the test ends (SIGINT, then a kill after 15 s) and
// returns its stderr and pid.
func startServeBinary(t *testing.T, bin string, args ...string) (*testkit.LogBuffer, int) {
	t.Helper()
	var stderr testkit.LogBuffer
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &stderr
	exited := startProcess(t, cmd)
	t.Cleanup(func() {
		if err := stopProcess(cmd, exited); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	})
	return &stderr, cmd.Process.Pid
}

// startProcess starts cmd and returns a channel that gets what cmd.Wait returns.
func startProcess(t *testing.T, cmd *exec.Cmd) <-chan error {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return exited
}

// stopProcess sends cmd SIGINT and returns how it exited, killing it (and saying so) when it
// has not exited after 15 s.
func stopProcess(cmd *exec.Cmd, exited <-chan error) error {
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-exited:
		return err
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		return errors.New("did not stop on SIGINT")
	}
}

// listeningMetrics waits for serve's listening line in stderr and returns its metrics
// address (HOST:PORT).
func listeningMetrics(t *testing.T, what string, stderr *testkit.LogBuffer) string {
	t.Helper()
	re := regexp.MustCompile(`, metrics http://(\S+)/metrics, `)
	var addr string
	testkit.Eventually(t, 15*time.Second, what+"'s listening line", func() bool {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return addr
}

// startPrometheus runs Debian's Prometheus on loopback, scraping every second the targets
// written with the function it returns (file service discovery: a target can come after
// Prometheus); it is stopped when the test ends. Prometheus cannot listen on a port it picks
// and report it: the port is picked here, and when another process takes it before
// Prometheus binds it, Prometheus is started again on another.
func startPrometheus(t *testing.T, bin string) (promURL string, setTargets func(targets ...string)) {
	t.Helper()
	dir := t.TempDir()
	targets := filepath.Join(dir, "targets.json")
	setTargets = func(hosts ...string) {
		t.Helper()
		b, err := json.Marshal([]map[string][]string{{"targets": hosts}})
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, targets, string(b))
	}
	setTargets()
	cfg := fmt.Sprintf("global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n  - job_name: edgeflow\n    file_sd_configs: [{files: [%q], refresh_interval: 1s}]\n", targets)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("prometheus-%d.log", attempt)))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
			"--web.listen-address="+addr)
		cmd.Stdout, cmd.Stderr = logf, logf
		exited := startProcess(t, cmd)
		u := "http://" + addr
		var exitErr error
		gone := false
		ready := testkit.WaitUntil(15*time.Second, func() bool {
			select {
			case exitErr = <-exited:
				gone = true
				return true
			default:
			}
			code, _ := httpGet(u + "/-/ready")
			return code == 200
		})
		if ready && !gone {
			t.Cleanup(func() {
				_ = stopProcess(cmd, exited)
				logf.Close()
				if t.Failed() {
					b, _ := os.ReadFile(logf.Name())
					t.Logf("prometheus log (last 3000 bytes):\n%s", b[max(0, len(b)-3000):])
				}
			})
			return u, setTargets
		}
		if !gone {
			_ = stopProcess(cmd, exited)
		}
		logf.Close()
		b, _ := os.ReadFile(logf.Name())
		if gone && attempt < 3 && strings.Contains(string(b), "address already in use") {
			t.Logf("prometheus could not bind %s (taken since it was picked); starting it again on another port", addr)
			continue
		}
		t.Fatalf("prometheus on %s not ready within 15 s (exited: %v, %v); its log (last 3000 bytes):\n%s", addr, gone, exitErr, b[max(0, len(b)-3000):])
	}
}

// promQuery runs an instant query: the number of series returned, and an error for a query
// Prometheus refuses.
func promQuery(promURL, expr string) (int, error) {
	resp, err := http.Get(promURL + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("%s: %s", r.Status, r.Error)
	}
	return len(r.Data.Result), nil
}

// TestDashboardQueriesReturnData runs every query of the Grafana dashboard against a real
// Prometheus scraping three running edgeflow serves: one following a topology file with a real
// grpc-go xDS client, one following a real kube-apiserver and that Prometheus, and one on the
// same cluster with the (dry-run) rebalancer on. Each query must return at least one series.
func TestDashboardQueriesReturnData(t *testing.T) {
	t.Parallel()
	promBin := needTool(t, "prometheus")
	queries := dashboardQueries(t)

	// edgeflow following a file, with a client whose pushes are answered.
	addrs := echoAddrs(testkit.StartEchoes(t, "e-0", "e-1"))
	path := filepath.Join(t.TempDir(), "topology.yaml")
	writeFile(t, path, serveTopology(addrs, 5))
	fileErr := startServeProcess(t, "serve", "-f", path, "--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
		"--debounce-quiet", "5ms", "--poll-interval", "10ms").stderr
	fileMetrics := listeningMetrics(t, "the file serve", fileErr)
	xdsAddr := regexp.MustCompile(`xDS on (\S+), `).FindStringSubmatch(fileErr.String())[1]

	// Prometheus scrapes all three serves. One follows the cluster and reads that Prometheus,
	// which holds no probe series: the capacity-weighted plan is served, so the degraded-input
	// panels have something to say. The rebalancer waits for usable latency, so it runs in a
	// third serve on the cluster with a default latency instead.
	// Both run as processes of their own: client-go's logger (klog) is process-global.
	kubeconfig, calls := clusterFixture(t)
	promURL, setTargets := startPrometheus(t, promBin)
	bin := testkit.Binary(t)
	clusterErr, _ := startServeBinary(t, bin, "serve", "--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0", "--kubeconfig", kubeconfig,
		"--calls", calls, "--prometheus-url", promURL)
	rebalanceErr, rebalancePID := startServeBinary(t, bin, "serve", "--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0", "--kubeconfig", kubeconfig,
		"--calls", calls, "--default-latency", "20", "--rebalance")
	setTargets(fileMetrics, listeningMetrics(t, "the cluster serve", clusterErr), listeningMetrics(t, "the rebalancing serve", rebalanceErr))
	// The dry-run rebalancer runs at start only if the cluster's topology is already there
	// (else it waits for its period): SIGUSR1, the operator's trigger, once it is.
	testkit.Eventually(t, 15*time.Second, "the rebalancing serve's first publication", func() bool { return strings.Contains(rebalanceErr.String(), "xds: published") })
	if err := syscall.Kill(rebalancePID, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := echoClient(t, xdsAddr, "c-0").UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	// A change the client is pushed and answers (convergence observed), and a bad file.
	writeFile(t, path, strings.Replace(strings.Replace(serveTopology(addrs, 5), "{name: e-0, node: n1", "{name: e-0, node: n2", 1),
		"{name: e-1, node: n2", "{name: e-1, node: n1", 1))
	writeFile(t, path, "nodes: [{name: n1}]\nservices: [{name: echo, pods: [{name: e-0, node: nowhere}]}]\n")

	empty := map[string]string{}
	deadline := time.Now().Add(90 * time.Second)
	for {
		clear(empty)
		for _, q := range queries {
			n, err := promQuery(promURL, grafanaVars.Replace(q.expr))
			if err != nil {
				t.Fatalf("panel %q: %s: %v", q.panel, q.expr, err)
			}
			if n == 0 {
				empty[q.expr] = q.panel
			}
		}
		if len(empty) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	var names []string
	for e, p := range empty {
		names = append(names, fmt.Sprintf("panel %q: %s", p, e))
	}
	sort.Strings(names)
	for _, n := range names {
		t.Errorf("no data: %s", n)
	}
	if t.Failed() {
		t.Logf("the cluster serve's log:\n%s\nthe rebalancing serve's log:\n%s", clusterErr.String(), rebalanceErr.String())
	}
	t.Logf("%d dashboard queries, %d returned data", len(queries), len(queries)-len(empty))
}
