package live

import (
	"context"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/prom"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// TestPrometheusLatencyDrivesWeights: the node-to-node RTT measured by real blackbox exporters
// in a network-namespace testbed with real delay, stored in a real Prometheus, and the call graph
// from istio_requests_total, drive the weights a real grpc-go xDS client follows. A link's delay
// changes → the weights follow (timed); Prometheus stops → the weights stay, no RPC fails,
// nothing is pushed, /readyz says why; Prometheus restarts → edgeflow recovers.
func TestPrometheusLatencyDrivesWeights(t *testing.T) {
	t.Parallel()
	const (
		scrape   = time.Second
		window   = 5 * time.Second
		interval = 500 * time.Millisecond
	)
	w := newWorld(t, worldOptions{nodes: edges, rtt: edgeRTT(), scrape: scrape,
		istio: []reportedEdge{{"source", "istio-ingressgateway", "istio-system", "web", ns, 100}, {"source", "web", ns, "api", ns, 100}},
		kube:  true, services: []string{"web", "api"}, backends: []string{"api-3", "api-4"}, pods: shopPods})
	w.watch(watchOptions{prom: &prom.Config{Interval: interval, Window: window}})
	ctx, tb, reg, cl, srv, ready := w.ctx, w.tb, w.reg, w.cl, w.srv, w.ready
	callers := map[string]*caller{
		"web-1": w.caller("web-1.shop", "api.shop"),
		"web-2": w.caller("web-2.shop", "api.shop"),
	}

	// The first topology is published once Kubernetes synced (the cold-start plan until
	// Prometheus has latency data).
	testkit.Eventually(t, 60*time.Second, "first publication", func() bool { return srv.Published() > 0 })
	// rate() over a window that is not yet full of samples reads low; wait for the full window.
	testkit.Eventually(t, 30*time.Second, "call graph from istio_requests_total", func() bool {
		top := cl.Current()
		return len(top.Calls) > 0 && len(top.Ingress) > 0 && math.Abs(top.Ingress[0].RPS-100) < 10
	})
	top := cl.Current()
	if len(top.Calls) != 1 || top.Calls[0].From != "web.shop" || top.Calls[0].To != "api.shop" || math.Abs(top.Calls[0].CallRate()-1) > 0.1 {
		t.Fatalf("call graph from istio_requests_total: %+v, want web.shop → api.shop at rate 1", top.Calls)
	}
	if len(top.Ingress) != 1 || math.Abs(top.Ingress[0].RPS-100) > 10 {
		t.Fatalf("ingress from istio_requests_total: %+v, want web.shop at 100 rps", top.Ingress)
	}
	testkit.Eventually(t, 30*time.Second, "all node pairs measured", func() bool {
		return len(cl.Current().Latency) == 12 && gaugeValue(t, reg, "edgeflow_latency_unmeasured_pairs", "") == 0
	})
	wantRoute(t, srv, "web-1.shop", "api-3.shop", 30*time.Second)
	wantRoute(t, srv, "web-2.shop", "api-4.shop", 30*time.Second)
	follow(t, ctx, srv, callers["web-1"], "api-3")
	follow(t, ctx, srv, callers["web-2"], "api-4")
	checkShares(t, ctx, callers["web-1"], "api-3")
	checkShares(t, ctx, callers["web-2"], "api-4")

	// Traffic flows throughout; not one RPC may fail.
	loopCtx, stopLoops := context.WithCancel(ctx)
	var waits []func()
	for _, cl := range callers {
		waits = append(waits, cl.loop(loopCtx, 5*time.Millisecond))
	}
	stopTraffic := sync.OnceFunc(func() {
		stopLoops()
		for _, w := range waits {
			w()
		}
	})
	t.Cleanup(stopTraffic)

	// The edge-1 ↔ edge-3 link slows from 10 to 80 ms: web-1's cheapest assignment flips to
	// api-4 (40 + 40 < 80 + 10).
	start := time.Now()
	if err := tb.SetRTT("edge-1", "edge-3", 80); err != nil {
		t.Fatal(err)
	}
	followed := wantRoute(t, srv, "web-1.shop", "api-4.shop", 30*time.Second).Sub(start)
	target := scrape + window + time.Second
	t.Logf("latency change in the testbed → weights followed: %v (target ≤ scrape %v + window %v + 1 s = %v)", followed.Round(time.Millisecond), scrape, window, target)
	if followed > target {
		t.Errorf("weights followed the latency change after %v, want ≤ %v", followed, target)
	}
	follow(t, ctx, srv, callers["web-1"], "api-4")
	checkShares(t, ctx, callers["web-1"], "api-4")

	// Prometheus stops: the last good weights stay, /readyz says why, nothing is pushed.
	if err := tb.StopPrometheus(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the Prometheus check failing", func() bool { return !check(cl, "prometheus").OK })
	pub := srv.Published()
	pushes := counterValue(t, reg, "edgeflow_xds_pushes_total")
	code, body := get(t, ready.URL)
	t.Logf("/readyz while Prometheus is down (%d):\n%s", code, body)
	if code != http.StatusOK || !strings.Contains(body, "[-]prometheus") || !strings.Contains(body, "degraded") {
		t.Errorf("/readyz while Prometheus is down: %d %q, want 200 naming prometheus as failing and degraded", code, body)
	}
	outage := time.Now().Add(4 * window / 5) // several query rounds with Prometheus down
	for time.Now().Before(outage) {
		if srv.Published() != pub {
			t.Fatalf("a publication happened while Prometheus was down")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if p := counterValue(t, reg, "edgeflow_xds_pushes_total"); p != pushes {
		t.Errorf("%v pushes while Prometheus was down, want none", p-pushes)
	}
	checkShares(t, ctx, callers["web-1"], "api-4")

	// Prometheus is back: the check recovers and latency changes are followed again.
	if err := tb.StartPrometheus(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the Prometheus check recovering", func() bool { return check(cl, "prometheus").OK })
	if code, body := get(t, ready.URL); code != http.StatusOK || strings.Contains(body, "degraded") {
		t.Errorf("/readyz after recovery: %d %q", code, body)
	}
	start = time.Now()
	if err := tb.SetRTT("edge-1", "edge-3", 10); err != nil {
		t.Fatal(err)
	}
	back := wantRoute(t, srv, "web-1.shop", "api-3.shop", 60*time.Second).Sub(start)
	t.Logf("after the restart, latency change → weights followed: %v", back.Round(time.Millisecond))
	stopTraffic()
	for name, cl := range callers {
		if f := cl.failed.Load(); f != 0 {
			t.Errorf("%s: %d of %d RPCs failed (last: %v)", name, f, cl.sent.Load(), cl.lastErr.Load())
		} else {
			t.Logf("%s: %d RPCs, none failed", name, cl.sent.Load())
		}
	}
}

// wantRoute waits until the published allocation sends all of caller's requests to callee,
// and returns when it saw that.
func wantRoute(t *testing.T, srv *xdsserver.Server, caller, callee string, d time.Duration) time.Time {
	t.Helper()
	var at time.Time
	testkit.Eventually(t, d, caller+" → "+callee, func() bool {
		if !wantRouteNow(srv, caller, callee) {
			return false
		}
		at = time.Now()
		return true
	})
	return at
}

// follow waits until the client has the publication that moved its weights: every pushed client
// ACKed it, and (grpc-go swaps its picker just after the ACK) a run of RPCs reaches pod.
func follow(t *testing.T, ctx context.Context, srv *xdsserver.Server, c *caller, pod string) {
	t.Helper()
	if err := srv.WaitConverged(ctx, srv.Published()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "the client's picker on "+pod, func() bool { return share(t, ctx, c, 20)[pod] > 0.999 })
}

// checkShares sends RPCs and checks every one reaches pod.
func checkShares(t *testing.T, ctx context.Context, c *caller, pod string) {
	t.Helper()
	got := share(t, ctx, c, 300)
	if got[pod] < 0.999 {
		t.Errorf("shares %s, want all on %s", fmtShare(got), pod)
	}
}

func check(cl *watcher.Live, name string) watcher.Check {
	for _, c := range cl.Checks() {
		if c.Name == name {
			return c
		}
	}
	return watcher.Check{Name: name, Message: "absent"}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// counterValue sums a counter over its labels.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}
