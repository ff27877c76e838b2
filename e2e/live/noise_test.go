package live

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
	"github.com/edgeflow/edgeflow/xds"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// fan hands every topology to several listeners.
type fan []watcher.Listener

func (f fan) Update(t *optimizer.Topology) {
	for _, l := range f {
		l.Update(t)
	}
}

// margins records, for every topology, LATA's margin between web's two assignments:
// L(1,3) + L(2,4) − L(1,4) − L(2,3) in ms (negative: web-1 → api-3 and web-2 → api-4 cheapest).
type margins struct {
	mu sync.Mutex
	ms []float64
}

// marginMS is L(1,3) + L(2,4) − L(1,4) − L(2,3), the latencies read by at.
func marginMS(at func(from, to string) float64) float64 {
	return at("edge-1", "edge-3") + at("edge-2", "edge-4") - at("edge-1", "edge-4") - at("edge-2", "edge-3")
}

func (m *margins) Update(t *optimizer.Topology) {
	l := map[[2]string]float64{}
	for _, e := range t.Latency {
		l[[2]string{e.From, e.To}] = e.MS
	}
	v := marginMS(func(from, to string) float64 { return l[[2]string{from, to}] })
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ms = append(m.ms, v)
}

// since returns the margins recorded after the first n, and the number of sign changes in them.
func (m *margins) since(n int) (ms []float64, flips int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ms = slices.Clone(m.ms[min(n, len(m.ms)):])
	for i := 1; i < len(ms); i++ {
		if (ms[i] < 0) != (ms[i-1] < 0) {
			flips++
		}
	}
	return ms, flips
}

func (m *margins) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ms)
}

// Noisy latency — every link's real delay redrawn every second, ±10 % around its base, for a
// minute — must not cause a push storm. The whole input path is real: nqdelay's delay on the
// links, blackbox-exporter's ICMP probes, Prometheus, edgeflow's Prometheus source with its
// defaults (2 s interval, 10 s window, 5 % hysteresis). Two xDS servers follow the same cluster
// source: one with the default flap damping (1 %) and one with damping off, so the figure says
// what the damping itself holds back. The base delays make LATA's optimum nearly degenerate
// (10 ms against 11 ms).
//
// The rule checked is damping's: a recompute is pushed only when the measured optimum changed.
// Here the optimum is one of two assignments, chosen by the sign of the margin L(1,3) + L(2,4)
// − L(1,4) − L(2,3) of the topology, so the damped server may push at most once per sign change
// of that margin; the undamped one pushes every topology. How often the margin changes sign is
// the testbed's to say, not edgeflow's: on a busy machine (the race detector, CI) the measured
// RTTs carry a few ms of the emulator's and the prober's delay per pair, and the margin of −2 ms
// crosses 0 now and then (a CI run had 4 damped pushes in 70 s, an earlier "at most 3" bound
// failed on it); it is logged.
func TestNoisyLatencyNoPushStorm(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a minute of noise: skipped with -short")
	}
	base := map[[2]string]float64{
		{"edge-1", "edge-3"}: 10, {"edge-1", "edge-4"}: 11, {"edge-2", "edge-3"}: 11,
		{"edge-2", "edge-4"}: 10, {"edge-1", "edge-2"}: 20, {"edge-3", "edge-4"}: 20}
	w := newWorld(t, worldOptions{nodes: edges, rtt: base, scrape: time.Second,
		kube: true, services: []string{"web", "api"}, pods: shopPods})
	tb, c := w.tb, w.cluster

	reg := prometheus.NewRegistry()
	ks, err := kube.NewSource(kube.Config{Client: c.Client, Namespaces: []string{ns}, Selector: kube.DefaultSelector})
	must(t, err)
	ps, err := prom.NewSource(prom.Config{URL: tb.PrometheusURL(), RoundTripper: tb.PrometheusTransport(),
		Window: 10 * time.Second, CallsQuery: prom.DisableCalls})
	must(t, err)
	one := 1.0
	cl, err := watcher.NewLive(watcher.LiveConfig{Kube: ks, Prom: ps, Check: xds.CheckTopology, Registerer: reg,
		CallGraph: &watcher.CallGraph{Calls: []optimizer.Call{{From: "web.shop", To: "api.shop", Rate: &one}},
			Ingress: []optimizer.Ingress{{Service: "web.shop", RPS: 100}}}})
	must(t, err)
	damped, err := xdsserver.New(xdsserver.Config{Registerer: reg})
	must(t, err)
	undamped, err := xdsserver.New(xdsserver.Config{Damping: -1})
	must(t, err)
	mg := &margins{}
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func() error{
		func() error { return damped.Run(runCtx) },
		func() error { return undamped.Run(runCtx) },
		func() error { return cl.Run(runCtx, fan{damped, undamped, mg}) },
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(); err != nil {
				t.Errorf("pipeline: %v", err)
			}
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })

	testkit.Eventually(t, 60*time.Second, "first publication", func() bool { return damped.Published() > 0 && undamped.Published() > 0 })
	// Let the 10 s window fill with samples of the base delays before the noise starts.
	time.Sleep(12 * time.Second)
	d0, u0 := damped.Published(), undamped.Published()
	top0 := counterValue(t, reg, "edgeflow_cluster_topologies_total")
	m0 := mg.len()
	rng := rand.New(rand.NewPCG(7, 11))
	start := time.Now()
	for range 60 {
		for pair, ms := range base {
			if err := tb.SetRTT(pair[0], pair[1], ms*(0.9+0.2*rng.Float64())); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Until(start.Add(time.Duration(time.Since(start)/time.Second+1) * time.Second)))
	}
	// The window still holds noisy samples for another 10 s.
	time.Sleep(10 * time.Second)
	d, u := damped.Published()-d0, undamped.Published()-u0
	topologies := counterValue(t, reg, "edgeflow_cluster_topologies_total") - top0
	suppressed := counterValue(t, reg, "edgeflow_xds_suppressed_publications_total")
	t.Logf("60 s of ±10%% noise on every link (%v): %v topologies passed the source's window and hysteresis; "+
		"publications with damping %d (suppressed %v), without damping %d",
		time.Since(start).Round(time.Second), topologies, d, suppressed, u)
	// From the margin in force when the noise began (that of the last push before it).
	ms, flips := mg.since(max(m0-1, 0))
	t.Logf("LATA's margin L(1,3) + L(2,4) − L(1,4) − L(2,3) of the topology in force and those after (ms, −2 configured): %.2f; %d sign changes", ms, flips)
	if u == 0 {
		t.Fatalf("no topology reached the servers during the noise: the test shows nothing")
	}
	if d > uint64(flips) {
		t.Errorf("%d publications with damping in 70 s of noise, but the measured optimum changed only %d times: damping pushed recomputes that changed nothing", d, flips)
	}
	if d > u {
		t.Errorf("damping published more (%d) than no damping (%d)", d, u)
	}
}

// meanLatencyQuery is edgeflow's latency query before the median: the mean RTT over the
// window's answered probes, per probe series (its target's labels kept, as the pins want).
const meanLatencyQuery = `sum_over_time(probe_icmp_duration_seconds{job="$job",phase="rtt"}[$window])` +
	` / ignoring(phase) sum_over_time(probe_success{job="$job"}[$window])`

// A few slow probes are not a slower link. A busy node reads ICMP replies late now and then (the
// reproduction's Prometheus held 25–65 ms probes on 4–12 ms links); a mean over the window
// follows them, and the plan follows the mean. Two Prometheus sources read the same real
// probes: the default query (the median of the answered probes) and the mean over them (the
// query before). For 2 s — two or three of the 10 probes in the window — edge-1 ↔ edge-3 reads
// 150 ms instead of 10: the mean's margin L(1,3) + L(2,4) − L(1,4) − L(2,3), −10 ms at rest,
// turns positive (LATA would swap web-1 to api-4, and back 10 s later); the median's stays
// negative. The margin is wide so that the machine's own noise (a few ms per pair under load)
// cannot decide the test.
func TestLatencySpikeIsNotASlowLink(t *testing.T) {
	t.Parallel()
	base := map[[2]string]float64{
		{"edge-1", "edge-3"}: 10, {"edge-1", "edge-4"}: 15, {"edge-2", "edge-3"}: 15,
		{"edge-2", "edge-4"}: 10, {"edge-1", "edge-2"}: 20, {"edge-3", "edge-4"}: 20}
	const window = 10 * time.Second
	tb := newWorld(t, worldOptions{nodes: edges, rtt: base, scrape: time.Second}).tb

	// margin is L(1,3) + L(2,4) − L(1,4) − L(2,3) in ms, NaN until all four are measured.
	margin := func(l map[prom.Pair]float64) float64 {
		return marginMS(func(from, to string) float64 {
			if v, ok := l[prom.Pair{From: from, To: to}]; ok {
				return v
			}
			return math.NaN()
		})
	}
	type reader struct {
		name string
		mu   sync.Mutex
		last float64 // the margin of the last delivery
		max  float64 // the largest margin delivered since reset
	}
	readers := []*reader{{name: "median (default)"}, {name: "mean"}}
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for i, r := range readers {
		cfg := prom.Config{URL: tb.PrometheusURL(), RoundTripper: tb.PrometheusTransport(), ScrapeInterval: time.Second,
			Window: window, CallsQuery: prom.DisableCalls}
		if i == 1 {
			cfg.LatencyQuery = meanLatencyQuery
		}
		src, err := prom.NewSource(cfg)
		must(t, err)
		r.last, r.max = math.NaN(), math.Inf(-1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := src.Run(runCtx, func(m *prom.Measurements) {
				r.mu.Lock()
				defer r.mu.Unlock()
				r.last = margin(m.Latency)
				r.max = max(r.max, r.last)
			}); err != nil {
				t.Errorf("%s source: %v", r.name, err)
			}
		}()
	}
	state := func(r *reader) (last, mx float64) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.last, r.max
	}
	testkit.Eventually(t, 60*time.Second, "every pair measured by both sources", func() bool {
		for _, r := range readers {
			if last, _ := state(r); math.IsNaN(last) {
				return false
			}
		}
		return true
	})
	// A window of probes at the base delays, then the margins at rest.
	time.Sleep(window + 2*time.Second)
	for _, r := range readers {
		last, _ := state(r)
		t.Logf("%s: margin at rest %.2f ms", r.name, last)
		if last >= 0 {
			t.Fatalf("%s: margin %.2f ms at rest, want < 0 (web-1 → api-3 cheapest): the testbed's delays are off", r.name, last)
		}
		r.mu.Lock()
		r.max = r.last // the margin in force; a source that delivers nothing new keeps it
		r.mu.Unlock()
	}
	must(t, tb.SetRTT("edge-1", "edge-3", 150))
	time.Sleep(2 * time.Second)
	must(t, tb.SetRTT("edge-1", "edge-3", 10))
	// The slow probes are in the window for another 10 s; the sources ask every 2 s.
	time.Sleep(window + 3*time.Second)
	median, medianMax := state(readers[0])
	_, meanMax := state(readers[1])
	t.Logf("2 s of 150 ms on edge-1 ↔ edge-3 (10 ms): largest margin read by the median %.2f ms, by the mean %.2f ms; median now %.2f ms",
		medianMax, meanMax, median)
	if meanMax <= 0 {
		t.Fatalf("the mean's margin stayed %.2f ms: the slow probes did not reach Prometheus, the test shows nothing", meanMax)
	}
	if medianMax >= 0 {
		t.Errorf("the median's margin reached %.2f ms: a few slow probes would move the plan", medianMax)
	}
}
