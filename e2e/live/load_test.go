package live

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// reportedPod is one pod's load as a stock Istio mesh exports it: its sidecar completes rps
// requests/s of inboundMS each (reporter="destination") and makes callsPerRequest calls per
// request of downstreamMS each (reporter="source"); cAdvisor counts cores of CPU in its
// application container, 0.2 cores in istio-proxy, and both in the pod's own cgroup
// (container=""). A cpuOnly pod (outside the mesh) has the cAdvisor series alone.
type reportedPod struct {
	namespace, pod                                       string
	rps, inboundMS, callsPerRequest, downstreamMS, cores float64
	cpuOnly                                              bool
}

// sidecarCores is the CPU use of every reported pod's istio-proxy container.
const sidecarCores = 0.2

// reportedPodLoads serves reportedPods' counters, each growing at its constant rate from start,
// each sample stamped with the wall clock (as reportedRequests). With secondContainer set, every
// pod also has a second application container using as much CPU as the first.
type reportedPodLoads struct {
	start                   time.Time
	pods                    []reportedPod
	requests, duration, cpu *prometheus.Desc
	secondContainer         atomic.Bool
	attempts                []reportedAttempt
	attempt                 *prometheus.Desc
}

// reportedAttempt is one proxyless gRPC caller pod's call attempts to target at one callee
// locality, as grpc-go's OpenTelemetry plugin records them (grpc.client.attempt.duration with
// grpc.lb.locality) and OpenTelemetry's Prometheus exporter names them: rps attempts a second
// of ms each.
type reportedAttempt struct {
	namespace, pod, target, locality string
	rps, ms                          float64
}

func newReportedPodLoads(pods []reportedPod) *reportedPodLoads {
	return &reportedPodLoads{start: time.Now().Round(0), pods: pods,
		requests: prometheus.NewDesc("istio_requests_total", "Requests, as Istio's sidecars count them.",
			[]string{"reporter", "namespace", "pod", "response_code"}, nil),
		duration: prometheus.NewDesc("istio_request_duration_milliseconds", "Request durations, as Istio's sidecars time them.",
			[]string{"reporter", "namespace", "pod"}, nil),
		cpu: prometheus.NewDesc("container_cpu_usage_seconds_total", "CPU time, as cAdvisor counts it.",
			[]string{"namespace", "pod", "container"}, nil),
		attempt: prometheus.NewDesc("grpc_client_attempt_duration_seconds", "End-to-end time taken to complete a client call attempt.",
			[]string{"namespace", "pod", "grpc_method", "grpc_target", "grpc_status", "grpc_lb_locality"}, nil),
	}
}

func (c *reportedPodLoads) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.requests
	ch <- c.duration
	ch <- c.cpu
	ch <- c.attempt
}
func (c *reportedPodLoads) Collect(ch chan<- prometheus.Metric) {
	now := time.Now().Round(0)
	el := now.Sub(c.start).Seconds()
	at := func(m prometheus.Metric) { ch <- prometheus.NewMetricWithTimestamp(now, m) }
	for _, a := range c.attempts {
		n := a.rps * el
		at(prometheus.MustNewConstHistogram(c.attempt, uint64(n), n*a.ms/1000, nil,
			a.namespace, a.pod, "edgeflow.test.Echo/Call", a.target, "OK", a.locality))
	}
	for _, p := range c.pods {
		cpu := func(container string, cores float64) {
			at(prometheus.MustNewConstMetric(c.cpu, prometheus.CounterValue, cores*el, p.namespace, p.pod, container))
		}
		app := p.cores
		cpu("app", p.cores)
		if c.secondContainer.Load() {
			cpu("app2", p.cores)
			app += p.cores
		}
		cpu("istio-proxy", sidecarCores)
		cpu("", app+sidecarCores)
		if p.cpuOnly {
			continue
		}
		n := p.rps * el
		at(prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, n, "destination", p.namespace, p.pod, "200"))
		at(prometheus.MustNewConstHistogram(c.duration, uint64(n), n*p.inboundMS, nil, "destination", p.namespace, p.pod))
		if calls := n * p.callsPerRequest; calls > 0 {
			at(prometheus.MustNewConstHistogram(c.duration, uint64(calls), calls*p.downstreamMS, nil, "source", p.namespace, p.pod))
		}
	}
}

// loadsMatch says how loads differ from what pods export (nil: within tol, relative): the mesh
// pods only, each with its request rate, mean inbound and downstream time per request, and its
// application containers' cores (×containers).
func loadsMatch(loads []prom.PodLoad, pods []reportedPod, containers int, tol float64) error {
	byName := map[string]prom.PodLoad{}
	for _, l := range loads {
		byName[l.Name()] = l
	}
	var errs []error
	near := func(what string, got, want float64) {
		if math.Abs(got-want) > tol*math.Abs(want) {
			errs = append(errs, fmt.Errorf("%s: %.4g, want %.4g", what, got, want))
		}
	}
	mesh := 0
	for _, p := range pods {
		name := p.namespace + "/" + p.pod
		l, ok := byName[name]
		switch {
		case p.cpuOnly && ok:
			errs = append(errs, fmt.Errorf("%s has a load, but no requests", name))
			continue
		case p.cpuOnly:
			continue
		case !ok:
			errs = append(errs, fmt.Errorf("%s has no load", name))
			continue
		}
		mesh++
		w := l.Window.Seconds()
		near(name+" requests/s", l.Requests/w, p.rps)
		near(name+" inbound ms per request", l.InboundMSSum/l.Requests, p.inboundMS)
		near(name+" downstream ms per request", l.DownstreamMSSum/l.Requests, p.callsPerRequest*p.downstreamMS)
		near(name+" cores", l.CPUSeconds/w, float64(containers)*p.cores)
	}
	if len(loads) != mesh {
		errs = append(errs, fmt.Errorf("%d loads, want %d", len(loads), mesh))
	}
	return errors.Join(errs...)
}

// runSource runs a Prometheus source until the test ends; the returned function gives the
// last Measurements delivered (nil before the first).
func runSource(t *testing.T, cfg prom.Config) (*prom.Source, func() *prom.Measurements) {
	t.Helper()
	src, err := prom.NewSource(cfg)
	must(t, err)
	var last atomic.Pointer[prom.Measurements]
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := src.Run(ctx, func(m *prom.Measurements) { last.Store(m) }); err != nil {
			t.Errorf("prom.Source.Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return src, last.Load
}

// TestPodLoadFromPrometheus: the pod-load queries, default and as configured, read from a real
// Prometheus scraping a stock mesh's series per pod (Istio's requests and durations by the
// scrape's namespace and pod labels, cAdvisor's CPU with the sidecar's and the pod cgroup's
// beside the application's) return what was exported; a pod outside the mesh has none. A
// pod-load query that Prometheus fails keeps the last good loads while the latency goes on,
// and /readyz-level status says why without failing; it recovers when the query answers again.
func TestPodLoadFromPrometheus(t *testing.T) {
	t.Parallel()
	const (
		scrape   = time.Second
		window   = 5 * time.Second
		interval = 500 * time.Millisecond
		tol      = 0.1 // increase() extrapolates to the window's edges; the hysteresis holds up to 5 %
	)
	pods := []reportedPod{
		{namespace: ns, pod: "api-3", rps: 200, inboundMS: 4, cores: 0.5},
		{namespace: ns, pod: "web-1", rps: 100, inboundMS: 12, callsPerRequest: 2, downstreamMS: 3, cores: 0.25},
		{namespace: "kube-system", pod: "coredns-1", cores: 0.1, cpuOnly: true},
	}
	nodes := []string{"edge-1", "edge-2"}
	w := newWorld(t, worldOptions{nodes: nodes, rtt: map[[2]string]float64{{"edge-1", "edge-2"}: 10}, scrape: scrape, podLoad: pods})
	base := prom.Config{URL: w.tb.PrometheusURL(), RoundTripper: w.tb.PrometheusTransport(), Interval: interval, Window: window,
		CallsQuery: prom.DisableCalls}

	// Source a: the default queries. Source b: a CPU query that Prometheus fails when a pod has
	// two application containers (label_replace makes their series one labelset).
	a := base
	a.Registerer = prometheus.NewRegistry()
	_, lastA := runSource(t, a)
	b := base
	b.Registerer = prometheus.NewRegistry()
	b.PodCPUQuery = `sum by (namespace, pod) (label_replace(increase(container_cpu_usage_seconds_total{container!="",container!="istio-proxy"}[$window]), "container", "", "", ""))`
	srcB, lastB := runSource(t, b)

	matches := func(last func() *prom.Measurements, containers int) func() error {
		return func() error {
			m := last()
			if m == nil {
				return errors.New("nothing delivered yet")
			}
			return loadsMatch(m.Load, pods, containers, tol)
		}
	}
	testkit.EventuallyNoError(t, 30*time.Second, "default queries' pod loads as exported", matches(lastA, 1))
	testkit.EventuallyNoError(t, 30*time.Second, "configured queries' pod loads as exported", matches(lastB, 1))
	for _, l := range lastA().Load {
		t.Logf("default queries: %s over %v: %.0f requests, %.0f ms inbound, %.0f ms downstream, %.3g CPU-seconds",
			l.Name(), l.Window, l.Requests, l.InboundMSSum, l.DownstreamMSSum, l.CPUSeconds)
	}

	// Every pod gets a second container: b's CPU query fails, a's reads twice the CPU.
	w.podLoad.secondContainer.Store(true)
	testkit.Eventually(t, 30*time.Second, "b's pod-load query failing", func() bool { return srcB.Status().LoadReason != "" })
	st := srcB.Status()
	t.Logf("b while its CPU query fails: %s", st.LoadReason)
	if !st.OK || !strings.Contains(st.LoadReason, "pod_cpu") {
		t.Errorf("b's Status while its CPU query fails: %+v; want OK, naming pod_cpu", st)
	}
	testkit.EventuallyNoError(t, 30*time.Second, "a reading two containers' CPU", matches(lastA, 2))
	// The latency still flows through b, with the last good loads (one container's), stale.
	must(t, w.tb.SetRTT("edge-1", "edge-2", 40))
	testkit.Eventually(t, 30*time.Second, "b following the RTT change", func() bool {
		return lastB().Latency[prom.Pair{From: "edge-1", To: "edge-2"}] > 30
	})
	if srcB.Status().LoadReason == "" {
		t.Fatal("b's CPU query answered again before the test checked the loads kept")
	}
	kept := lastB().Load
	if err := loadsMatch(kept, pods, 1, tol); err != nil {
		t.Errorf("b's pod loads while its CPU query fails, want the last good ones: %v", err)
	}
	for _, l := range kept {
		if !l.Stale {
			t.Errorf("b's pod load %s while its CPU query fails is not stale", l.Name())
		}
	}

	// One container again: b recovers once the second container's series left the window; the
	// next delivery (the RTT back: a loads' return within hysteresis is none) has fresh loads.
	w.podLoad.secondContainer.Store(false)
	testkit.Eventually(t, 30*time.Second, "b's pod-load queries answering again", func() bool { return srcB.Status().LoadReason == "" })
	must(t, w.tb.SetRTT("edge-1", "edge-2", 10))
	testkit.Eventually(t, 30*time.Second, "b following the RTT back", func() bool {
		return lastB().Latency[prom.Pair{From: "edge-1", To: "edge-2"}] < 20
	})
	if err := loadsMatch(lastB().Load, pods, 1, tol); err != nil {
		t.Errorf("b's pod loads after recovery: %v", err)
	}
	for _, l := range lastB().Load {
		if l.Stale {
			t.Errorf("b's pod load %s is stale after recovery", l.Name())
		}
	}
}

// TestPodLoadSetsCapacity: the live loop as serve wires it — a real kube-apiserver, a real
// Prometheus scraping a stock mesh's per-pod series, the capacity estimator fed by Live — gives
// each managed pod its measured capacity (cores / CPU-seconds per request, the pod's cores its
// CPU request, 500m here) as Pod.CapacityRPS; the load of a pod edgeflow does not manage is
// left out and counted.
func TestPodLoadSetsCapacity(t *testing.T) {
	t.Parallel()
	const (
		scrape   = time.Second
		window   = 3 * time.Second
		interval = 500 * time.Millisecond
	)
	// The truth: μ = 0.5 cores / (cores used / rps).
	pods := []reportedPod{
		{namespace: ns, pod: "api-3", rps: 200, inboundMS: 1, cores: 0.2},                                      // 1 ms CPU a request: 500 rps
		{namespace: ns, pod: "api-4", rps: 100, inboundMS: 2, cores: 0.2},                                      // 2 ms: 250 rps
		{namespace: ns, pod: "web-1", rps: 100, inboundMS: 6, callsPerRequest: 1, downstreamMS: 4, cores: 0.1}, // 1 ms: 500 rps
		{namespace: ns, pod: "web-2", rps: 100, inboundMS: 6, callsPerRequest: 1, downstreamMS: 4, cores: 0.1},
		{namespace: "istio-system", pod: "istio-ingressgateway-1", rps: 200, inboundMS: 1, cores: 0.3}, // no managed pod
	}
	truth := map[string]float64{"api-3": 500, "api-4": 250, "web-1": 500, "web-2": 500}
	w := newWorld(t, worldOptions{nodes: edges, rtt: edgeRTT(), scrape: scrape, podLoad: pods,
		kube: true, services: []string{"web", "api"}, pods: shopPods})
	est, err := estimate.New(estimate.Config{MinRequests: 100})
	must(t, err)
	w.watch(watchOptions{prom: &prom.Config{Interval: interval, Window: window}, live: watcher.LiveConfig{Estimator: est}})

	capacity := func() (map[string]float64, error) {
		top := w.cl.Current()
		if top == nil {
			return nil, errors.New("no topology yet")
		}
		got := map[string]float64{}
		for _, s := range top.Services {
			for _, p := range s.Pods {
				if p.CapacityRPS == nil {
					return nil, fmt.Errorf("pod %s has no capacity yet", p.Name)
				}
				got[p.Name] = *p.CapacityRPS
			}
		}
		return got, nil
	}
	testkit.EventuallyNoError(t, 60*time.Second, "each managed pod's capacity within 15 % under the truth", func() error {
		got, err := capacity()
		if err != nil {
			return err
		}
		var errs []error
		for pod, want := range truth {
			// The lower confidence bound: at most the truth (increase() reads a few % either
			// way), not far under it with constant rates.
			if v, ok := got[pod]; !ok || v > want*1.05 || v < want*0.85 {
				errs = append(errs, fmt.Errorf("%s: %.1f rps, want %.0f (−15 %%, +5 %%)", pod, v, want))
			}
		}
		return errors.Join(errs...)
	})
	got, _ := capacity()
	t.Logf("capacities (lower bounds, requests/s): %v; truth %v", got, truth)
	if n := counterValue(t, w.reg, "edgeflow_watcher_unmatched_total"); n < 1 {
		t.Errorf("edgeflow_watcher_unmatched_total = %v, want the ingress gateway's load counted", n)
	}
}
