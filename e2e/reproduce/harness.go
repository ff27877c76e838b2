package reproduce

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/internal/testkit"
)

// ns is the namespace of the applications.
const ns = "repro"

// xdsPort is where the xDS forwarder listens in the monitor namespace (the pods' xDS server).
const xdsPort = 18000

// Harness is the running testbed, control plane and live loop of one experiment.
type Harness struct {
	t       testing.TB
	ctx     context.Context
	dir     string
	tb      *testbed.Testbed
	cluster *kubeapi.Cluster
	loads   uint64 // slices loaded so far (Load: each its own Poisson seed)
	cs      kubernetes.Interface
	rt      *processRuntime
	efBin   string
	podBin  string
	promURL string // Prometheus as processes in the root namespace reach it
	rtt     map[[2]string]float64

	// xdsAddr is where the running serve listens for xDS (127.0.0.1:PORT, the kernel's pick,
	// read from its log): the forwarder's upstream; "" while no serve runs.
	xdsMu   sync.Mutex
	xdsAddr string
	log     io.Writer // progress and events
	// coresStop stops the node cores of the application deployed (nodeCores); nil: none run.
	coresStop func()
}

// NewHarness builds the binaries, the testbed (scenario scenario's RTTs), its probes, the
// control plane with the fake kubelet running pods as processes, and the forwarders between
// the root namespace (API server, serve, rebalance) and the testbed (Prometheus, pods).
// Everything stops in t's cleanup.
func NewHarness(t testing.TB, ctx context.Context, scenario string, log io.Writer) *Harness {
	t.Helper()
	return NewHarnessWith(t, ctx, scenario, log, "", nil)
}

// NewHarnessWith is NewHarness with the nodes' CPU (their capacity and allocatable, a quantity;
// "": kubeapi's default, 4 cores) and a hidden L7 penalty (testbed.Config.TCPPenalty: ms that
// TCP from the first node of a pair to the second pays, and ICMP does not; nil: none).
func NewHarnessWith(t testing.TB, ctx context.Context, scenario string, log io.Writer, nodeCPU string, tcpPenalty map[[2]string]float64) *Harness {
	t.Helper()
	testbed.RequireRoot(t)
	kubeapi.Require(t)
	rtt, err := Scenario(scenario)
	if err != nil {
		t.Fatal(err)
	}
	h := &Harness{t: t, ctx: ctx, dir: t.TempDir(), rtt: rtt, log: log}
	h.efBin, h.podBin = testkit.Binary(t), podBinary(t)

	pool := podAddresses(Nodes)
	targets := filepath.Join(h.dir, "pod-targets.json")
	h.tb = testbed.Start(t, testbed.Config{Nodes: Nodes, RTT: rtt, Aliases: pool, TCPPenalty: tcpPenalty,
		ScrapeConfigs: podScrapeJob(targets, podScrapeInterval)})
	h.tb.StartProbes(t)
	h.promURL = h.promProxy()
	h.forward(net.JoinHostPort(h.tb.MonitorIP(), strconv.Itoa(xdsPort)), h.upstream)

	h.cluster = kubeapi.Start(t, kubeapi.Options{Scheduler: true, ControllerManager: true})
	h.cs = h.cluster.Client
	h.discoverPods(targets)
	if _, err := h.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range Nodes {
		if _, err := kubeapi.CreateNode(ctx, h.cs, kubeapi.NodeSpec{Name: n, Address: h.tb.NodeIP(n), CPU: nodeCPU}); err != nil {
			t.Fatal(err)
		}
	}
	logDir := filepath.Join(h.dir, "pods")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	h.rt = newProcessRuntime(h.tb, h.podBin, net.JoinHostPort(h.tb.MonitorIP(), strconv.Itoa(xdsPort)), logDir, pool)
	t.Cleanup(h.stopCores)  // after the pods stop (cleanups run last-in first-out)
	t.Cleanup(h.rt.StopAll) // after the fake kubelet stops
	kubeapi.RunFakeKubelet(ctx, t, h.cs, kubeapi.FakeKubeletOptions{Namespaces: []string{ns}, Runtime: h.rt})
	return h
}

// SetScenario sets every node pair's RTT to the scenario's; it reports whether that changed
// any (false: the testbed already had the scenario's RTTs).
func (h *Harness) SetScenario(name string) bool {
	rtt, err := Scenario(name)
	if err != nil {
		h.t.Fatal(err)
	}
	if maps.Equal(rtt, h.rtt) {
		return false
	}
	for pair, ms := range rtt {
		if err := h.tb.SetRTT(pair[0], pair[1], ms); err != nil {
			h.t.Fatal(err)
		}
	}
	h.rtt = rtt
	return true
}

// The pod binary, built once per test process (podBinary) into podDir, which TestMain removes.
var (
	podOnce sync.Once
	podDir  string
	podBin  string
	podErr  error
)

// podBinary returns the pods' binary (./pod), built on first use in this test process.
func podBinary(t testing.TB) string {
	t.Helper()
	podOnce.Do(func() {
		if podDir, podErr = os.MkdirTemp("", "edgeflow-reproduce-pod-"); podErr != nil {
			return
		}
		podBin = filepath.Join(podDir, "pod")
		cmd := exec.Command("go", "build", "-o", podBin, "./pod")
		cmd.Dir = filepath.Join(testkit.RepoRoot(), "e2e", "reproduce")
		if b, err := cmd.CombinedOutput(); err != nil {
			podErr = fmt.Errorf("go build ./pod: %v\n%s", err, b)
		}
	})
	if podErr != nil {
		t.Fatal(podErr)
	}
	return podBin
}

// removePodBinary removes what podBinary built (TestMain, after the tests).
func removePodBinary() {
	if podDir != "" {
		os.RemoveAll(podDir)
	}
}

// promProxy serves Prometheus (in the monitor namespace) on a root-namespace loopback port, for
// serve and rebalance, and returns its URL.
func (h *Harness) promProxy() string {
	target, _ := url.Parse(h.tb.PrometheusURL())
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = h.tb.PrometheusTransport()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.t.Fatal(err)
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	h.t.Cleanup(func() { srv.Close(); <-done })
	return "http://" + lis.Addr().String()
}

// forward listens on addr inside the monitor namespace and forwards every connection to the
// root namespace's upstream() ("" refuses it: the client retries): the xDS forwarder
// (MONITOR_IP:18000 → the running serve) lets the pods reach the xDS server across the bridge
// (no added delay) while serve runs in the root namespace next to the API server.
func (h *Harness) forward(addr string, upstream func() string) {
	lis, err := h.tb.ListenMonitor("tcp", addr)
	if err != nil {
		h.t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	track := func(c net.Conn, add bool) {
		mu.Lock()
		defer mu.Unlock()
		if add {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	wg.Add(1)
	go func() { // owned by the harness: ends when the listener is closed in cleanup
		defer wg.Done()
		for {
			down, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer down.Close()
				addr := upstream()
				if addr == "" {
					return // serve is not running (between rows): the client retries
				}
				up, err := net.DialTimeout("tcp", addr, 2*time.Second)
				if err != nil {
					return
				}
				defer up.Close()
				track(down, true)
				track(up, true)
				defer track(down, false)
				defer track(up, false)
				pipe(down, up)
			}()
		}
	}()
	h.t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// upstream is where the running serve listens for xDS, "" when none runs.
func (h *Harness) upstream() string {
	h.xdsMu.Lock()
	defer h.xdsMu.Unlock()
	return h.xdsAddr
}

func (h *Harness) setUpstream(addr string) {
	h.xdsMu.Lock()
	defer h.xdsMu.Unlock()
	h.xdsAddr = addr
}

// clearUpstream forgets addr as the upstream (its serve stopped), unless another serve's has
// replaced it.
func (h *Harness) clearUpstream(addr string) {
	h.xdsMu.Lock()
	defer h.xdsMu.Unlock()
	if h.xdsAddr == addr {
		h.xdsAddr = ""
	}
}

// pipe copies both ways until either side closes, then closes both.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(a, b); a.Close(); b.Close(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(b, a); a.Close(); b.Close(); done <- struct{}{} }()
	<-done
	<-done
}
func (h *Harness) eventually(d time.Duration, what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		select {
		case <-h.ctx.Done():
			h.t.Fatalf("waiting for %s: %v", what, h.ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
