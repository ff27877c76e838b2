package live

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// TestPrometheusLatencyPerZone: real ICMP probes through blackbox-exporter and Prometheus, a real
// kube-apiserver with nodes in two zones, and --max-node-pairs below the cluster's 12 node
// pairs, so the latency is kept per zone: each zone pair gets the median of its measured node
// pairs, the topology lists zone pairs only, /readyz says why, and a grpc-go client follows the
// plan made between zones, also when a link inside a zone slows.
//
// Not parallel: the zone latencies are checked within 2 ms of the configured delays.
func TestPrometheusLatencyPerZone(t *testing.T) {
	const (
		scrape   = time.Second
		window   = 5 * time.Second
		interval = 500 * time.Millisecond
	)
	// Zone eu/a holds edge-1 and edge-2, eu/b edge-3 and edge-4. Across the zones two links are
	// fast (10 ms) and two slow (40 ms): the median of the zone pair is 25 ms, while inside each
	// zone it is 20 ms.
	w := newWorld(t, worldOptions{nodes: edges, rtt: edgeRTT(), scrape: scrape,
		kube: true, zones: map[string]string{"edge-1": "a", "edge-2": "a", "edge-3": "b", "edge-4": "b"},
		services: []string{"web", "api"}, backends: []string{"api-3", "api-4"},
		pods: []placement{{"web", "web-1", "edge-1"}, {"web", "web-2", "edge-3"}, {"api", "api-4", "edge-2"}, {"api", "api-3", "edge-4"}}})
	w.watch(watchOptions{prom: &prom.Config{Interval: interval, Window: window, CallsQuery: prom.DisableCalls},
		live: watcher.LiveConfig{LatencyGranularity: watcher.LatencyAuto, MaxNodePairs: 11,
			CallGraph: &watcher.CallGraph{Calls: []optimizer.Call{{From: "web.shop", To: "api.shop"}},
				Ingress: []optimizer.Ingress{{Service: "web.shop", RPS: 100}}}}})
	ctx, tb, cl, srv, ready := w.ctx, w.tb, w.cl, w.srv, w.ready
	web1 := w.caller("web-1.shop", "api.shop")
	web2 := w.caller("web-2.shop", "api.shop")

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
	testkit.Eventually(t, 60*time.Second, "zone latencies from the probes", func() bool {
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

	// routed waits until the plan sends web-1 to api1 and web-2 to api2, and the clients follow it.
	routed := func(api1, api2 string) {
		t.Helper()
		wantRoute(t, srv, "web-1.shop", api1+".shop", 30*time.Second)
		wantRoute(t, srv, "web-2.shop", api2+".shop", 30*time.Second)
		follow(t, ctx, srv, web1, api1)
		follow(t, ctx, srv, web2, api2)
		checkShares(t, ctx, web1, api1)
		checkShares(t, ctx, web2, api2)
	}
	// Between the zones' plan: each caller stays in its zone (20 ms against 25 ms).
	routed("api-4", "api-3")

	// The link inside zone eu/a slows to 80 ms: staying costs 80 + 20, crossing 25 + 25, so
	// both callers cross.
	if err := tb.SetRTT("edge-1", "edge-2", 80); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "eu/a's latency to itself at 80 ms", func() bool { return near(zoneMS(cl.Current(), "eu/a", "eu/a"), 80) })
	routed("api-3", "api-4")
}
