package live

import (
	"context"
	"encoding/pem"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/config"
	"github.com/prometheus/common/model"

	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/prom"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// guardedPrometheus fronts the testbed's real Prometheus with TLS and a bearer token, as a
// Prometheus behind an authenticating proxy is reached: it returns the proxy's URL and the
// Prometheus client configuration (CA file, token file) that passes, and counts the requests
// it let through and refused.
func guardedPrometheus(t *testing.T, tb *testbed.Testbed) (string, config.HTTPClientConfig, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	const token = "edgeflow-test-token-7f3a"
	target, err := url.Parse(tb.PrometheusURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = tb.PrometheusTransport()
	var passed, refused atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			refused.Add(1)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		passed.Add(1)
		proxy.ServeHTTP(w, r)
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	caFile, tokenFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "token")
	must(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	must(t, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600))
	hc := config.DefaultHTTPClientConfig
	hc.Authorization = &config.Authorization{Type: "Bearer", CredentialsFile: tokenFile}
	hc.TLSConfig.CAFile = caFile
	return srv.URL, hc, &passed, &refused
}

// Prometheus scraping every 15 s, and every 30 s, as stock installs do, read with edgeflow's
// default settings (the window read from Prometheus's targets, the default queries), through
// TLS and a bearer token: the call graph is complete (a caller without a sidecar seen through
// the callee's report, a pair reported by both sides counted once) and a latency change is
// followed within 4 scrape intervals + 2 s.
func TestStockScrapeIntervals(t *testing.T) {
	t.Parallel()
	for _, scrape := range []time.Duration{15 * time.Second, 30 * time.Second} {
		t.Run(scrape.String(), func(t *testing.T) {
			t.Parallel()
			stockScrape(t, scrape)
		})
	}
}

func stockScrape(t *testing.T, scrape time.Duration) {
	w := newWorld(t, worldOptions{nodes: edges, rtt: edgeRTT(), scrape: scrape,
		istio: []reportedEdge{
			{"source", "istio-ingressgateway", "istio-system", "web", ns, 100},
			{"source", "web", ns, "api", ns, 100},
			{"destination", "web", ns, "api", ns, 100},  // the same requests, seen by the callee
			{"destination", "batch", ns, "web", ns, 50}, // batch has no sidecar: only the callee reports
		},
		kube: true, services: []string{"web", "api", "batch"}, backends: []string{"api-3", "api-4"},
		pods: append(slices.Clone(shopPods), placement{"batch", "batch-1", "edge-3"})})
	promURL, httpConfig, passed, refused := guardedPrometheus(t, w.tb)
	w.watch(watchOptions{prom: &prom.Config{URL: promURL, HTTP: httpConfig}}) // the defaults
	ctx, tb, reg, cl, ps, srv, ready := w.ctx, w.tb, w.reg, w.cl, w.ps, w.srv, w.ready
	web1 := w.caller("web-1.shop", "api.shop")
	began := time.Now()

	testkit.Eventually(t, 30*time.Second, "the scrape interval read from Prometheus", func() bool {
		st := ps.Status()
		return st.ScrapeIntervalFrom == "prometheus"
	})
	if st := ps.Status(); st.ScrapeInterval != scrape || st.Window != 4*scrape {
		t.Fatalf("scrape interval %v, window %v; want %v and %v", st.ScrapeInterval, st.Window, scrape, 4*scrape)
	}
	// Complete: every pair measured, every edge of the call graph at its rate.
	var last string // what the last look found, for the failure message
	complete := func() bool {
		top := cl.Current()
		if top == nil {
			last = "no topology"
			return false
		}
		unmeasured := gaugeValue(t, reg, "edgeflow_latency_unmeasured_pairs", "")
		last = fmt.Sprintf("%d calls, %d latency pairs, %v unmeasured", len(top.Calls), len(top.Latency), unmeasured)
		if len(top.Calls) != 2 || len(top.Latency) != 12 || unmeasured != 0 {
			return false
		}
		m, err := optimizer.Compile(top, optimizer.Options{})
		if err != nil {
			last += ": " + err.Error()
			return false
		}
		load := map[string]float64{}
		for _, s := range m.Services {
			load[s.Name] = s.Load
		}
		last += fmt.Sprintf(", loads web %.1f, api %.1f, batch %.1f", load["web.shop"], load["api.shop"], load["batch.shop"])
		// At its rate within the source's hysteresis: a rate is delivered only when it moved
		// by more than 5 % of the value last delivered (prom.DefaultHysteresisRelative), so
		// the reading taken while the window was still filling can stand for good once it is
		// within 5 % of the true rate. Two CI runs held all three 4.4 % low (web 143.4 of
		// 150). Double counting (reporters source and destination) or a lost edge is far out.
		near := func(got, want float64) bool { return math.Abs(got-want) <= prom.DefaultHysteresisRelative*want+2 }
		return near(load["web.shop"], 150) && near(load["api.shop"], 100) && near(load["batch.shop"], 50)
	}
	// The rates fill the query window (4 scrapes) from the first scrape of the telemetry, which
	// may come up to a scrape after start, and the window's edges fall between scrapes: 4 + 2
	// scrapes, and a minute for the control plane and Prometheus to start. Measured: 56–74 s at
	// 15 s scrapes (one run under the race detector took 2m2s).
	within := 6*scrape + 60*time.Second
	if !testkit.WaitUntil(within, complete) {
		t.Fatalf("a complete topology (12 pairs, batch → web → api at 50 + 100 → 100 rps): not within %v; last seen: %s", within, last)
	}
	t.Logf("complete topology %v after start (scrape %v)", time.Since(began).Round(time.Second), scrape)
	top := cl.Current()
	for _, cl := range top.Calls {
		t.Logf("call %s → %s, %.3f requests per request", cl.From, cl.To, cl.CallRate())
	}
	t.Logf("ingress %+v", top.Ingress)
	for _, l := range top.Latency {
		if l.MS < 5 {
			t.Errorf("latency %s → %s = %v ms: below every configured RTT", l.From, l.To, l.MS)
		}
	}
	code, body := get(t, ready.URL)
	if code != http.StatusOK || strings.Contains(body, "degraded") || !strings.Contains(body, "[+]latency") {
		t.Errorf("/readyz with everything measured: %d %q", code, body)
	}
	t.Logf("/readyz:\n%s", body)
	wantRoute(t, srv, "web-1.shop", "api-3.shop", 30*time.Second)
	wantRoute(t, srv, "web-2.shop", "api-4.shop", 30*time.Second)
	follow(t, ctx, srv, web1, "api-3")

	logLatency := func(when string) {
		var b strings.Builder
		for _, l := range cl.Current().Latency {
			fmt.Fprintf(&b, " %s→%s %.1f", l.From, l.To, l.MS)
		}
		t.Logf("latency (ms) %s:%s", when, b.String())
	}
	logLatency("before the change")
	// edge-1 ↔ edge-3 slows from 10 to 200 ms: web-1's cheapest assignment becomes api-4 once
	// the window's median passes L(1,4) + L(2,3) − L(2,4), about 70 ms (more on a busy machine,
	// where every measured RTT carries a few ms of the emulator's delay): after 2 of the 4
	// samples of the window (the median of 4 is the mean of the middle two: 105 ms), which the
	// query's subquery sees up to one scrape later. Any change is in the whole window after 4
	// scrapes.
	start := time.Now()
	must(t, tb.SetRTT("edge-1", "edge-3", 200))
	target := 4*scrape + 2*time.Second
	var followedAt time.Time
	testkit.Eventually(t, target+30*time.Second, "web-1 → api-4", func() bool {
		if !wantRouteNow(srv, "web-1.shop", "api-4.shop") {
			return false
		}
		followedAt = time.Now()
		return true
	})
	followed := followedAt.Sub(start)
	logLatency("after")
	t.Logf("scrape %v: latency change → weights followed in %v (target ≤ 4 × scrape + 2 s = %v)", scrape, followed.Round(time.Millisecond), target)
	if followed > target {
		t.Errorf("weights followed the latency change after %v, want ≤ %v", followed, target)
	}
	follow(t, ctx, srv, web1, "api-4")
	if passed.Load() == 0 || refused.Load() != 0 {
		t.Errorf("through the TLS, token-checking proxy: %d requests passed, %d refused; want some, none", passed.Load(), refused.Load())
	}
	// A window shorter than the scrape interval would make series vanish between samples.
	if n := counterValue(t, reg, "edgeflow_prometheus_series_vanished_total"); n != 0 {
		t.Errorf("%v series vanished at %v scrapes with the default window (flapping)", n, scrape)
	}
	t.Logf("%v deliveries in %v (each of the 13 targets is scraped at its own offset in the interval)",
		counterValue(t, reg, "edgeflow_prometheus_deliveries_total"), time.Since(began).Round(time.Second))
}

// Probe loss in the testbed (iptables statistic): at 60 % a pair is unreachable and traffic
// moves off it; at 20 % its RTT is the median of the answered probes (within 1 ms of that median
// computed here from the raw samples), never pulled toward 0 by the lost ones.
func TestProbeLoss(t *testing.T) {
	t.Parallel()
	// Loss is a share of probes: 80 probes in the window (500 ms scrapes, 40 s) make the
	// estimate's standard error about 5 %, so 60 % loss reads above the 50 % limit and 20 %
	// below. (At a stock 15 s scrape a 1 m window holds 4 probes: see docs/tasks/live-cluster.md.)
	const (
		scrape = 500 * time.Millisecond
		window = 40 * time.Second
	)
	w := newWorld(t, worldOptions{nodes: edges, rtt: edgeRTT(), scrape: scrape,
		kube: true, services: []string{"web", "api"}, backends: []string{"api-3", "api-4"}, pods: shopPods})
	// No hysteresis: every round is delivered, so the topology holds the last round's values.
	w.watch(watchOptions{prom: &prom.Config{Window: window, HysteresisRelative: -1, HysteresisLatencyMS: -1},
		live: watcher.LiveConfig{CallGraph: &watcher.CallGraph{Calls: []optimizer.Call{{From: "web.shop", To: "api.shop"}},
			Ingress: []optimizer.Ingress{{Service: "web.shop", RPS: 100}}}}})
	ctx, tb, reg, ps, cl, srv := w.ctx, w.tb, w.reg, w.ps, w.cl, w.srv
	web1 := w.caller("web-1.shop", "api.shop")
	latency := func(from, to string) float64 {
		for _, l := range cl.Current().Latency {
			if l.From == from && l.To == to {
				return l.MS
			}
		}
		return math.NaN()
	}
	testkit.Eventually(t, 60*time.Second, "every pair measured", func() bool {
		return cl.Current() != nil && len(cl.Current().Latency) == 12 && gaugeValue(t, reg, "edgeflow_latency_unmeasured_pairs", "") == 0
	})
	wantRoute(t, srv, "web-1.shop", "api-3.shop", 30*time.Second)
	follow(t, ctx, srv, web1, "api-3")

	drop := func(p float64, op string) {
		t.Helper()
		out, err := tb.Exec("edge-1", "iptables", "-w", op, "OUTPUT", "-p", "icmp", "--icmp-type", "echo-request", "-d", tb.NodeIP("edge-3"),
			"-m", "statistic", "--mode", "random", "--probability", fmt.Sprint(p), "-j", "DROP").CombinedOutput()
		if err != nil {
			t.Fatalf("iptables %s: %v: %s", op, err, out)
		}
	}
	t.Cleanup(func() { _ = tb.Exec("edge-1", "iptables", "-w", "-F", "OUTPUT").Run() })

	// 60 % of edge-1's echo requests to edge-3 are dropped.
	drop(0.6, "-A")
	start := time.Now()
	testkit.Eventually(t, 2*window, "edge-1 → edge-3 unreachable", func() bool {
		return gaugeValue(t, reg, "edgeflow_prometheus_unreachable_pairs", "") >= 1 && latency("edge-1", "edge-3") == prom.DefaultUnreachableMS
	})
	t.Logf("60 %% loss → pair unreachable after %v; %s", time.Since(start).Round(time.Millisecond), checkMessage(cl, "latency"))
	if msg := checkMessage(cl, "latency"); !strings.Contains(msg, "edge-1→edge-3 (loss") {
		t.Errorf("the latency check does not report the unreachable pair: %q", msg)
	}
	wantRoute(t, srv, "web-1.shop", "api-4.shop", 30*time.Second)
	follow(t, ctx, srv, web1, "api-4")
	checkShares(t, ctx, web1, "api-4")

	// 20 %: reachable again; once the window holds only 20 %-loss probes, the RTT is the median
	// of the answered ones.
	drop(0.6, "-D")
	drop(0.2, "-A")
	lossy := time.Now()
	testkit.Eventually(t, 2*window, "edge-1 → edge-3 reachable at 20 % loss", func() bool {
		return gaugeValue(t, reg, "edgeflow_prometheus_unreachable_pairs", "") == 0
	})
	testkit.Eventually(t, 2*window, "a window of probes at 20 % loss", func() bool { return time.Since(lossy) > window+time.Second })
	api, err := promapi.NewClient(promapi.Config{Address: tb.PrometheusURL(), RoundTripper: tb.PrometheusTransport()})
	must(t, err)
	var got, answered, naive float64
	var probes, lost int
	testkit.Eventually(t, 20*time.Second, "edgeflow's RTT within 1 ms of the answered probes' median", func() bool {
		at := ps.Status().LastSuccess
		got = latency("edge-1", "edge-3")
		answered, naive, probes, lost = rawRTT(t, ctx, promv1.NewAPI(api), at, window)
		return ps.Status().LastSuccess.Equal(at) && math.Abs(got-answered) <= 1
	})
	t.Logf("20 %% loss: edgeflow's edge-1 → edge-3 RTT %.3f ms; raw samples: %d probes, %d lost, median of the answered %.3f ms, "+
		"mean with the lost ones as 0 (a naive query) %.3f ms; configured 10 ms", got, probes, lost, answered, naive)
	if lost == 0 || got < 5 {
		t.Errorf("at 20 %% loss: %d of %d probes lost, RTT %.3f ms; want some lost and the RTT nowhere near 0", lost, probes, got)
	}
	wantRoute(t, srv, "web-1.shop", "api-3.shop", 30*time.Second)
}

// rawRTT reads the edge-1 → edge-3 probes of the window ending at at from Prometheus's raw
// samples and returns the median RTT of the answered ones and the mean over all (the lost as 0),
// in ms.
func rawRTT(t *testing.T, ctx context.Context, api promv1.API, at time.Time, window time.Duration) (answered, naive float64, probes, lost int) {
	t.Helper()
	sel := fmt.Sprintf(`{job="edgeflow-icmp",source_node="edge-1",target_node="edge-3"}[%s]`, model.Duration(window))
	read := func(q string) map[model.Time]float64 {
		v, _, _, err := api.Query(ctx, q, at)
		must(t, err)
		out := map[model.Time]float64{}
		if m, ok := v.(model.Matrix); ok && len(m) == 1 {
			for _, p := range m[0].Values {
				out[p.Timestamp] = float64(p.Value)
			}
		}
		return out
	}
	rtts := read(`probe_icmp_duration_seconds` + strings.Replace(sel, "{", `{phase="rtt",`, 1))
	ok := read(`probe_success` + sel)
	var answeredRTTs []float64
	var sumAll float64
	for ts, s := range ok {
		r, has := rtts[ts]
		if !has {
			continue
		}
		probes++
		sumAll += r
		if s == 1 {
			answeredRTTs = append(answeredRTTs, r)
		} else {
			lost++
		}
	}
	if probes == 0 || probes == lost {
		return math.NaN(), math.NaN(), probes, lost
	}
	slices.Sort(answeredRTTs)
	n := len(answeredRTTs)
	return 1000 * (answeredRTTs[(n-1)/2] + answeredRTTs[n/2]) / 2, 1000 * sumAll / float64(probes), probes, lost
}

func checkMessage(cl *watcher.Live, name string) string { return check(cl, name).Message }

// Cold start with Prometheus stopped: every managed service has endpoints within 2 s of its
// pods being ready (the capacity-weighted plan, /readyz degraded); Prometheus starts: the
// weights follow within one window of its first samples. A probed node that Kubernetes does
// not know is reported by name and never used.
//
// Not parallel: "within one window" (4 s) was 3.3 s in a run beside the parallel tests.
func TestColdStartWithoutPrometheus(t *testing.T) {
	nodes := append(slices.Clone(edges), "edge-x") // edge-x: no such Kubernetes node
	w := newWorld(t, worldOptions{nodes: nodes, promDown: true,
		rtt: map[[2]string]float64{
			{"edge-1", "edge-3"}: 40, {"edge-1", "edge-4"}: 10, {"edge-2", "edge-3"}: 10,
			{"edge-2", "edge-4"}: 40, {"edge-1", "edge-2"}: 20, {"edge-3", "edge-4"}: 20},
		istio: []reportedEdge{{"source", "web", ns, "api", ns, 100}, {"source", "gateway", "istio-system", "web", ns, 100}},
		kube:  true, kubeNodes: edges, services: []string{"web", "api"}, backends: []string{"api-3", "api-4", "web-1", "web-2"}})
	w.watch(watchOptions{prom: &prom.Config{}})
	ctx, tb, reg, ks, ps, cl, srv, ready := w.ctx, w.tb, w.reg, w.ks, w.ps, w.cl, w.srv, w.ready
	testkit.Eventually(t, 30*time.Second, "the Kubernetes caches synced", ks.Synced)

	for _, p := range shopPods {
		w.deploymentPod(p.svc, p.pod, p.node)
	}
	podsReady := time.Now()
	web1 := w.caller("web-1.shop", "api.shop")
	gateway := w.caller("istio-ingressgateway", "web.shop") // no pod of the topology: round-robin
	for name, cl := range map[string]*caller{"web-1 → api": web1, "gateway → web": gateway} {
		var took time.Duration
		testkit.Eventually(t, 10*time.Second, name+": a first RPC", func() bool {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			if _, err := cl.call(rctx); err != nil {
				return false
			}
			took = time.Since(podsReady)
			return true
		})
		t.Logf("cold start, Prometheus down: pods ready → %s answered in %v (target ≤ 2 s)", name, took.Round(time.Millisecond))
		if took > 2*time.Second {
			t.Errorf("%s: first RPC %v after the pods were ready, want ≤ 2 s", name, took)
		}
	}
	code, body := get(t, ready.URL)
	t.Logf("/readyz on a cold start (%d):\n%s", code, body)
	if code != http.StatusOK || !strings.Contains(body, "degraded") || !strings.Contains(body, "[-]latency") || !strings.Contains(body, "capacity-weighted") {
		t.Errorf("/readyz on a cold start: %d %q, want 200, degraded, naming the latency", code, body)
	}
	for _, l := range cl.Current().Latency {
		if l.MS != prom.EqualLatencyMS {
			t.Fatalf("cold-start latency %+v: want every pair equal", l)
		}
	}

	// Prometheus starts: once its first samples are in, the weights follow within one window.
	must(t, tb.StartPrometheus())
	promClient := &http.Client{Transport: tb.PrometheusTransport(), Timeout: 2 * time.Second}
	var firstSample time.Time
	testkit.Eventually(t, 60*time.Second, "the first probe samples in Prometheus", func() bool {
		resp, err := promClient.Get(tb.PrometheusURL() + "/api/v1/query?query=" + url.QueryEscape(`count(probe_success{job="edgeflow-icmp"})`))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		buf := make([]byte, 4096)
		n, _ := resp.Body.Read(buf)
		if strings.Contains(string(buf[:n]), `"result":[{`) {
			firstSample = time.Now()
			return true
		}
		return false
	})
	// web-1 (edge-1) is 10 ms from api-4 and 40 ms from api-3 (measured: the equal plan could
	// pick either).
	var at time.Time
	testkit.Eventually(t, 60*time.Second, "web-1 → api-4 on measured latency", func() bool {
		if !cl.LatencyUsable() || !wantRouteNow(srv, "web-1.shop", "api-4.shop") {
			return false
		}
		at = time.Now()
		return true
	})
	window := ps.Status().Window
	t.Logf("Prometheus started: first samples → weights followed in %v (window %v)", at.Sub(firstSample).Round(time.Millisecond), window)
	if d := at.Sub(firstSample); d > window {
		t.Errorf("weights followed %v after the first samples, want within one window (%v)", d, window)
	}
	testkit.Eventually(t, 30*time.Second, "edge-x reported", func() bool { return strings.Contains(checkMessage(cl, "latency"), "edge-x") })
	code, body = get(t, ready.URL)
	t.Logf("/readyz with a probed node Kubernetes does not know (%d):\n%s", code, body)
	if code != http.StatusOK || !strings.Contains(body, "degraded") || !strings.Contains(body, "edge-x") || strings.Contains(body, "capacity-weighted") {
		t.Errorf("/readyz: %d %q, want degraded naming edge-x, with latency in use", code, body)
	}
	for _, l := range cl.Current().Latency {
		if l.From == "edge-x" || l.To == "edge-x" {
			t.Errorf("a pair of the unknown node in the topology: %+v", l)
		}
	}
	if n := counterValue(t, reg, "edgeflow_watcher_unmatched_total"); n != 1 {
		t.Errorf("edgeflow_watcher_unmatched_total = %v, want 1 (edge-x)", n)
	}
}

// wantRouteNow says whether the published allocation sends all of caller's requests to callee.
func wantRouteNow(srv *xdsserver.Server, caller, callee string) bool {
	a := srv.Allocation()
	if a == nil {
		return false
	}
	for _, c := range a.Calls {
		for _, r := range c.Routes {
			if r.Caller == caller && r.Callee == callee && r.Fraction > 0.999 {
				return true
			}
		}
	}
	return false
}
