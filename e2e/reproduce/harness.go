package reproduce

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/internal/testkit"
	webui "github.com/edgeflow/edgeflow/internal/ui"
	"github.com/edgeflow/edgeflow/rebalancer"
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
}

// NewHarness builds the binaries, the testbed (scenario scenario's RTTs), its probes, the
// control plane with the fake kubelet running pods as processes, and the forwarders between
// the root namespace (API server, serve, rebalance) and the testbed (Prometheus, pods).
// Everything stops in t's cleanup.
func NewHarness(t testing.TB, ctx context.Context, scenario string, log io.Writer) *Harness {
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
	h.tb = testbed.Start(t, testbed.Config{Nodes: Nodes, RTT: rtt, Aliases: pool})
	h.tb.StartProbes(t)
	h.promURL = h.promProxy()
	h.xdsForwarder()

	h.cluster = kubeapi.Start(t, kubeapi.Options{Scheduler: true, ControllerManager: true})
	h.cs = h.cluster.Client
	if _, err := h.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range Nodes {
		if _, err := kubeapi.CreateNode(ctx, h.cs, kubeapi.NodeSpec{Name: n, Address: h.tb.NodeIP(n)}); err != nil {
			t.Fatal(err)
		}
	}
	logDir := filepath.Join(h.dir, "pods")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	h.rt = newProcessRuntime(h.tb, h.podBin, net.JoinHostPort(h.tb.MonitorIP(), strconv.Itoa(xdsPort)), logDir, pool)
	t.Cleanup(h.rt.StopAll) // after the fake kubelet stops (cleanups run last-in first-out)
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

// pickLoopbacks returns n distinct loopback addresses free when picked, for a child process
// to bind (a process cannot be handed a listener): all n are held open until the last is
// picked, so that two picks in a row cannot return one port. Another socket can take a port
// between the pick and the child's bind; the caller starts the child again on new picks when
// its bind fails (bindFailed).
func pickLoopbacks(t testing.TB, n int) []string {
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		out = append(out, l.Addr().String())
	}
	return out
}

// bindFailed says whether a child process's error is its failure to bind a picked port.
func bindFailed(err error) bool {
	return err != nil && strings.Contains(err.Error(), "address already in use")
}

// bindTries is how many times a child is started on new picks before its bind failure fails
// the test.
const bindTries = 3

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

// xdsForwarder listens on MONITOR_IP:18000 inside the monitor namespace and forwards every
// connection to serve on h.xdsAddr: the pods reach the xDS server across the bridge (no added
// delay) while serve runs in the root namespace next to the API server.
func (h *Harness) xdsForwarder() {
	lis, err := h.tb.ListenMonitor("tcp", net.JoinHostPort(h.tb.MonitorIP(), strconv.Itoa(xdsPort)))
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
				addr := h.upstream()
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

// Deploy creates the application's managed Services and Deployments (the kube-scheduler places
// the pods) and waits until every pod runs and is ready.
func (h *Harness) Deploy(a App, w Workload) {
	for _, c := range a.Components {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: ns, Labels: map[string]string{kubeapi.ManagedLabel: "true"}},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": c.Name},
				Ports: []corev1.ServicePort{{Name: "grpc", Port: podPort, TargetPort: intstr.FromInt32(podPort)}}}}
		if _, err := h.cs.CoreV1().Services(ns).Create(h.ctx, svc, metav1.CreateOptions{}); err != nil {
			h.t.Fatal(err)
		}
		args := []string{"--workers", strconv.Itoa(w.Workers), "--service-time", w.ServiceTime.String()}
		for _, callee := range c.Calls {
			args = append(args, "--call", callee+"."+ns)
		}
		replicas := int32(c.Replicas)
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: ns},
			Spec: appsv1.DeploymentSpec{Replicas: &replicas,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": c.Name}},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": c.Name}},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "edgeflow-reproduce-pod", Args: args,
						Ports: []corev1.ContainerPort{{Name: "grpc", ContainerPort: podPort}},
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU: resource.MustParse(c.CPU), corev1.ResourceMemory: resource.MustParse("128Mi")}}}}}}}}
		if _, err := h.cs.AppsV1().Deployments(ns).Create(h.ctx, d, metav1.CreateOptions{}); err != nil {
			h.t.Fatal(err)
		}
	}
	h.waitSettled(a, 90*time.Second)
}

// Undeploy deletes the application and waits until its pods are gone. It also deletes the
// rebalancer's state ConfigMap: each application × scenario is a new experiment, but its
// Deployments have the names of the last one, and the state's cool-downs ("productpage left
// n1") would refuse the next rebalance moves planned on a new RTT matrix. A full run of
// 2026-12-02 had scenario B's rebalancer make 1 of its planned moves in 184 s for Bookinfo,
// every other refused by scenario A's cool-down.
func (h *Harness) Undeploy(a App) {
	for _, c := range a.Components {
		_ = h.cs.AppsV1().Deployments(ns).Delete(h.ctx, c.Name, metav1.DeleteOptions{})
		_ = h.cs.CoreV1().Services(ns).Delete(h.ctx, c.Name, metav1.DeleteOptions{})
	}
	state := metav1.ListOptions{LabelSelector: rebalancer.ManagedByLabel + "=" + rebalancer.ManagedByValue + "," +
		rebalancer.ComponentLabel + "=" + rebalancer.ComponentValue}
	if err := h.cs.CoreV1().ConfigMaps("default").DeleteCollection(h.ctx, metav1.DeleteOptions{}, state); err != nil {
		h.t.Fatalf("deleting the rebalancer's state: %v", err)
	}
	h.eventually(90*time.Second, "the application's pods gone", func() bool {
		l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
}

// waitSettled waits until every component has exactly its replicas, all bound, running and
// ready, none terminating.
func (h *Harness) waitSettled(a App, d time.Duration) {
	h.eventually(d, "every pod of "+a.Name+" ready", func() bool { return h.unsettled(a) == "" })
}

// unsettled says what is not settled yet ("" when all is).
func (h *Harness) unsettled(a App) string {
	l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	count := map[string]int{}
	for _, p := range l.Items {
		if p.DeletionTimestamp != nil {
			return "pod " + p.Name + " terminating"
		}
		if p.Spec.NodeName == "" {
			return "pod " + p.Name + " pending"
		}
		if !podReady(&p) {
			return "pod " + p.Name + " not ready"
		}
		count[p.Labels["app"]]++
	}
	for _, c := range a.Components {
		if count[c.Name] != c.Replicas {
			return fmt.Sprintf("%s has %d pods, want %d", c.Name, count[c.Name], c.Replicas)
		}
	}
	return ""
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Pending lists the pods not bound to a node (and not terminating).
func (h *Harness) Pending() []string {
	l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, p := range l.Items {
		if p.Spec.NodeName == "" && p.DeletionTimestamp == nil {
			out = append(out, p.Name)
		}
	}
	return out
}

// Placement returns, per component, how many of its pods run on each node.
func (h *Harness) Placement(a App) map[string]map[string]int {
	l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]map[string]int{}
	for _, c := range a.Components {
		out[c.Name] = map[string]int{}
	}
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil && p.Spec.NodeName != "" && out[p.Labels["app"]] != nil {
			out[p.Labels["app"]][p.Spec.NodeName]++
		}
	}
	return out
}

// endpoints returns the IPs of the ready pods of a component.
func (h *Harness) endpoints(component string) []string {
	l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{LabelSelector: "app=" + component})
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil && podReady(&p) && p.Status.PodIP != "" {
			out = append(out, net.JoinHostPort(p.Status.PodIP, strconv.Itoa(podPort)))
		}
	}
	sort.Strings(out)
	return out
}

// callers counts the pods that call another service (the xDS node ids serve must see) and the
// xDS streams they open: grpc-go (v1.85) keeps one xDS client, so one ADS stream, per channel
// target (internal/xds/resolver/xds_resolver.go: newXDSClient(target.String(), …)), so a pod
// calling two services holds two streams. Counting streams alone once let the first slice
// after the rebalancer start while the pods of one service were still in their reconnect
// backoff, their RPCs waiting for a listener: a slice of P50 ≈ 290 ms.
func callers(a App) (pods, streams int) {
	for _, c := range a.Components {
		if len(c.Calls) > 0 {
			pods += c.Replicas
			streams += c.Replicas * len(c.Calls)
		}
	}
	return pods, streams
}

// callGraph writes the application's call graph with the load rate as ingress, the file
// `--calls` of serve and rebalance reads (there is no Istio telemetry to measure it here).
func (h *Harness) callGraph(a App, rate float64) string {
	var b strings.Builder
	b.WriteString("calls:\n")
	for _, c := range a.Components {
		for _, callee := range c.Calls {
			fmt.Fprintf(&b, "  - {from: %s.%s, to: %s.%s}\n", c.Name, ns, callee, ns)
		}
	}
	fmt.Fprintf(&b, "ingress:\n  - {service: %s.%s, rps: %g}\n", a.Entry(), ns, rate)
	path := filepath.Join(h.dir, fmt.Sprintf("calls-%s-%g.yaml", a.Name, rate))
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		h.t.Fatal(err)
	}
	return path
}

// proc is a child process of the harness (serve, rebalance) with its log.
type proc struct {
	name, log string
	from      int64 // where this process's lines start in log (earlier ones append to it too)
	cmd       *exec.Cmd
	done      chan struct{}
	ui        string // serve's web view (HOST:PORT), if it has one
	stopped   func() // called once the process has stopped, if set
}

func (h *Harness) start(name string, args ...string) *proc {
	logPath := filepath.Join(h.dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		h.t.Fatal(err)
	}
	defer f.Close()
	from, _ := f.Seek(0, io.SeekEnd)
	fmt.Fprintf(f, "### %s %s\n", time.Now().Format(time.RFC3339), strings.Join(args, " "))
	cmd := exec.Command(h.efBin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	p := &proc{name: name, log: logPath, from: from, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	h.t.Cleanup(p.stop)
	return p
}

func (p *proc) stop() {
	stopProcess(p.cmd, p.done, 10*time.Second)
	if p.stopped != nil {
		p.stopped()
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// text is what p wrote to its log.
func (p *proc) text() string {
	b, _ := os.ReadFile(p.log)
	return string(b[min(p.from, int64(len(b))):])
}

// lines returns the lines p wrote to its log that contain any of subs.
func (p *proc) lines(subs ...string) []string {
	var out []string
	for _, line := range strings.Split(p.text(), "\n") {
		for _, sub := range subs {
			if strings.Contains(line, sub) {
				out = append(out, line)
				break
			}
		}
	}
	return out
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	return lastLines(string(b), 15)
}

// metricsClient keeps no idle connections: serve and rebalance come and go.
var metricsClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// Served is what serve had published when a slice ended: the callee pods' planned request
// rates, and the plan's network cost priced at the scenario's configured RTTs.
type Served struct {
	CalleeRPS map[string]float64
	// Cost is Σ route req/s × the configured RTT between the caller's and the callee's nodes
	// (0 on one node), in ms·req/s: what the plan costs on the testbed's delays, whatever RTTs
	// serve measured, so that the plans of different slices and policies are priced alike.
	Cost float64
	// Traffic is the plan's req/s from the caller's node to the callee's, per ordered pair of
	// distinct nodes; PlannedRTT the latency (ms) of each ordered node pair that serve planned
	// on (the publication's, measured), so that plans can be priced alike at serve's inputs
	// (costAt).
	Traffic, PlannedRTT map[[2]string]float64
}

// costAt prices traffic (req/s per ordered node pair) at rtt (ms per ordered node pair):
// Σ req/s × ms; false if a pair with traffic has no latency.
func costAt(traffic, rtt map[[2]string]float64) (float64, bool) {
	var cost float64
	for pair, rps := range traffic {
		ms, ok := rtt[pair]
		if !ok {
			return 0, false
		}
		cost += rps * ms
	}
	return cost, true
}

// snapshot reads serve's last publication from its web view.
func snapshot(ui string) (*webui.Snapshot, error) {
	resp, err := metricsClient.Get("http://" + ui + "/snapshot.json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var snap webui.Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
		return nil, err
	}
	return &snap, nil
}

// planned reads serve's last publication from its web view's snapshot and prices it (price).
func planned(ui string, rtt map[[2]string]float64) (Served, error) {
	snap, err := snapshot(ui)
	if err != nil {
		return Served{}, err
	}
	return price(snap, rtt)
}

// onMeasuredLatency says why snap's publication is not planned on measured RTTs ("" when it
// is): serve publishes before Prometheus first answers, on its degraded plan (every node pair
// at one latency, which no scenario's RTT matrix has: LATA's routes are then blind to the
// network), and replaces it when the measurements arrive (--prometheus-interval later, or
// more on a busy machine); a slice measured before that measures a plan other than the row's
// policy makes on the testbed's RTTs.
func onMeasuredLatency(snap *webui.Snapshot, nodes []string) string {
	for _, d := range snap.Degraded {
		if d.Input == "latency" {
			return "latency degraded: " + d.Message
		}
	}
	if want := len(nodes) * (len(nodes) - 1); len(snap.Latency) != want {
		return fmt.Sprintf("the publication has %d node pairs' latency, want %d", len(snap.Latency), want)
	}
	for _, l := range snap.Latency[1:] {
		if l.MS != snap.Latency[0].MS {
			return ""
		}
	}
	return fmt.Sprintf("the publication has every node pair at %g ms (the degraded plan)", snap.Latency[0].MS)
}

// price sums snap's routes by callee pod and prices them at rtt (node pair → ms, either order).
func price(snap *webui.Snapshot, rtt map[[2]string]float64) (Served, error) {
	node := map[string]string{}
	for _, n := range snap.Nodes {
		for _, p := range n.Pods {
			node[p.Name] = n.Name
		}
	}
	out := Served{CalleeRPS: map[string]float64{}, Traffic: map[[2]string]float64{}}
	for _, e := range snap.Edges {
		for _, r := range e.Routes {
			out.CalleeRPS[r.Callee] += r.RPS
			from, to := node[r.Caller], node[r.Callee]
			if from == "" || to == "" {
				return Served{}, fmt.Errorf("route %s → %s: a pod the snapshot places on no node", r.Caller, r.Callee)
			}
			if from == to {
				continue
			}
			ms, ok := rtt[[2]string{from, to}]
			if !ok {
				ms, ok = rtt[[2]string{to, from}]
			}
			if !ok {
				return Served{}, fmt.Errorf("route %s → %s: no configured RTT between %s and %s", r.Caller, r.Callee, from, to)
			}
			out.Cost += r.RPS * ms
			out.Traffic[[2]string{from, to}] += r.RPS
		}
	}
	if len(out.CalleeRPS) == 0 {
		return Served{}, fmt.Errorf("serve has published no plan (publication %d)", snap.Publication)
	}
	out.PlannedRTT = map[[2]string]float64{}
	for _, l := range snap.Latency {
		out.PlannedRTT[[2]string{l.From, l.To}] = l.MS
	}
	return out, nil
}

// metrics reads a Prometheus text endpoint: each series by its name and labels as exposed
// (NAME{L="V"}), and each metric name with the sum of its series.
func metrics(addr string) (map[string]float64, error) {
	resp, err := metricsClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		name := line[:i]
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		if j := strings.IndexByte(name, '{'); j >= 0 {
			out[name] = v // one series, by its name and labels
			name = name[:j]
		}
		out[name] += v
	}
	return out, sc.Err()
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

// serveListens matches the lines where serve names the addresses it bound.
var (
	serveXDS = regexp.MustCompile(`edgeflow serve: xDS on (\S+), metrics http://(\S+)/metrics`)
	serveUI  = regexp.MustCompile(`edgeflow serve: web view on http://(\S+)/`)
)

// Serve starts `edgeflow serve` on the live inputs with the policy and the call graph at rate,
// and waits until it has published a plan on measured RTTs (onMeasuredLatency) and every
// caller pod's xDS client is connected to it. Its listeners are on ports the kernel picks as
// serve binds them (127.0.0.1:0), read from the lines where it names them: no port is picked
// here and bound later by another process. The forwarder sends the pods' xDS connections to
// this serve until it stops.
func (h *Harness) Serve(a App, p Policy, rate float64) *proc {
	s := h.start("serve", "serve", "--kubeconfig", h.cluster.Kubeconfig, "--prometheus-url", h.promURL,
		"--calls", h.callGraph(a, rate), "--namespaces", ns, "--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
		"--ui-address", "127.0.0.1:0", "--policy", p.Allocation, "--lb-policy", p.LB, "--prometheus-interval", "2s", "--log-level", "warn")
	var xdsAddr, metricsAddr string
	h.eventually(60*time.Second, "serve naming its listeners", func() bool {
		if s.exited() {
			h.t.Fatalf("edgeflow serve exited:\n%s", s.tail())
		}
		text := s.text()
		m, u := serveXDS.FindStringSubmatch(text), serveUI.FindStringSubmatch(text)
		if m == nil || u == nil {
			return false
		}
		xdsAddr, metricsAddr, s.ui = m[1], m[2], u[1]
		return true
	})
	h.setUpstream(xdsAddr)
	s.stopped = func() { h.clearUpstream(xdsAddr) }

	pods, streams := callers(a)
	what := fmt.Sprintf("serve publishing a plan on measured RTTs and %d caller pods connected with %d streams", pods, streams)
	var last map[string]float64
	latency := "not read"
	defer func() {
		if last != nil && h.t.Failed() { // the wait timed out: say how far it got
			fmt.Fprintf(h.log, "serve: at the timeout %g publications, %g caller pods, %g streams; latency: %s\n",
				last["edgeflow_xds_publications_total"], last["edgeflow_xds_nodes"], last["edgeflow_xds_connected_clients"], latency)
		}
	}()
	h.eventually(90*time.Second, what, func() bool {
		if s.exited() {
			h.t.Fatalf("edgeflow serve exited:\n%s", s.tail())
		}
		m, err := metrics(metricsAddr)
		if err != nil {
			return false
		}
		last = m
		if !(m["edgeflow_xds_publications_total"] > 0 && m["edgeflow_xds_nodes"] >= float64(pods) &&
			m["edgeflow_xds_connected_clients"] >= float64(streams)) {
			return false
		}
		snap, err := snapshot(s.ui)
		if err != nil {
			latency = err.Error()
			return false
		}
		latency = onMeasuredLatency(snap, Nodes)
		return latency == ""
	})
	return s
}

// Rebalanced is what one `edgeflow rebalance` did: its evictions, and the predicted LATA cost
// (its model: Σ req/s × measured RTT, ms·req/s) of the placement it found and of the one it
// left.
type Rebalanced struct {
	Moves               int
	CostBefore, CostNow float64
	// Settled: it finished its plan (two runs since its last move, every pod placed, its
	// planned gain under the threshold) before the timeout.
	Settled bool
}

// Rebalance runs `edgeflow rebalance --dry-run=false` on the cluster (with its placement
// webhook registered), a run every period on RTTs averaged over window, until it has made its
// moves and the pods settled, or until timeout.
func (h *Harness) Rebalance(a App, rate float64, period, window, timeout time.Duration) Rebalanced {
	r, webhookAddr, metricsAddr, caPEM := h.startRebalance(a, rate, period, window)
	u := "https://" + webhookAddr + rebalancer.WebhookPath
	cfg := rebalancer.MutatingWebhookConfiguration(admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: caPEM})
	if _, err := h.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(h.ctx, cfg, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	defer func() {
		r.stop()
		_ = h.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(h.ctx, cfg.Name, metav1.DeleteOptions{})
		// What it decided: every run that planned moves (its predicted costs, the moves it
		// skipped and why) and every eviction.
		for _, line := range r.lines("rebalancer: run", "rebalancer: evicted", "rebalancer: eviction refused") {
			if !strings.Contains(line, "planned=0") {
				fmt.Fprintf(h.log, "rebalance log: %s\n", line)
			}
		}
	}()
	deadline := time.Now().Add(timeout)
	var moves, lastMoves, runsAtLast, gain float64
	var out Rebalanced
	const current = `edgeflow_rebalance_predicted_latency_cost_seconds{placement="current"}`
	for time.Now().Before(deadline) {
		if r.exited() {
			h.t.Fatalf("edgeflow rebalance exited:\n%s", r.tail())
		}
		time.Sleep(time.Second)
		m, err := metrics(metricsAddr)
		if err != nil {
			continue
		}
		moves = m["edgeflow_rebalance_moves_total"]
		runs := m["edgeflow_rebalance_runs_total"]
		if c, ok := m[current]; ok && runs > 0 {
			if out.CostBefore == 0 {
				out.CostBefore = c * 1000
			}
			out.CostNow = c * 1000
		}
		out.Moves = int(moves)
		if moves != lastMoves {
			lastMoves, runsAtLast = moves, runs
			fmt.Fprintf(h.log, "rebalance: %g moves so far\n", moves)
		}
		// Settled: two runs since the last move, every pod placed, and the last run's target
		// gains less than the threshold over the placement now. A run without an eviction is
		// not enough: moves wait out the per-node limit and their service's replacements, and
		// stopping between them leaves half a plan, whose predicted cost can be above the
		// start's (each move's cost assumes the moves before it; a full run stopped DAG B
		// after 2 of 3 moves that way).
		gain = m["edgeflow_rebalance_planned_gain_ratio"]
		if runs >= runsAtLast+2 && h.unsettled(a) == "" && gain < rebalancer.DefaultThreshold {
			out.Settled = true
			return out
		}
	}
	fmt.Fprintf(h.log, "rebalance: not settled within %v (%g moves; the last run's planned gain %.3f; %s)\n", timeout, moves, gain, h.unsettled(a))
	return out
}

// startRebalance starts `edgeflow rebalance --dry-run=false` with its webhook and metrics on
// picked loopback ports and waits until its metrics answer (it binds the webhook's port
// before them); a bind that fails (the port taken since the pick) starts it again on others.
func (h *Harness) startRebalance(a App, rate float64, period, window time.Duration) (r *proc, webhookAddr, metricsAddr string, caPEM []byte) {
	certFile, keyFile, caPEM := h.selfSigned()
	calls := h.callGraph(a, rate)
	for try := 1; ; try++ {
		addrs := pickLoopbacks(h.t, 2)
		webhookAddr, metricsAddr = addrs[0], addrs[1]
		r = h.start("rebalance", "rebalance", "--dry-run=false", "--kubeconfig", h.cluster.Kubeconfig, "--prometheus-url", h.promURL,
			"--calls", calls, "--namespaces", ns, "--lease-namespace", "default", "--period", period.String(), "--min-age", "1s",
			"--prometheus-window", window.String(),
			"--webhook-address", webhookAddr, "--webhook-tls-cert", certFile, "--webhook-tls-key", keyFile,
			"--metrics-address", metricsAddr, "--prometheus-interval", "2s")
		var exited error
		h.eventually(60*time.Second, "edgeflow rebalance's metrics", func() bool {
			if r.exited() {
				exited = fmt.Errorf("edgeflow rebalance exited:\n%s", r.tail())
				return true
			}
			_, err := metrics(metricsAddr)
			return err == nil
		})
		if exited == nil {
			return r, webhookAddr, metricsAddr, caPEM
		}
		if try == bindTries || !bindFailed(exited) {
			h.t.Fatal(exited)
		}
		fmt.Fprintf(h.log, "rebalance: a picked port was taken before it bound; starting it again on others\n")
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key, for the webhook.
func (h *Harness) selfSigned() (certFile, keyFile string, certPEM []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		h.t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edgeflow-webhook"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		h.t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		h.t.Fatal(err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	certFile, keyFile = filepath.Join(h.dir, "webhook.crt"), filepath.Join(h.dir, "webhook.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		h.t.Fatal(err)
	}
	return certFile, keyFile, certPEM
}
