package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/internal/testkit/xdsclient"
)

// echoAddrs is the address of each backend testkit.StartEchoes started, by pod.
func echoAddrs(echoes map[string]*testkit.Echo) map[string]string {
	addrs := make(map[string]string, len(echoes))
	for pod, e := range echoes {
		addrs[pod] = e.Addr
	}
	return addrs
}

// serveRun is edgeflow's command line running in this process (startServeProcess).
type serveRun struct {
	stderr *testkit.LogBuffer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
	byTest bool // the test called stop
}

// startServeProcess runs the command line in this process until the test calls stop or ends
// (then it is stopped and what it returned is checked), and returns it.
func startServeProcess(t *testing.T, args ...string) *serveRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &serveRun{stderr: &testkit.LogBuffer{}, cancel: cancel, done: make(chan error, 1)}
	root := newRootCommand()
	root.SetArgs(args)
	root.SetErr(s.stderr)
	root.SetOut(io.Discard)
	go func() { s.done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		if !s.byTest {
			if err := s.halt(); err != nil {
				t.Errorf("%v: %v", args, err)
			}
		}
	})
	return s
}

// stop cancels the command and returns what it returned, or an error when it has not
// returned within 15 s.
func (s *serveRun) stop() error {
	s.byTest = true
	return s.halt()
}

func (s *serveRun) halt() error {
	s.once.Do(func() {
		s.cancel()
		select {
		case s.err = <-s.done:
		case <-time.After(15 * time.Second):
			s.err = errors.New("did not shut down within 15 s")
		}
	})
	return s.err
}

// echoClient is a real grpc-go xDS client, node id nodeID, of xds:///echo through the xDS
// server at xdsAddr; closed when the test ends.
func echoClient(t *testing.T, xdsAddr, nodeID string) testgrpc.TestServiceClient {
	t.Helper()
	cc := xdsclient.Dial(t, xdsAddr, xdsclient.Node{ID: nodeID}, "echo")
	return testgrpc.NewTestServiceClient(cc)
}

func serveTopology(addrs map[string]string, latency float64) string {
	return fmt.Sprintf(`nodes: [{name: n1}, {name: n2}]
latency: [{from: n1, to: n2, ms: %v}]
services:
  - name: client
    pods: [{name: c-0, node: n1}, {name: c-1, node: n2}]
  - name: echo
    pods:
      - {name: e-0, node: n1, address: %q}
      - {name: e-1, node: n2, address: %q}
calls: [{from: client, to: echo}]
ingress: [{service: client, rps: 10}]
`, latency, addrs["e-0"], addrs["e-1"])
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	// Write then rename, as a careful editor does, so a poll never sees half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func httpGet(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricValue returns the value of an unlabelled sample in a /metrics page ("" if absent).
func metricValue(page, name string) string {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(page)
	if m == nil {
		return ""
	}
	return m[1]
}

func TestServeFollowsTheFile(t *testing.T) {
	addrs := echoAddrs(testkit.StartEchoes(t, "e-0", "e-1"))
	path := filepath.Join(t.TempDir(), "topology.yaml")
	writeFile(t, path, serveTopology(addrs, 5))

	serve := startServeProcess(t, "serve", "-f", path, "--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
		"--policy", "localization", "--debounce-quiet", "5ms", "--poll-interval", "10ms", "--profiling-address", "127.0.0.1:0")
	stderr := serve.stderr

	var xdsAddr, metricsURL string
	re := regexp.MustCompile(`xDS on (\S+), metrics (http://\S+)/metrics`)
	testkit.Eventually(t, 15*time.Second, "the listening line", func() bool {
		m := re.FindStringSubmatch(stderr.String())
		if m != nil {
			xdsAddr, metricsURL = m[1], m[2]
		}
		return m != nil
	})
	testkit.Eventually(t, 15*time.Second, "/readyz", func() bool { code, _ := httpGet(metricsURL + "/readyz"); return code == 200 })
	if code, body := httpGet(metricsURL + "/healthz"); code != 200 {
		t.Errorf("/healthz: %d %s", code, body)
	}
	// pprof is served on its own loopback listener, never on the metrics one.
	var profURL string
	reProf := regexp.MustCompile(`profiling on (http://\S+)/debug/pprof/`)
	testkit.Eventually(t, 15*time.Second, "the profiling line", func() bool {
		m := reProf.FindStringSubmatch(stderr.String())
		if m != nil {
			profURL = m[1]
		}
		return m != nil
	})
	if code, _ := httpGet(metricsURL + "/debug/pprof/cmdline"); code != 404 {
		t.Errorf("/debug/pprof/cmdline on the metrics listener: HTTP %d, want 404", code)
	}
	if code, _ := httpGet(profURL + "/debug/pprof/cmdline"); code != 200 {
		t.Errorf("/debug/pprof/cmdline on --profiling-address: HTTP %d, want 200", code)
	}
	metrics := func() string { _, body := httpGet(metricsURL + "/metrics"); return body }
	if v := metricValue(metrics(), "edgeflow_xds_publications_total"); v != "1" {
		t.Errorf("publications_total = %q", v)
	}

	// A real grpc-go xDS client, node id c-0, follows the file: localization sends it to e-0
	// (same node) …
	client := echoClient(t, xdsAddr, "c-0")
	servedBy := func() string {
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer rcancel()
		r, err := client.UnaryCall(rctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatalf("RPC: %v", err)
		}
		return r.GetServerId()
	}
	if got := servedBy(); got != "e-0" {
		t.Fatalf("c-0 served by %s, want e-0", got)
	}

	// … until e-0 moves away: the file changes, the poll notices, the client follows.
	moved := strings.Replace(serveTopology(addrs, 5), "{name: e-0, node: n1", "{name: e-0, node: n2", 1)
	moved = strings.Replace(moved, "{name: e-1, node: n2", "{name: e-1, node: n1", 1)
	writeFile(t, path, moved)
	testkit.Eventually(t, 15*time.Second, "c-0 to follow the file", func() bool { return servedBy() == "e-1" })

	// A bad file is rejected and counted; the last good topology stays served.
	writeFile(t, path, "nodes: [{name: n1}]\nservices: [{name: echo, pods: [{name: e-0, node: nowhere}]}]\n")
	testkit.Eventually(t, 15*time.Second, "the reload error", func() bool { return metricValue(metrics(), "edgeflow_watcher_topology_errors_total") == "1" })
	if got := servedBy(); got != "e-1" {
		t.Errorf("after a bad file c-0 is served by %s", got)
	}
	if !strings.Contains(stderr.String(), `unknown node \"nowhere\"`) {
		t.Errorf("the reload error does not name the item:\n%s", stderr.String())
	}
	if code, _ := httpGet(metricsURL + "/readyz"); code != 200 {
		t.Error("not ready after a rejected reload")
	}

	// A good file again is delivered; SIGHUP forces a re-read even when nothing changed.
	writeFile(t, path, strings.Replace(moved, "ms: 5", "ms: 6", 1))
	testkit.Eventually(t, 15*time.Second, "the good file again", func() bool { return metricValue(metrics(), "edgeflow_watcher_topology_updates_total") == "3" })
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 15*time.Second, "the SIGHUP reload", func() bool { return metricValue(metrics(), "edgeflow_watcher_topology_updates_total") == "4" })

	if err := serve.stop(); err != nil {
		t.Errorf("serve returned %v", err)
	}
}

func TestServeBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	noAddress := filepath.Join(dir, "noaddr.yaml")
	writeFile(t, noAddress, strings.ReplaceAll(serveTopology(map[string]string{"e-0": "", "e-1": "10.0.0.1:80"}, 5), `address: ""`, `weight: 1`))
	invalid := filepath.Join(dir, "invalid.yaml")
	writeFile(t, invalid, "nodes: [{name: n1}]\nservices: [{name: a, pods: [{name: a-0, node: n9}]}]\n")
	serveGood := filepath.Join(dir, "good.yaml")
	writeFile(t, serveGood, serveTopology(map[string]string{"e-0": "10.0.0.1:80", "e-1": "10.0.0.2:80"}, 5))
	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"missing file", []string{"-f", filepath.Join(dir, "none.yaml"), "--xds-address", "127.0.0.1:0"}, "no such file"},
		{"invalid topology", []string{"-f", invalid, "--xds-address", "127.0.0.1:0"}, `unknown node "n9"`},
		{"callee without address", []string{"-f", noAddress, "--xds-address", "127.0.0.1:0"}, `pod "e-0" (service "echo") has no address`},
		{"no xds address", []string{"-f", invalid}, "xds-address"},
		{"bad policy", []string{"-f", invalid, "--xds-address", ":0", "--policy", "fastest"}, "unknown policy"},
		{"bad encoding", []string{"-f", invalid, "--xds-address", ":0", "--encoding", "endpoint"}, "unknown encoding"},
		{"bad lb policy", []string{"-f", invalid, "--xds-address", ":0", "--lb-policy", "fastest"}, "unknown lb policy"},
		{"negative egress port offset", []string{"-f", serveGood, "--xds-address", "127.0.0.1:0", "--egress-port-offset", "-1"}, "--egress-port-offset -1"},
		{"egress port offset past the ports", []string{"-f", serveGood, "--xds-address", "127.0.0.1:0", "--egress-port-offset", "65535"}, "want 0 to 65534"},
		{"stdin", []string{"-f", "-", "--xds-address", ":0"}, "standard input"},
		{"missing TLS certificate", []string{"-f", serveGood, "--xds-address", "127.0.0.1:0", "--xds-tls-cert", filepath.Join(dir, "absent.crt"), "--xds-tls-key", filepath.Join(dir, "absent.key")}, "absent.crt"},
		{"Istio mode with a file", []string{"-f", serveGood, "--xds-address", "127.0.0.1:0", "--istio-mode", "envoyfilter", "--istio-xds-address", "edgeflow:18000"}, "needs the cluster flags"},
		{"Istio per-pod mode, TLS, no server SAN", []string{"--kubeconfig", filepath.Join(dir, "absent.kubeconfig"), "--xds-address", "0.0.0.0:0", "--istio-mode", "envoyfilter", "--istio-xds-address", "edgeflow:18000",
			"--xds-tls-cert", filepath.Join(dir, "absent.crt"), "--xds-tls-key", filepath.Join(dir, "absent.key"), "--rebalance-lease-namespace", "edgeflow", "--namespaces", "shop"}, "needs --istio-xds-server-san"},
		{"plaintext xDS on every interface", []string{"-f", serveGood, "--xds-address", "0.0.0.0:0"}, "--insecure-xds"},
		{"plaintext xDS on an empty host", []string{"-f", serveGood, "--xds-address", ":0"}, "not a loopback address"},
		{"plaintext xDS on a host name", []string{"-f", serveGood, "--xds-address", "edgeflow.example:18000"}, "--insecure-xds"},
		{"profiling beyond loopback", []string{"-f", serveGood, "--xds-address", "127.0.0.1:0", "--profiling-address", "0.0.0.0:0"}, "--profiling-address 0.0.0.0:0 is not a loopback address"},
		{"Istio writer's Lease without a namespace outside a pod", []string{"--kubeconfig", filepath.Join(dir, "absent.kubeconfig"), "--xds-address", "127.0.0.1:0", "--istio-mode", "destinationrule", "--namespaces", "shop"}, "--rebalance-lease-namespace is required"},
		{"Istio mode, every namespace explicitly", []string{"--kubeconfig", filepath.Join(dir, "absent.kubeconfig"), "--xds-address", "127.0.0.1:0", "--istio-mode", "destinationrule", "--namespaces", "*"}, "--rebalance-lease-namespace is required"},
		{"Istio DestinationRule mode without --namespaces", []string{"--kubeconfig", filepath.Join(dir, "absent.kubeconfig"), "--xds-address", "127.0.0.1:0", "--istio-mode", "destinationrule", "--rebalance-lease-namespace", "edgeflow"}, "--istio-mode=destinationrule needs --namespaces"},
		{"Istio per-pod mode without --namespaces", []string{"--kubeconfig", filepath.Join(dir, "absent.kubeconfig"), "--xds-address", "127.0.0.1:0", "--istio-mode", "envoyfilter", "--istio-xds-address", "edgeflow:18000", "--rebalance-lease-namespace", "edgeflow"}, "--istio-mode=envoyfilter needs --namespaces"},
		{"every namespace and another", []string{"--kubeconfig", filepath.Join(dir, "absent.kubeconfig"), "--xds-address", "127.0.0.1:0", "--namespaces", "*,shop"}, `"*" is every namespace, so it goes alone`},
		{"Istio writer's Lease renewed beyond its duration", []string{"--kubeconfig", filepath.Join(dir, "absent.kubeconfig"), "--xds-address", "127.0.0.1:0", "--istio-mode", "destinationrule", "--rebalance-lease-namespace", "edgeflow", "--namespaces", "shop", "--istio-lease-renew-deadline", "20s"}, "must be below --istio-lease-duration"},
		{"Istio writer's Lease the rebalancer's", []string{"--kubeconfig", filepath.Join(dir, "absent.kubeconfig"), "--xds-address", "127.0.0.1:0", "--istio-mode", "destinationrule", "--rebalance-lease-namespace", "edgeflow", "--namespaces", "shop", "--rebalance", "--rebalance-dry-run=false", "--istio-lease-name", "edgeflow-rebalancer"}, "differ from --rebalance-lease-name"},
		{"a cluster flag with -f", []string{"-f", serveGood, "--xds-address", "127.0.0.1:0", "--namespaces", "shop"}, "--namespaces reads the topology from a cluster"},
		{"a probe flag with -f", []string{"-f", serveGood, "--xds-address", "127.0.0.1:0", "--probe-exporter-port", "9100"}, "--probe-exporter-port reads the topology from a cluster"},
		{"capacity history with -f", []string{"-f", serveGood, "--xds-address", "127.0.0.1:0", "--capacity-history-windows", "3"}, "--capacity-history-windows reads the topology from a cluster"},
		{"negative capacity history", []string{"--kubeconfig", filepath.Join(dir, "absent.kubeconfig"), "--xds-address", "127.0.0.1:0", "--capacity-history-windows", "-1"}, "--capacity-history-windows -1: want 0 (none) or a number of windows"},
		{"probe exporter port out of range", []string{"--kubeconfig", filepath.Join(dir, "absent.kubeconfig"), "--xds-address", "127.0.0.1:0", "--probe-exporter-port", "70000"}, "--probe-exporter-port 70000: want a port"},
		{"bad probe node selector", []string{"--kubeconfig", filepath.Join(dir, "absent.kubeconfig"), "--xds-address", "127.0.0.1:0", "--probe-node-selector", "role in (a"}, `--probe-node-selector "role in (a"`},
		{"bad probe address type", []string{"--kubeconfig", filepath.Join(dir, "absent.kubeconfig"), "--xds-address", "127.0.0.1:0", "--probe-address-type", "Hostname"}, "want InternalIP or ExternalIP"},
		{"TLS key without certificate", []string{"-f", serveGood, "--xds-address", "127.0.0.1:0", "--xds-tls-key", filepath.Join(dir, "absent.key")}, "both a certificate and a key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, "", append([]string{"serve"}, tc.args...)...)
			if code != exitBadInput || stdout != "" || !strings.Contains(stderr, tc.msg) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 naming %q", code, stdout, stderr, tc.msg)
			}
		})
	}
}

// TestServeSecurityChecks: plaintext xDS beyond loopback needs --insecure-xds, or TLS; loopback
// (IPv4, IPv6, localhost) needs neither.
func TestServeSecurityChecks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr, cert string
		insecure   bool
		ok         bool
	}{
		{"127.0.0.1:18000", "", false, true},
		{"[::1]:18000", "", false, true},
		{"localhost:18000", "", false, true},
		{"0.0.0.0:18000", "", false, false},
		{"0.0.0.0:18000", "", true, true},
		{"10.1.2.3:18000", "", false, false},
		{"[::]:18000", "", false, false},
		{"0.0.0.0:18000", "tls.crt", false, true},
	} {
		f := &serveFlags{xdsAddress: tc.addr, insecureXDS: tc.insecure}
		f.tls.CertFile, f.tls.KeyFile = tc.cert, tc.cert
		if err := f.checkSecurity(); (err == nil) != tc.ok {
			t.Errorf("--xds-address %s, TLS %q, --insecure-xds=%v: %v, want ok=%v", tc.addr, tc.cert, tc.insecure, err, tc.ok)
		}
	}
}

// TestHTTPServerTimeouts: edgeflow's HTTP servers time out slow clients at every stage.
func TestHTTPServerTimeouts(t *testing.T) {
	t.Parallel()
	s := newHTTPServer(http.NewServeMux(), time.Minute)
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 {
		t.Fatalf("timeouts: read header %v, read %v, write %v, idle %v; want all set", s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout)
	}
}
