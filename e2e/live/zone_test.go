package live

import (
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
	"github.com/edgeflow/edgeflow/xds"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// TestPrometheusLatencyPerZone: real ICMP probes through blackbox-exporter and Prometheus, a real
// kube-apiserver with nodes in two zones, and --max-node-pairs below the cluster's 12 node
// pairs, so the latency is kept per zone: each zone pair gets the median of its measured node
// pairs, the topology lists zone pairs only, /readyz says why, and a grpc-go client follows the
// plan made between zones, also when a link inside a zone slows.
func TestPrometheusLatencyPerZone(t *testing.T) {
	testbed.RequireRoot(t)
	const (
		scrape   = time.Second
		window   = 5 * time.Second
		interval = 500 * time.Millisecond
	)
	// Zone eu/a holds edge-1 and edge-2, eu/b edge-3 and edge-4. Across the zones two links are
	// fast (10 ms) and two slow (40 ms): the median of the zone pair is 25 ms, while inside each
	// zone it is 20 ms.
	zoneOf := map[string]string{"edge-1": "a", "edge-2": "a", "edge-3": "b", "edge-4": "b"}
	nodes := []string{"edge-1", "edge-2", "edge-3", "edge-4"}
	tb := testbed.Start(t, testbed.Config{Nodes: nodes, ScrapeInterval: scrape,
		RTT: map[[2]string]float64{
			{"edge-1", "edge-3"}: 10, {"edge-1", "edge-4"}: 40, {"edge-2", "edge-3"}: 40,
			{"edge-2", "edge-4"}: 10, {"edge-1", "edge-2"}: 20, {"edge-3", "edge-4"}: 20}})
	tb.StartProbes(t)

	c := kubeapi.Start(t, kubeapi.Options{})
	ctx := kubeapi.Context(t)
	podNS := testbed.NewNamespace(t, "198.18.1.0/24")
	backends, port := startBackends(t, podNS, "api-3", "api-4")
	k := kubeapi.NewKubelet(t, ctx, c.Client, ns, port)
	k.Namespace()
	for _, n := range nodes {
		_, err := kubeapi.CreateNode(ctx, c.Client, kubeapi.NodeSpec{Name: n,
			Labels: map[string]string{corev1.LabelTopologyRegion: "eu", corev1.LabelTopologyZone: zoneOf[n]}})
		must(t, err)
	}
	k.Service("web", true)
	k.Service("api", true)
	k.DeploymentPod("web", "web-1", "edge-1", podIP(100))
	k.DeploymentPod("web", "web-2", "edge-3", podIP(101))
	k.DeploymentPod("api", "api-4", "edge-2", backends["api-4"].ip)
	k.DeploymentPod("api", "api-3", "edge-4", backends["api-3"].ip)

	reg := prometheus.NewRegistry()
	ks, err := kube.NewSource(kube.Config{Client: c.Client, Namespaces: []string{ns}, Selector: kube.DefaultSelector, Registerer: reg})
	must(t, err)
	ps, err := prom.NewSource(prom.Config{URL: tb.PrometheusURL(), RoundTripper: tb.PrometheusTransport(),
		Interval: interval, Window: window, CallsQuery: prom.DisableCalls, Registerer: reg})
	must(t, err)
	cl, err := watcher.NewLive(watcher.LiveConfig{Kube: ks, Prom: ps, Check: xds.CheckTopology, Registerer: reg,
		LatencyGranularity: watcher.LatencyAuto, MaxNodePairs: 11,
		CallGraph: &watcher.CallGraph{Calls: []optimizer.Call{{From: "web.shop", To: "api.shop"}},
			Ingress: []optimizer.Ingress{{Service: "web.shop", RPS: 100}}}})
	must(t, err)
	srv, addr := xdsServer(t, xdsserver.Config{Registerer: reg}, cl.Run)
	ready := httptest.NewServer(watcher.ReadyHandler(srv.Published, cl.Checks))
	t.Cleanup(ready.Close)
	web1 := newCaller(t, podNS, addr, "web-1.shop", "api.shop")
	web2 := newCaller(t, podNS, addr, "web-2.shop", "api.shop")

	// zoneMS reads the topology's latency of a zone pair (NaN: not listed).
	zoneMS := func(top *optimizer.Topology, from, to string) float64 {
		for _, l := range top.Latency {
			if l.From == from && l.To == to {
				return l.MS
			}
		}
		return math.NaN()
	}
	near := func(got, want float64) bool { return math.Abs(got-want) <= 2 }
	eventually(t, 60*time.Second, "zone latencies from the probes", func() bool {
		top := cl.Current()
		return top != nil && near(zoneMS(top, "eu/a", "eu/b"), 25) && near(zoneMS(top, "eu/b", "eu/a"), 25) &&
			near(zoneMS(top, "eu/a", "eu/a"), 20) && near(zoneMS(top, "eu/b", "eu/b"), 20)
	})
	top := cl.Current()
	t.Logf("latency per zone: %+v", top.Latency)
	if top.LatencyGranularity != optimizer.LatencyPerZone {
		t.Errorf("the topology's latency granularity is %q, want %q", top.LatencyGranularity, optimizer.LatencyPerZone)
	}
	for _, l := range top.Latency {
		if !strings.HasPrefix(l.From, "eu/") || !strings.HasPrefix(l.To, "eu/") {
			t.Errorf("latency entry %s → %s names a node, want zones only", l.From, l.To)
		}
	}
	if _, body := get(t, ready.URL); !strings.Contains(body, "per zone") || !strings.Contains(body, "--max-node-pairs") {
		t.Errorf("/readyz does not say the latency is kept per zone and why:\n%s", body)
	}

	// Between the zones' plan: each caller stays in its zone (20 ms against 25 ms).
	wantRoute(t, srv, "web-1.shop", "api-4.shop", 30*time.Second)
	wantRoute(t, srv, "web-2.shop", "api-3.shop", 30*time.Second)
	follow(t, ctx, srv, web1, "api-4")
	follow(t, ctx, srv, web2, "api-3")
	checkShares(t, ctx, web1, "api-4")
	checkShares(t, ctx, web2, "api-3")

	// The link inside zone eu/a slows to 80 ms: staying costs 80 + 20, crossing 25 + 25, so
	// both callers cross.
	if err := tb.SetRTT("edge-1", "edge-2", 80); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "eu/a's latency to itself at 80 ms", func() bool { return near(zoneMS(cl.Current(), "eu/a", "eu/a"), 80) })
	wantRoute(t, srv, "web-1.shop", "api-3.shop", 30*time.Second)
	wantRoute(t, srv, "web-2.shop", "api-4.shop", 30*time.Second)
	follow(t, ctx, srv, web1, "api-3")
	follow(t, ctx, srv, web2, "api-4")
	checkShares(t, ctx, web1, "api-3")
	checkShares(t, ctx, web2, "api-4")
}
