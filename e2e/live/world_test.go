package live

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
	"github.com/edgeflow/edgeflow/xds"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// edges are the testbed nodes most tests use: the callers' nodes edge-1 and edge-2, the
// callees' edge-3 and edge-4.
var edges = []string{"edge-1", "edge-2", "edge-3", "edge-4"}

// edgeRTT is their usual delay: each caller's node is 10 ms from one callee's node and 40 ms
// from the other (edge-1 near edge-3, edge-2 near edge-4); 20 ms within each side.
func edgeRTT() map[[2]string]float64 {
	return map[[2]string]float64{
		{"edge-1", "edge-3"}: 10, {"edge-1", "edge-4"}: 40, {"edge-2", "edge-3"}: 40,
		{"edge-2", "edge-4"}: 10, {"edge-1", "edge-2"}: 20, {"edge-3", "edge-4"}: 20}
}

// shopPods is the usual placement on edges: web-1 and web-2 (callers) on edge-1 and edge-2,
// api-3 and api-4 (callees, with backends) on edge-3 and edge-4.
var shopPods = []placement{{"web", "web-1", "edge-1"}, {"web", "web-2", "edge-2"}, {"api", "api-3", "edge-3"}, {"api", "api-4", "edge-4"}}

// placement is a pod of service svc on node.
type placement struct{ svc, pod, node string }

// world is what a live test runs on, each part only when worldOptions asks for it: a
// network-namespace testbed with real delay between its nodes, with blackbox exporters and a
// Prometheus probing them (and scraping the istio_requests_total the test serves); a real
// kube-apiserver with the namespace shop, its nodes, managed Services and pods, played by a
// kubeapi.Kubelet; a pod namespace with a real gRPC backend per backend pod; and edgeflow on it
// (watch). Everything stops, and every namespace is deleted, when the test ends, also when it
// fails.
type world struct {
	t   *testing.T
	ctx context.Context // API calls and RPCs; ends with the test (or after worldOptions.timeout)

	tb       *testbed.Testbed  // nil without a testbed
	podLoad  *reportedPodLoads // what the exporter serves of worldOptions.podLoad
	cluster  *kubeapi.Cluster  // nil without Kubernetes
	k        *kubeapi.Kubelet
	podNS    *testbed.Namespace // nil without backends
	backends map[string]*testkit.Echo
	port     int32 // the Services' target port: the backends'
	nextIP   int   // the next pod without a backend gets podIP(100 + nextIP)

	// edgeflow, once watch ran.
	reg   *prometheus.Registry
	ks    *kube.Source
	ps    *prom.Source // nil without Prometheus
	cl    *watcher.Live
	srv   *xdsserver.Server
	addr  string           // the xDS server's
	ready *httptest.Server // watcher.ReadyHandler: /readyz
}

// worldOptions says what a test's world holds.
type worldOptions struct {
	// nodes are the testbed's nodes (none: no testbed), rtt the round-trip times between them
	// in ms, scrape Prometheus's scrape interval (0: the testbed's default, 1 s).
	nodes  []string
	rtt    map[[2]string]float64
	scrape time.Duration
	// istio is served as istio_requests_total in the monitor namespace, a target Prometheus
	// scrapes (serveIstioMetrics).
	istio []reportedEdge
	// podLoad is served instead (not with istio): each pod's Istio request and duration counters and its
	// cAdvisor CPU counters (reportedPodLoads).
	podLoad []reportedPod
	// attempts are served with podLoad: proxyless gRPC callers' call attempts by callee
	// locality, as grpc-go's OpenTelemetry metrics name them (reportedPodLoads).
	attempts []reportedAttempt
	// promDown stops Prometheus as soon as it is ready, before its first scrape.
	promDown bool
	// honorTargets are scraped with honor_labels (testbed.Config.HonorLabelsTargets).
	honorTargets []string

	// kube starts a real kube-apiserver (with etcd) and creates the namespace shop.
	kube bool
	// kubeNodes are registered as Ready nodes (nil: the testbed's nodes), each in zones[node]
	// of region eu when zones is given.
	kubeNodes []string
	zones     map[string]string
	// services are created as managed Services.
	services []string
	// backends are pods with a real gRPC backend (testkit.Echo), in a pod namespace
	// (198.18.1.0/24 on its loopback), all on one port: the Services' target port (else 9000).
	backends []string
	// pods are ready Deployment pods created at once, in order.
	pods []placement
	// timeout bounds ctx (0: 10 minutes).
	timeout time.Duration
}

// newWorld builds the world o describes. It skips the test (or fails it with CI=true) when the
// machine cannot run what it asks for.
func newWorld(t *testing.T, o worldOptions) *world {
	t.Helper()
	if len(o.nodes) > 0 || len(o.backends) > 0 {
		testbed.RequireRoot(t)
	}
	if o.kube {
		kubeapi.Require(t) // before the testbed is built for nothing
	}
	timeout := o.timeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	w := &world{t: t, ctx: ctx, port: 9000, backends: map[string]*testkit.Echo{}}
	// The control plane first: it may wait for a boot slot (kubeapi.Start), and Prometheus's
	// samples should begin as the tests' timelines say, just before edgeflow starts.
	if o.kube {
		w.cluster = kubeapi.Start(t, kubeapi.Options{})
	}
	if len(o.nodes) > 0 {
		cfg := testbed.Config{Nodes: o.nodes, RTT: o.rtt, ScrapeInterval: o.scrape, HonorLabelsTargets: o.honorTargets}
		if len(o.istio) > 0 || len(o.podLoad) > 0 {
			cfg.MetricsTargets = []string{istioTarget}
		}
		w.tb = testbed.Start(t, cfg)
		if len(o.istio) > 0 || len(o.podLoad) > 0 {
			w.podLoad = serveIstioMetrics(t, w.tb, o.istio, o.podLoad, o.attempts)
		}
		w.tb.StartProbes(t)
		if o.promDown {
			must(t, w.tb.StopPrometheus())
		}
	}
	if len(o.backends) > 0 {
		w.podNS = testbed.NewNamespace(t, "198.18.1.0/24")
		w.startBackends(o.backends)
	}
	if !o.kube {
		return w
	}
	w.k = kubeapi.NewKubelet(t, ctx, w.cluster.Client, ns, w.port)
	w.k.Namespace()
	nodes := o.kubeNodes
	if nodes == nil {
		nodes = o.nodes
	}
	for _, n := range nodes {
		spec := kubeapi.NodeSpec{Name: n}
		if o.zones != nil {
			spec.Labels = map[string]string{corev1.LabelTopologyRegion: "eu", corev1.LabelTopologyZone: o.zones[n]}
		}
		_, err := kubeapi.CreateNode(ctx, w.cluster.Client, spec)
		must(t, err)
	}
	for _, s := range o.services {
		w.k.Service(s, true)
	}
	for _, p := range o.pods {
		w.deploymentPod(p.svc, p.pod, p.node)
	}
	return w
}

// startBackends serves one testkit.Echo per pod inside the pod namespace, pod i on
// 198.18.1.(i+2), all on one port (a Service's target port is the same for all its pods).
func (w *world) startBackends(pods []string) {
	t := w.t
	t.Helper()
	for attempt := 0; attempt < 20; attempt++ {
		var lis []net.Listener
		port := 0
		for i := range pods {
			l, err := w.podNS.Listen("tcp", net.JoinHostPort(podIP(i+2), strconv.Itoa(port)))
			if err != nil {
				break
			}
			port = l.Addr().(*net.TCPAddr).Port
			lis = append(lis, l)
		}
		if len(lis) < len(pods) {
			for _, l := range lis {
				l.Close()
			}
			continue
		}
		for i, p := range pods {
			w.backends[p] = testkit.ServeEcho(t, lis[i], p)
		}
		w.port = int32(port)
		return
	}
	t.Fatal("no free port shared by the backends' addresses")
}

// podIP is the address of the i-th pod in the pod namespace.
func podIP(i int) string { return "198.18.1." + strconv.Itoa(i) }

// ip is the address of pod: its backend's, else the next free one from podIP(100).
func (w *world) ip(pod string) string {
	if b, ok := w.backends[pod]; ok {
		host, _, _ := net.SplitHostPort(b.Addr)
		return host
	}
	w.nextIP++
	return podIP(99 + w.nextIP)
}

// pod creates a pod of svc on node, ready or not (kubeapi.Kubelet.Pod).
func (w *world) pod(svc, name, node string, ready bool) { w.k.Pod(svc, name, node, w.ip(name), ready) }

// deploymentPod creates a ready pod of svc's Deployment on node (kubeapi.Kubelet.DeploymentPod).
func (w *world) deploymentPod(svc, name, node string) {
	w.k.DeploymentPod(svc, name, node, w.ip(name))
}

// watchOptions configures edgeflow on the world.
type watchOptions struct {
	// prom is the Prometheus source's configuration (nil: no Prometheus source); URL and
	// RoundTripper default to the testbed's Prometheus; Registerer is the world's registry.
	prom *prom.Config
	// live is the cluster source's configuration; Kube, Prom, Check (xds.CheckTopology) and
	// Registerer are filled in.
	live watcher.LiveConfig
}

// watch runs edgeflow on the world, as the product wires it: the Kubernetes source on the
// namespace shop, the Prometheus source, the cluster source, the xDS server fed by it, and its
// /readyz (w.ready), every metric in w.reg. All of it stops when the test ends.
func (w *world) watch(o watchOptions) {
	t := w.t
	t.Helper()
	w.reg = prometheus.NewRegistry()
	var err error
	w.ks, err = kube.NewSource(kube.Config{Client: w.cluster.Client, Namespaces: []string{ns}, Selector: kube.DefaultSelector, Registerer: w.reg})
	must(t, err)
	lc := o.live
	lc.Kube, lc.Check, lc.Registerer = w.ks, xds.CheckTopology, w.reg
	if o.prom != nil {
		pc := *o.prom
		if pc.URL == "" {
			pc.URL, pc.RoundTripper = w.tb.PrometheusURL(), w.tb.PrometheusTransport()
		}
		pc.Registerer = w.reg
		w.ps, err = prom.NewSource(pc)
		must(t, err)
		lc.Prom = w.ps
	}
	w.cl, err = watcher.NewLive(lc)
	must(t, err)
	w.srv, w.addr = xdsServer(t, xdsserver.Config{Registerer: w.reg}, w.cl.Run)
	w.ready = httptest.NewServer(watcher.ReadyHandler(w.srv.Published, w.cl.Checks))
	t.Cleanup(w.ready.Close)
}

// caller is a grpc-go xDS client of w's xDS server with node id pod, dialing xds:///target
// from the pod namespace.
func (w *world) caller(pod, target string) *caller {
	w.t.Helper()
	return newCaller(w.t, w.podNS, w.addr, pod, target)
}

// istioTarget is where serveIstioMetrics serves, in the testbed's monitor namespace.
const istioTarget = "127.0.0.1:9300"

// reportedRequests serves istio_requests_total as Istio reports it, by reporter: each series
// grows at a constant rate. Each sample carries its own timestamp (the wall clock, as
// Prometheus's), so its value is the count at that instant and rate() reads the configured
// rate however late in the scrape Collect runs. (It was added for a CI run that read all three
// rates 4 % low for minutes; that was the source's hysteresis, not the timestamps: see
// complete in stockScrape.)
type reportedRequests struct {
	start time.Time
	desc  *prometheus.Desc
	edges []reportedEdge
}

type reportedEdge struct {
	reporter, srcWorkload, srcNS, dstWorkload, dstNS string
	rps                                              float64
}

func (c *reportedRequests) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c *reportedRequests) Collect(ch chan<- prometheus.Metric) {
	now := time.Now().Round(0) // wall clock only
	elapsed := now.Sub(c.start).Seconds()
	for _, e := range c.edges {
		ch <- prometheus.NewMetricWithTimestamp(now, prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, e.rps*elapsed,
			e.reporter, e.srcWorkload, e.srcNS, e.dstWorkload, e.dstNS, "200"))
	}
}

// serveIstioMetrics serves edges as istio_requests_total, or pods as reportedPodLoads, at
// istioTarget in the testbed's monitor namespace (a Config.MetricsTargets entry) until the test
// ends.
func serveIstioMetrics(t *testing.T, tb *testbed.Testbed, edges []reportedEdge, pods []reportedPod, attempts []reportedAttempt) *reportedPodLoads {
	t.Helper()
	lis, err := tb.ListenMonitor("tcp", istioTarget)
	if err != nil {
		t.Fatal(err)
	}
	// One of the two: their istio_requests_total have different labels, which one registry
	// refuses.
	reg := prometheus.NewRegistry()
	var loads *reportedPodLoads
	switch {
	case len(edges) > 0 && len(pods) > 0:
		t.Fatal("serveIstioMetrics: call edges or pod loads, not both")
	case len(edges) > 0:
		reg.MustRegister(&reportedRequests{start: time.Now().Round(0), edges: edges,
			desc: prometheus.NewDesc("istio_requests_total", "Requests, as Istio's sidecars count them.", []string{"reporter",
				"source_workload", "source_workload_namespace", "destination_workload", "destination_workload_namespace", "response_code"}, nil)})
	default:
		loads = newReportedPodLoads(pods)
		loads.attempts = attempts
		reg.MustRegister(loads)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return loads
}
