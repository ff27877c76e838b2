package live

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// forgerTarget is where the forging pod serves its series, scraped with honor_labels.
const forgerTarget = "127.0.0.1:9301"

// forger serves, at each scrape, the exposition its current forge function writes: a pod that
// claims other scrapes' labels, as any pod can under a job with honor_labels.
type forger struct {
	start time.Time
	forge atomic.Pointer[func(elapsed float64) string]
}

func (f *forger) set(forge func(elapsed float64) string) { f.forge.Store(&forge) }

func (f *forger) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	if fn := f.forge.Load(); fn != nil {
		fmt.Fprint(w, (*fn)(time.Since(f.start).Seconds()))
	}
}

// serveForger serves a forger at forgerTarget in the monitor namespace until the test ends.
func serveForger(t *testing.T, tb *testbed.Testbed) *forger {
	t.Helper()
	lis, err := tb.ListenMonitor("tcp", forgerTarget)
	must(t, err)
	f := &forger{start: time.Now()}
	srv := &http.Server{Handler: f, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return f
}

// TestForgedSeriesNeverEnterThePlan: a pod scraped by a real Prometheus under honor_labels (the
// community chart's kubernetes-pods job, a pushgateway) claims the probe job's labels — the
// real target's instance and node labels, so they pass the pins — with a 500 ms RTT on
// edge-1→edge-2, another instance's on edge-2→edge-1, and a pod's requests 1,000 times over.
// None of it is ever delivered: edge-1→edge-2 is contested and keeps its last trusted RTT
// (also while the link really slows), edge-2→edge-1's forged series is untrusted and the pair
// follows the link, the forged pod is contested and keeps its load. Then the pod floods
// istio_requests_total with more call edges than the series cap: the calls query fails alone,
// the latency still follows the link. When the forgery stops, edge-1→edge-2 follows again.
func TestForgedSeriesNeverEnterThePlan(t *testing.T) {
	t.Parallel()
	const (
		scrape    = time.Second
		window    = 5 * time.Second
		interval  = 500 * time.Millisecond
		maxSeries = 20 // the cap of one query's answer; the flood is over it, the real answers under
	)
	pods := []reportedPod{
		{namespace: ns, pod: "api-3", rps: 200, inboundMS: 4, cores: 0.5},
		{namespace: ns, pod: "web-1", rps: 100, inboundMS: 12, cores: 0.25},
	}
	nodes := []string{"edge-1", "edge-2"}
	w := newWorld(t, worldOptions{nodes: nodes, rtt: map[[2]string]float64{{"edge-1", "edge-2"}: 10}, scrape: scrape, podLoad: pods,
		honorTargets: []string{forgerTarget}})
	f := serveForger(t, w.tb)
	reg := prometheus.NewRegistry()
	src, err := prom.NewSource(prom.Config{URL: w.tb.PrometheusURL(), RoundTripper: w.tb.PrometheusTransport(), Interval: interval,
		Window: window, MaxSeries: maxSeries, Namespaces: []string{ns}, Registerer: reg})
	must(t, err)

	// Every delivery is checked: a forged value must never be delivered, not even once.
	one2, two1 := prom.Pair{From: "edge-1", To: "edge-2"}, prom.Pair{From: "edge-2", To: "edge-1"}
	var (
		mu     sync.Mutex
		last   *prom.Measurements
		forged []string
	)
	deliver := func(m *prom.Measurements) {
		mu.Lock()
		defer mu.Unlock()
		last = m
		for _, p := range []prom.Pair{one2, two1} {
			if v, ok := m.Latency[p]; ok && v > 100 {
				forged = append(forged, fmt.Sprintf("%v: %.1f ms delivered", p, v))
			}
		}
		for _, l := range m.Load {
			if l.Window > 0 && l.Requests/l.Window.Seconds() > 10*300 {
				forged = append(forged, fmt.Sprintf("%s: %.0f requests/s delivered", l.Name(), l.Requests/l.Window.Seconds()))
			}
		}
	}
	current := func() *prom.Measurements {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
	ctx, cancel := context.WithCancel(w.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := src.Run(ctx, deliver); err != nil {
			t.Errorf("prom.Source.Run: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if len(forged) > 0 { // also when the test stopped early
			t.Errorf("forged values delivered (%d): %s", len(forged), strings.Join(forged[:min(len(forged), 5)], "; "))
		}
	})

	near := func(v, want float64) bool { return math.Abs(v-want) < 0.5*want }
	load := func(m *prom.Measurements, pod string) (prom.PodLoad, bool) {
		for _, l := range m.Load {
			if l.Pod == pod {
				return l, true
			}
		}
		return prom.PodLoad{}, false
	}
	testkit.Eventually(t, 60*time.Second, "both pairs measured near 10 ms and both pods' loads", func() bool {
		m := current()
		if m == nil || !near(m.Latency[one2], 10) || !near(m.Latency[two1], 10) {
			return false
		}
		_, a := load(m, "api-3")
		_, b := load(m, "web-1")
		return a && b
	})
	trusted := current().Latency[one2]
	t.Logf("trusted: edge-1→edge-2 %.2f ms, edge-2→edge-1 %.2f ms", trusted, current().Latency[two1])

	// The forgery: edge-1→edge-2 with the real target's labels (pinned, a second series: the
	// job adds namespace and pod), edge-2→edge-1 with another instance (not pinned), and
	// api-3's requests from another scrape.
	probeForgery := func(elapsed float64) string {
		return fmt.Sprintf(`probe_icmp_duration_seconds{job=%q,instance=%q,source_node="edge-1",target_node="edge-2",phase="rtt"} 0.5
probe_success{job=%q,instance=%q,source_node="edge-1",target_node="edge-2"} 1
probe_icmp_duration_seconds{job=%q,instance="198.18.0.66",source_node="edge-2",target_node="edge-1",phase="rtt"} 0.5
probe_success{job=%q,instance="198.18.0.66",source_node="edge-2",target_node="edge-1"} 1
istio_requests_total{reporter="destination",namespace=%q,pod="api-3",response_code="200"} %f
`, testbed.ProbeJob, w.tb.NodeIP("edge-2"), testbed.ProbeJob, w.tb.NodeIP("edge-2"), testbed.ProbeJob, testbed.ProbeJob, ns, 200_000*elapsed)
	}
	f.set(probeForgery)
	testkit.Eventually(t, 30*time.Second, "edge-1→edge-2 and api-3 contested", func() bool {
		m := current()
		l, _ := load(m, "api-3")
		return m.Contested[one2] && l.Contested
	})
	m := current()
	// The last trusted value is the one of the last round before the forged series were seen:
	// the real probe may have been read again between the line above and the forge job's first
	// scrape, so it is taken here, where the pair is contested, and must hold from now on.
	if got := m.Latency[one2]; !near(got, 10) {
		t.Errorf("contested edge-1→edge-2 at %.2f ms: not a trusted value near 10 ms", got)
	}
	trusted = m.Latency[one2]
	if m.Contested[two1] {
		t.Errorf("edge-2→edge-1 contested by a series of another instance: it is not trusted at all")
	}
	if got := sampleValue(t, reg, "edgeflow_prometheus_contested_series", "signal", "latency"); got != 1 {
		t.Errorf("edgeflow_prometheus_contested_series{signal=latency} = %v, want 1", got)
	}
	if got := sampleValue(t, reg, "edgeflow_prometheus_ignored_samples_total", "query", "latency", "reason", "untrusted"); got == 0 {
		t.Errorf("the untrusted edge-2→edge-1 series is not counted")
	}
	t.Logf("contested: %s", prom.DescribeContested(m, 0))

	// The link slows while contested: edge-2→edge-1 follows it, edge-1→edge-2 keeps its last
	// trusted RTT.
	must(t, w.tb.SetRTT("edge-1", "edge-2", 40))
	testkit.Eventually(t, 30*time.Second, "edge-2→edge-1 following the link to 40 ms", func() bool {
		return near(current().Latency[two1], 40)
	})
	if got := current().Latency[one2]; got != trusted {
		t.Errorf("contested edge-1→edge-2: %.2f ms, want its last trusted %.2f", got, trusted)
	}

	// The flood: istio_requests_total of more call edges than the cap. The calls query fails
	// alone; the latency follows the link back.
	f.set(func(elapsed float64) string {
		var b strings.Builder
		b.WriteString(probeForgery(elapsed))
		for i := range 2 * maxSeries {
			fmt.Fprintf(&b, "istio_requests_total{reporter=\"source\",source_workload=\"flood-%d\",source_workload_namespace=%q,"+
				"destination_workload=\"api\",destination_workload_namespace=%q,response_code=\"200\"} %f\n", i, ns, ns, elapsed)
		}
		return b.String()
	})
	testkit.Eventually(t, 30*time.Second, "the calls query over the cap", func() bool {
		return strings.Contains(src.Status().Reason, "calls query")
	})
	st := src.Status()
	t.Logf("over the cap: %s", st.Reason)
	if st.OK || !strings.Contains(st.Reason, "cap") || strings.Contains(st.Reason, "latency query") || st.LoadReason != "" {
		t.Errorf("Status with the calls query over the cap: %+v; want the calls query failing alone", st)
	}
	must(t, w.tb.SetRTT("edge-1", "edge-2", 10))
	testkit.Eventually(t, 30*time.Second, "edge-2→edge-1 following the link back to 10 ms, the calls query over the cap", func() bool {
		return near(current().Latency[two1], 10) && strings.Contains(src.Status().Reason, "calls query")
	})

	// The forgery stops: nothing is contested, and edge-1→edge-2 is measured again.
	must(t, w.tb.SetRTT("edge-1", "edge-2", 40))
	f.set(func(float64) string { return "" })
	testkit.Eventually(t, 60*time.Second, "edge-1→edge-2 measured again at 40 ms, nothing contested", func() bool {
		m := current()
		l, _ := load(m, "api-3")
		return len(m.Contested) == 0 && !l.Contested && near(m.Latency[one2], 40)
	})
}

// sampleValue is the value of the sample of the named metric with the given label pairs.
func sampleValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if m.Gauge != nil {
				return m.Gauge.GetValue()
			}
			return m.Counter.GetValue()
		}
	}
	return math.NaN()
}
