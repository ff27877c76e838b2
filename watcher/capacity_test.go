package watcher

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"maps"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/edgeflow/edgeflow/internal/kubetest"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// capacities reads each pod's CapacityRPS by its name in the topology (nil: none).
func capacities(top *optimizer.Topology) map[string]*float64 {
	out := map[string]*float64{}
	for _, s := range top.Services {
		for _, p := range s.Pods {
			out[s.Namespace+"/"+p.Name] = p.CapacityRPS
		}
	}
	return out
}

func TestMergeCapacity(t *testing.T) {
	t.Parallel()
	// api-h is api's headless twin (the same pods, listed as POD@api-h); web has an estimate
	// for one pod of two.
	st := state([]string{"n1", "n2"}, service("api", "api-1@n1", "api-2@n2"), service("api-h", "api-1@n1", "api-2@n2"),
		service("web", "web-1@n1", "web-2@n2"))
	c, _ := newCluster(t, LiveConfig{Prom: promStub})
	capacity := map[string]float64{"default/api-1": 100, "default/api-2": 150, "default/web-1": 80, "default/ghost": 1}
	top, _ := c.merge(st, nil, capacity)
	v := func(x float64) *float64 { return &x }
	want := map[string]*float64{
		"default/api-1": v(100), "default/api-2": v(150), "default/api-1@api-h": v(100), "default/api-2@api-h": v(150),
		"default/web-1": nil, "default/web-2": nil, // all or nothing: a service with some pods' rates is not valid
	}
	if diff := cmp.Diff(want, capacities(top)); diff != "" {
		t.Errorf("pods' capacity_rps (-want +got):\n%s", diff)
	}
	if _, err := optimizer.Compile(top, optimizer.Options{}); err != nil {
		t.Errorf("the topology with capacities does not compile: %v", err)
	}
	for _, s := range st.Services {
		for _, p := range s.Pods {
			if p.CapacityRPS != nil {
				t.Errorf("merge wrote its input: %s/%s has capacity %v", s.Name, p.Name, *p.CapacityRPS)
			}
		}
	}
	// The topology owns its numbers: changing the map later changes nothing.
	capacity["default/api-1"] = 1
	if got := *capacities(top)["default/api-1"]; got != 100 {
		t.Errorf("the topology shares the capacity map: api-1 reads %v", got)
	}
}

// loadRound is a Prometheus snapshot of the window ending at t0 + i windows: api-1 (0.5 cores)
// takes 2 ms of CPU per request, api-2 (1 core) 4 ms; both serve 1,000 requests a window,
// ±0.5 % from window to window. ghost and other/api-1 are no pod of a managed service.
func loadRound(i int, window time.Duration) *prom.Measurements {
	jitter := 1 + 0.005*float64(i%3-1)
	load := func(ns, pod string, cpuPerRequest float64) prom.PodLoad {
		n := 1000 * jitter // inbound time: the CPU time, nothing queued (a light load)
		return prom.PodLoad{Namespace: ns, Pod: pod, Window: window, Requests: n, InboundMSSum: n * cpuPerRequest * 1000, CPUSeconds: 1000 * cpuPerRequest * (2 - jitter)}
	}
	return &prom.Measurements{At: t0.Add(time.Duration(i) * window), Window: window, Load: []prom.PodLoad{
		load("default", "api-1", 0.002), load("default", "api-2", 0.004), load("default", "ghost", 0.001), load("other", "api-1", 0.001),
	}}
}

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestCapacityFromPodLoads(t *testing.T) {
	t.Parallel()
	est, err := estimate.New(estimate.Config{MinRequests: 100})
	if err != nil {
		t.Fatal(err)
	}
	c, reg := newCluster(t, LiveConfig{Prom: promStub, Estimator: est})
	st := state([]string{"n1", "n2"}, service("api", "api-1@n1", "api-2@n2"))
	st.PodCPU = []map[string]int64{{"default/api-1": 500, "default/api-2": 1000}}
	const window = time.Minute

	// The first window sets the counters' base; MinWindows (3) windows later each pod has an
	// estimate. Snapshots within a window of the one fed (the source delivers more often) and
	// stale loads are not fed.
	for i := 0; i <= 2; i++ {
		if got := c.feedCapacity(st, loadRound(i, window)); len(got) != 0 {
			t.Fatalf("window %d: capacities %v before MinWindows windows", i, got)
		}
		half := loadRound(i, window)
		half.At = half.At.Add(window / 2)
		clock := c.capacity.clock
		c.feedCapacity(st, half)
		if c.capacity.clock != clock {
			t.Fatalf("window %d: a snapshot half a window after the one fed was fed", i)
		}
	}
	stale := loadRound(3, window)
	for i := range stale.Load {
		stale.Load[i].Stale = true
	}
	if got := c.feedCapacity(st, stale); len(got) != 0 {
		t.Fatalf("stale loads fed: capacities %v", got)
	}
	got := c.feedCapacity(st, loadRound(4, window))
	// The truth: cores / CPU-seconds per request = 0.5 / 0.002 = 250 rps for both; the lower
	// confidence bound is under it.
	for _, pod := range []string{"default/api-1", "default/api-2"} {
		if v, ok := got[pod]; !ok || v > 250*1.0001 || v < 250*0.9 {
			t.Errorf("%s: capacity %v (estimated: %v), want the lower bound of 250 rps, within 10 %% under it", pod, v, ok)
		}
	}
	if len(got) != 2 {
		t.Errorf("capacities %v, want api-1 and api-2 only", got)
	}
	if n := metric(t, reg, "edgeflow_watcher_unmatched_total", "kind", "pod"); n != 2 {
		t.Errorf("unmatched_total{kind=pod} = %v, want 2 (ghost, other/api-1: each counted once)", n)
	}
	top := c.mergeWith(st, loadRound(4, window), got)
	if caps := capacities(top); caps["default/api-1"] == nil || *caps["default/api-1"] != got["default/api-1"] {
		t.Errorf("topology's capacities %v, want %v", caps, got)
	}

	// A small move is held (hysteresis); the value in force stays.
	before := got["default/api-1"]
	next := loadRound(5, window)
	next.Load[0].CPUSeconds *= 1.01
	if after := c.feedCapacity(st, next)["default/api-1"]; after != before {
		t.Errorf("a 1 %% move changed the capacity in force: %v → %v", before, after)
	}
	// A slower pod is followed.
	for i := 6; i <= 11; i++ {
		slow := loadRound(i, window)
		slow.Load[0].CPUSeconds *= 2
		got = c.feedCapacity(st, slow)
	}
	if v := got["default/api-1"]; v > 125*1.0001 || v < 125*0.9 {
		t.Errorf("api-1 at twice the CPU per request: capacity %v, want the lower bound of 125 rps", v)
	}
}

// Without pod loads, or with pod loads of no managed pod, the topology is byte for byte what it
// is without an estimator.
func TestNoPodLoadNoChange(t *testing.T) {
	t.Parallel()
	st := clusterState{state([]string{"n1", "n2"}, service("front", "front-1@n1"), service("api", "api-1@n1", "api-2@n2"))}.
		backs("front", "front").backs("api", "api")
	st.PodCPU = []map[string]int64{nil, {"default/api-1": 500, "default/api-2": 500}}
	plain, _ := newCluster(t, LiveConfig{Prom: promStub})
	est, err := estimate.New(estimate.Config{MinRequests: 1})
	if err != nil {
		t.Fatal(err)
	}
	withEst, _ := newCluster(t, LiveConfig{Prom: promStub, Estimator: est})
	const window = time.Minute
	for i := 0; i < 8; i++ {
		meas := &prom.Measurements{
			Latency: map[prom.Pair]float64{{From: "n1", To: "n2"}: 10, {From: "n2", To: "n1"}: 12},
			Calls:   []prom.CallRate{rate("istio-system/gw", "front", 100), rate("front", "api", 50)},
			Window:  window, At: t0.Add(time.Duration(i) * window),
		}
		if i%2 == 1 { // every other snapshot: the loads of pods edgeflow does not manage
			meas.Load = []prom.PodLoad{{Namespace: "istio-system", Pod: "gw-1", Window: window, Requests: 6000, CPUSeconds: 30}}
		}
		want, err := json.Marshal(plain.Merge(st.State, meas))
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(withEst.mergeWith(st.State, meas, withEst.feedCapacity(st.State, meas)))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("snapshot %d: with an estimator and no managed pod's load, the topology differs:\n%s\nwant\n%s", i, got, want)
		}
	}
}

// A failing pod-load query is named in the prometheus check, which stays OK: the pod loads are
// an extra, and the latency and calls still flow.
func TestPodLoadFailureInChecks(t *testing.T) {
	t.Parallel()
	fp := &fakeProm{latency: []promSample{latSample("n1", "n2", "0.002")}, fail: "container_cpu"}
	ps := fakePromSource(t, fp)
	c, _ := newCluster(t, LiveConfig{Kube: kubeSource(t, kubetest.NewClientset(clusterObjects()...)), Prom: ps})
	runCluster(t, c, recorder{got: make(chan *optimizer.Topology, 16)})
	testkit.Eventually(t, 10*time.Second, "the prometheus check naming the failing pod-load query", func() bool {
		return strings.Contains(checkNamed(c, "prometheus").Message, "pod-load queries failing")
	})
	if ck := checkNamed(c, "prometheus"); !ck.OK || !strings.Contains(ck.Message, "pod_cpu query") {
		t.Errorf("prometheus check: %+v, want OK naming the pod_cpu query", ck)
	}
	fp.set(func(f *fakeProm) { f.fail = "" })
	testkit.Eventually(t, 10*time.Second, "the prometheus check without the pod-load failure", func() bool {
		ck := checkNamed(c, "prometheus")
		return ck.OK && !strings.Contains(ck.Message, "pod-load")
	})
}

// TestBreakerFallsBackToLATA: the model-error breaker on the Live feed, with canned pod loads.
// api's pods have one core and big's two; every pod takes 4 ms of CPU and 4 ms of own time per
// request at 1,000 requests a minute. lata-q models a pod as one M/M/1 server of the estimated
// capacity: right for api (μ = 250 req/s, predicted 1/(μ − ℓ) ≈ 4.3 ms), wrong for big (μ = 2
// cores / 4 ms = 500 req/s as one server: ≈ 2.1 ms predicted against the 4 ms measured, a
// relative error of about 0.9 > 0.5). Three judged windows trip big: its pods lose their
// capacity (all of them), the trip is logged once, the metric is 1 and the closed-loop check
// names big, OK; api keeps its capacities. A window in which the plan in force changed is not
// judged.
func TestBreakerFallsBackToLATA(t *testing.T) {
	t.Parallel()
	est, err := estimate.New(estimate.Config{MinRequests: 100})
	if err != nil {
		t.Fatal(err)
	}
	breaker, err := estimate.NewBreaker(estimate.BreakerConfig{MinRequests: 100})
	if err != nil {
		t.Fatal(err)
	}
	st := state([]string{"n1", "n2"}, service("api", "api-1@n1", "api-2@n2"), service("big", "big-1@n1", "big-2@n2"))
	st.PodCPU = []map[string]int64{{"default/api-1": 1000, "default/api-2": 1000}, {"default/big-1": 2000, "default/big-2": 2000}} // by service: api, big
	const window = time.Minute
	perPod := 1000 / window.Seconds() // req/s: what the plan in force plans for every pod
	plan := &optimizer.Allocation{Policy: optimizer.ClosedLoop, Calls: []optimizer.CallAllocation{
		{From: "front", To: "api", Routes: []optimizer.Route{{Caller: "front-1", Callee: "api-1", Fraction: 1, RPS: perPod}, {Caller: "front-2", Callee: "api-2", Fraction: 1, RPS: perPod}}},
		{From: "front", To: "big", Routes: []optimizer.Route{{Caller: "front-1", Callee: "big-1", Fraction: 1, RPS: perPod}, {Caller: "front-2", Callee: "big-2", Fraction: 1, RPS: perPod}}},
	}}
	var inForce atomic.Pointer[optimizer.Allocation]
	inForce.Store(plan)
	// The plan's pods; its capacities come from the feed. The feed logs on this goroutine.
	planTop := &optimizer.Topology{Nodes: st.Nodes, Services: st.Services}
	var logs bytes.Buffer
	c, reg := newCluster(t, LiveConfig{Prom: promStub, Estimator: est, Breaker: breaker,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Plan: func() (*optimizer.Topology, *optimizer.Allocation) {
			return planTop, inForce.Load()
		}})
	round := func(i int) *prom.Measurements {
		jitter := 1 + 0.005*float64(i%3-1)
		n := 1000 * jitter
		load := func(pod string) prom.PodLoad {
			return prom.PodLoad{Namespace: "default", Pod: pod, Window: window, Requests: n, InboundMSSum: n * 4, CPUSeconds: n * 0.004 * (2 - jitter)}
		}
		return &prom.Measurements{At: t0.Add(time.Duration(i) * window), Window: window,
			Load: []prom.PodLoad{load("api-1"), load("api-2"), load("big-1"), load("big-2")}}
	}
	// Window 0 sets the base; the capacities are in force after window 3 (MinWindows); windows
	// 4, 5 and 6 are judged on them.
	var got map[string]float64
	for i := 0; i <= 5; i++ {
		got = c.feedCapacity(st, round(i))
	}
	if bs := breaker.State("big"); bs.Tripped || bs.BadWindows != 2 {
		t.Fatalf("after window 5: big %+v, want 2 bad windows, not tripped", bs)
	}
	if len(got) != 4 {
		t.Fatalf("capacities %v before the trip, want all four pods'", got)
	}
	// edgeflow_closed_loop_pod_capacity_rps: the estimator's last round, per pod (api: 1 core /
	// 4 ms of CPU per request = 250 req/s; big: 2 cores, 500 req/s), and the lower bound the
	// capacity in force is set from (kept while the bound moves within CapacityHysteresis).
	for pod, truth := range map[string]float64{"api-1": 250, "big-2": 500} {
		est := metric(t, reg, "edgeflow_closed_loop_pod_capacity_rps", "namespace", "default", "pod", pod, "bound", "estimate")
		lower := metric(t, reg, "edgeflow_closed_loop_pod_capacity_rps", "namespace", "default", "pod", pod, "bound", "lower")
		if math.Abs(est-truth) > 0.02*truth || !(lower > 0 && lower <= est) || math.Abs(got["default/"+pod]-lower) > CapacityHysteresis*got["default/"+pod] {
			t.Errorf("pod_capacity_rps of %s: estimate %v, lower %v, in force %v; want the estimate within 2 %% of %v, 0 < lower ≤ estimate, in force within the hysteresis of lower",
				pod, est, lower, got["default/"+pod], truth)
		}
	}
	got = c.feedCapacity(st, round(6))
	bs := breaker.State("big")
	if !bs.Tripped || !(bs.RelativeError > 0.8 && bs.RelativeError < 1) {
		t.Fatalf("after window 6: big %+v, want tripped at a relative error of about 0.9", bs)
	}
	if as := breaker.State("api"); as.Tripped || !(as.RelativeError < 0.15) || as.GoodWindows != 3 {
		t.Errorf("api %+v, want 3 good windows, a relative error under 0.15", as)
	}
	t.Logf("big: %s; api: relative error %.3f", bs.Reason, breaker.State("api").RelativeError)
	if _, ok := got["default/big-1"]; ok || len(got) != 2 || got["default/api-1"] == 0 || got["default/api-2"] == 0 {
		t.Errorf("capacities after big tripped: %v; want api's only", got)
	}
	top := c.mergeWith(st, round(6), got)
	caps := capacities(top)
	if caps["default/big-1"] != nil || caps["default/big-2"] != nil || caps["default/api-1"] == nil {
		t.Errorf("topology's capacities %v: want none for big's pods (lata), api's kept", caps)
	}
	if v := metric(t, reg, "edgeflow_closed_loop_breaker_tripped", "service", "big"); v != 1 {
		t.Errorf("breaker_tripped{service=big} = %v, want 1", v)
	}
	if v := metric(t, reg, "edgeflow_closed_loop_breaker_tripped", "service", "api"); v != 0 {
		t.Errorf("breaker_tripped{service=api} = %v, want 0", v)
	}
	if ck := checkNamed(c, "closed-loop"); !ck.OK || !strings.Contains(ck.Message, "big (measured response time") || strings.Contains(ck.Message, "api") {
		t.Errorf("closed-loop check %+v: want OK, naming big and why, not api", ck)
	}
	// Still wrong: stays tripped, logged once. A new plan in force: its first window is not
	// judged.
	c.feedCapacity(st, round(7))
	inForce.Store(&optimizer.Allocation{Policy: plan.Policy, Calls: plan.Calls})
	c.feedCapacity(st, round(8))
	if bs := breaker.State("big"); !bs.Tripped || bs.BadWindows != 4 {
		t.Errorf("after windows 7 and 8 (a new plan): big %+v, want tripped with 4 bad windows (8 not judged)", bs)
	}
	// edgeflow_closed_loop_windows_total: windows 0–8 fed live, of which 0 (the plan in force
	// changed from none) and 8 (a new plan) held.
	if held, taken := metric(t, reg, "edgeflow_closed_loop_windows_total", "held", "true"),
		metric(t, reg, "edgeflow_closed_loop_windows_total", "held", "false"); held != 2 || taken != 7 {
		t.Errorf("windows_total: held %v, not held %v; want 2 and 7", held, taken)
	}
	if n := strings.Count(logs.String(), "serving it as lata"); n != 1 {
		t.Errorf("the trip was logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestCapacityHoldDown: a window in which the plan in force changed (a push) does not change
// the capacities in force, though the estimate moved past the hysteresis in it; the next window,
// measured under one plan, puts the estimate in force.
func TestCapacityHoldDown(t *testing.T) {
	t.Parallel()
	est, err := estimate.New(estimate.Config{MinRequests: 100})
	if err != nil {
		t.Fatal(err)
	}
	breaker, err := estimate.NewBreaker(estimate.BreakerConfig{MinRequests: 100})
	if err != nil {
		t.Fatal(err)
	}
	st := state([]string{"n1", "n2"}, service("api", "api-1@n1", "api-2@n2"))
	st.PodCPU = []map[string]int64{{"default/api-1": 1000, "default/api-2": 1000}}
	const window = time.Minute
	perPod := 1000 / window.Seconds()
	plan := func() *optimizer.Allocation {
		return &optimizer.Allocation{Policy: optimizer.ClosedLoop, Calls: []optimizer.CallAllocation{
			{From: "front", To: "api", Routes: []optimizer.Route{{Caller: "front-1", Callee: "api-1", Fraction: 1, RPS: perPod}, {Caller: "front-2", Callee: "api-2", Fraction: 1, RPS: perPod}}}}}
	}
	var inForce atomic.Pointer[optimizer.Allocation]
	inForce.Store(plan())
	planTop := &optimizer.Topology{Nodes: st.Nodes, Services: st.Services}
	c, _ := newCluster(t, LiveConfig{Prom: promStub, Estimator: est, Breaker: breaker, Plan: func() (*optimizer.Topology, *optimizer.Allocation) {
		return planTop, inForce.Load()
	}})
	round := func(i int, cpuPerRequest float64) *prom.Measurements {
		const n = 1000
		load := func(pod string) prom.PodLoad {
			return prom.PodLoad{Namespace: "default", Pod: pod, Window: window, Requests: n, InboundMSSum: n * 4, CPUSeconds: n * cpuPerRequest}
		}
		return &prom.Measurements{At: t0.Add(time.Duration(i) * window), Window: window, Load: []prom.PodLoad{load("api-1"), load("api-2")}}
	}
	var before map[string]float64
	for i := 0; i <= 5; i++ {
		before = maps.Clone(c.feedCapacity(st, round(i, 0.004)))
	}
	if len(before) != 2 {
		t.Fatalf("capacities after 6 windows %v, want both pods'", before)
	}
	inForce.Store(plan()) // a push during window 6, whose pods also became 2× slower
	held := c.feedCapacity(st, round(6, 0.008))
	if !maps.Equal(held, before) {
		t.Errorf("window 6 (the plan in force changed): capacities %v, want those in force %v (held down)", held, before)
	}
	after := c.feedCapacity(st, round(7, 0.008))
	if !(after["default/api-1"] < before["default/api-1"]*(1-CapacityHysteresis)) {
		t.Errorf("window 7 (one plan): api-1 %v, want the slower estimate in force (under %v)", after["default/api-1"], before["default/api-1"]*(1-CapacityHysteresis))
	}
	t.Logf("api-1: %.1f before, %.1f held, %.1f after", before["default/api-1"], held["default/api-1"], after["default/api-1"])
}

// TestCapacityFromHistory: Run reads Prometheus's history of pod load before the Prometheus
// source's first round and feeds it before the first live window, so that with enough of it
// (MinWindows windows after the first, which sets the counters' base) the first topology
// delivered already has the pods' capacities; with less, or with the history off, it has none.
// b's two pods have one core each and take 4 ms of CPU per request, 1,000 requests a minute
// (250 req/s).
func TestCapacityFromHistory(t *testing.T) {
	t.Parallel()
	const window = time.Minute
	tests := []struct {
		name      string
		history   int // the windows Prometheus holds, up to t0
		windows   int // LiveConfig.CapacityHistoryWindows
		wantCap   bool
		wantLog   string
		noLogLine bool
	}{
		{name: "no history", history: 0, windows: 5, wantLog: "windows=0 windows_read=0 pods_with_capacity=0"},
		{name: "MinWindows windows: the first only sets the base", history: 3, windows: 5, wantLog: "windows=3 windows_read=3 pods_with_capacity=0"},
		{name: "MinWindows + 1 windows", history: 4, windows: 5, wantCap: true, wantLog: "windows=4 windows_read=4 pods_with_capacity=2"},
		{name: "the default of 5 windows", history: 10, windows: 5, wantCap: true, wantLog: "windows=5 windows_read=5 pods_with_capacity=2"},
		{name: "history off", history: 10, windows: 0, noLogLine: true},
	}
	if _, err := NewLive(LiveConfig{Kube: kubeSource(t, kubetest.NewClientset()), CallGraph: &CallGraph{}, CapacityHistoryWindows: -1}); err == nil || !strings.Contains(err.Error(), "-1 windows") {
		t.Errorf("NewLive with a history of -1 windows: %v, want an error naming it", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			from := t0.Add(-time.Duration(tt.history-1) * window) // the oldest window's end Prometheus has
			fp := &fakeProm{latency: []promSample{latSample("n1", "n2", "0.002")}, podLoad: func(q string, at time.Time) []promSample {
				if tt.history == 0 || !at.IsZero() && at.Before(from) {
					return nil // evaluated before Prometheus's history begins
				}
				value := "1000" // requests a window
				switch {
				case strings.Contains(q, "container_cpu"):
					value = "4"
				case strings.Contains(q, `reporter="source"`):
					value = "0"
				case strings.Contains(q, "duration"):
					value = "4000"
				}
				var out []promSample
				for _, pod := range []string{"b-1", "b-2"} {
					out = append(out, promSample{labels: map[string]string{"namespace": "default", "pod": pod}, value: value})
				}
				return out
			}}
			ps := fakePromSource(t, fp, func(c *prom.Config) { c.Window, c.Clock = window, testkit.NewFakeClock(t0) })
			objs := []runtime.Object{k8sNode("n1"), k8sNode("n2"), k8sService("b"), k8sSlice("b", "b-1@n1@10.0.1.1", "b-2@n2@10.0.1.2")}
			for _, p := range []*corev1.Pod{k8sPod("b", "b-1", "n1"), k8sPod("b", "b-2", "n2")} {
				p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
				objs = append(objs, p)
			}
			est, err := estimate.New(estimate.Config{})
			if err != nil {
				t.Fatal(err)
			}
			logs := &testkit.LogBuffer{}
			c, _ := newCluster(t, LiveConfig{Kube: kubeSource(t, kubetest.NewClientset(objs...)), Prom: ps, Estimator: est,
				CapacityHistoryWindows: tt.windows, Logger: slog.New(slog.NewTextHandler(logs, nil))})
			rec := recorder{got: make(chan *optimizer.Topology, 16)}
			runCluster(t, c, rec)
			caps := capacities(rec.next(t))
			for _, pod := range []string{"default/b-1", "default/b-2"} {
				v := caps[pod]
				switch {
				case !tt.wantCap && v != nil:
					t.Errorf("%s: capacity %v in the first topology, want none", pod, *v)
				case tt.wantCap && (v == nil || *v > 250*1.0001 || *v < 250*0.9):
					t.Errorf("%s: capacity %v in the first topology, want the lower bound of 250 req/s", pod, v)
				}
			}
			line := grepLine(logs.String(), "capacity estimator fed from Prometheus's history")
			switch {
			case tt.noLogLine && line != "":
				t.Errorf("a history log line with the history off: %s", line)
			case !tt.noLogLine && !strings.Contains(line, tt.wantLog):
				t.Errorf("history log line %q, want it to hold %q:\n%s", line, tt.wantLog, logs)
			}
		})
	}
}

// grepLine is the first line of s holding sub ("" if none).
func grepLine(s, sub string) string {
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// TestCapacityHistoryNotJudged: windows of history are never the breaker's, nor held, though a
// plan is in force (another replica's view cannot be told apart here): their estimate is in
// force at once. The first live window under the plan in force is the hold-down, as after any
// change of plan.
func TestCapacityHistoryNotJudged(t *testing.T) {
	t.Parallel()
	est, err := estimate.New(estimate.Config{MinRequests: 100})
	if err != nil {
		t.Fatal(err)
	}
	breaker, err := estimate.NewBreaker(estimate.BreakerConfig{MinRequests: 100})
	if err != nil {
		t.Fatal(err)
	}
	st := state([]string{"n1", "n2"}, service("api", "api-1@n1", "api-2@n2"))
	st.PodCPU = []map[string]int64{{"default/api-1": 500, "default/api-2": 1000}}
	const window = time.Minute
	perPod := 1000 / window.Seconds()
	plan := &optimizer.Allocation{Policy: optimizer.ClosedLoop, Calls: []optimizer.CallAllocation{
		{From: "front", To: "api", Routes: []optimizer.Route{{Caller: "front-1", Callee: "api-1", Fraction: 1, RPS: perPod}, {Caller: "front-2", Callee: "api-2", Fraction: 1, RPS: perPod}}}}}
	planTop := &optimizer.Topology{Nodes: st.Nodes, Services: st.Services}
	c, _ := newCluster(t, LiveConfig{Prom: promStub, Estimator: est, Breaker: breaker, Plan: func() (*optimizer.Topology, *optimizer.Allocation) {
		return planTop, plan
	}})
	var windows []*prom.Measurements
	for i := 0; i <= 5; i++ {
		windows = append(windows, loadRound(i, window))
	}
	c.feedHistory(st, windows)
	got := c.capacity.inForce(st)
	if len(got) != 2 {
		t.Fatalf("capacities after 6 windows of history: %v, want api-1's and api-2's (none held)", got)
	}
	if states := breaker.States(); len(states) != 0 {
		t.Errorf("the breaker judged history: %+v", states)
	}
	r := c.capacity.feed(st, loadRound(6, window))
	if !r.fed || !r.held || r.judged {
		t.Errorf("the first live window: fed %v, held %v, judged %v; want fed, held (the plan in force is new to the feed), not judged", r.fed, r.held, r.judged)
	}
	if after := c.capacity.inForce(st); !maps.Equal(after, got) {
		t.Errorf("capacities after the held window: %v, want %v", after, got)
	}
}

// Pods whose estimates differ by less than their own confidence margin share one capacity (the
// median of their lower bounds); a pod measured apart from its peers by more keeps its own; a
// service of two pods that differ keeps both; hysteresis keeps a value in force within 5 %.
func TestCapacitiesInForcePoolsAlikePods(t *testing.T) {
	c := func(svc string, rps, lower float64) estimate.Capacity {
		return estimate.Capacity{Service: svc, Source: estimate.SourceMeasured, RPS: rps, Lower: lower, Upper: 2*rps - lower}
	}
	caps := map[string]estimate.Capacity{
		// reviews: three alike pods, measured 64, 70 and 67 (margins 6–7): one capacity, 61
		"ns/reviews-a": c("ns/reviews", 64, 58), "ns/reviews-b": c("ns/reviews", 70, 63), "ns/reviews-c": c("ns/reviews", 67, 61),
		// ratings: one slow pod (44) among two at 67: the slow one keeps its own
		"ns/ratings-a": c("ns/ratings", 44, 40), "ns/ratings-b": c("ns/ratings", 66, 60), "ns/ratings-c": c("ns/ratings", 68, 62),
		// details: two pods measured apart, neither within its margin of their median (55.5)
		"ns/details-a": c("ns/details", 44, 40), "ns/details-b": c("ns/details", 67, 61),
		// no estimate
		"ns/new": {Service: "ns/details", Source: estimate.SourceNone},
	}
	got := CapacitiesInForce(caps, nil)
	want := map[string]float64{
		"ns/reviews-a": 61, "ns/reviews-b": 61, "ns/reviews-c": 61,
		"ns/ratings-a": 40, "ns/ratings-b": 61, "ns/ratings-c": 61,
		"ns/details-a": 40, "ns/details-b": 61,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("capacities in force (-want +got):\n%s", d)
	}
	// The next round: the pooled value moved under 5 % from the value in force: kept.
	caps["ns/reviews-a"] = c("ns/reviews", 66, 62)
	got = CapacitiesInForce(caps, want)
	if got["ns/reviews-a"] != 61 || got["ns/reviews-b"] != 61 {
		t.Errorf("within the hysteresis, in force %v, want 61 kept", got)
	}
}

// TestQuotaWaits: one window's waits of the pods of CPU-limited services, by hand: a pod of
// capacity 100 req/s and a 100m limit takes 1 ms of CPU a request; at 60 req/s with 3 ms inbound
// and 0.5 ms downstream a request it measured 1.5 ms of wait a request, and at 30 req/s with 1.2
// ms inbound 0.2 ms. A pod past its capacity, a pod of a service without a limit and a pod of no
// service are left out.
func TestQuotaWaits(t *testing.T) {
	t.Parallel()
	const window = 10 * time.Second
	load := func(pod string, rps, inboundMS, downstreamMS float64) prom.PodLoad {
		n := rps * window.Seconds()
		return prom.PodLoad{Namespace: "default", Pod: pod, Window: window, Requests: n, InboundMSSum: n * inboundMS, DownstreamMSSum: n * downstreamMS}
	}
	got := QuotaWaits(
		[]prom.PodLoad{load("api-3", 30, 1.2, 0), load("api-1", 60, 3, 0.5), load("api-2", 120, 3, 0), load("web-1", 60, 3, 0), load("ghost", 60, 3, 0)},
		map[string]string{"default/api-1": "api", "default/api-2": "api", "default/api-3": "api", "default/web-1": "web"},
		map[string]int64{"api": 100},
		map[string]float64{"default/api-1": 100, "default/api-2": 100, "default/api-3": 100, "default/web-1": 100, "default/ghost": 100})
	want := []estimate.WaitWindow{
		{Service: "api", Pod: "default/api-1", MeasuredMS: 600 * 1.5, PredictedMS: 600 * 1000 * optimizer.QuotaWait(60, 100, 100), Requests: 600},
		{Service: "api", Pod: "default/api-3", MeasuredMS: 300 * 0.2, PredictedMS: 300 * 1000 * optimizer.QuotaWait(30, 100, 100), Requests: 300},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(a)) })); diff != "" {
		t.Errorf("QuotaWaits (-want +got):\n%s", diff)
	}
	if got[0].PredictedMS < 600*0.5 {
		t.Errorf("the model predicts %.3g ms a request at 60 %% of μ; the example needs more than the scaler's floor (0.5)", got[0].PredictedMS/600)
	}
}

// TestQueueScaleFromPodLoads: a CPU-limited service (100m, 1.1 ms of CPU a request: 91 req/s)
// whose pods carry 60 req/s each and queue nothing (own time = CPU) gets the scaler's floor in
// its topology's queue_scale and the metric, once the estimator has capacities; a service
// without a limit gets none; when the pods then queue more than the model predicts, the scale
// returns to 1.
func TestQueueScaleFromPodLoads(t *testing.T) {
	t.Parallel()
	est, err := estimate.New(estimate.Config{MinRequests: 100})
	if err != nil {
		t.Fatal(err)
	}
	c, reg := newCluster(t, LiveConfig{Prom: promStub, Estimator: est})
	st := state([]string{"n1", "n2"}, service("api", "api-1@n1", "api-2@n2"), service("web", "web-1@n1"))
	st.Services[0].CPULimit = 100
	st.PodCPU = []map[string]int64{{"default/api-1": 100, "default/api-2": 100}, {"default/web-1": 100}}
	const window = time.Minute
	round := func(i int, waitMS float64) *prom.Measurements {
		load := func(pod string) prom.PodLoad {
			n := 60 * window.Seconds() * (1 + 0.005*float64(i%3-1))
			return prom.PodLoad{Namespace: "default", Pod: pod, Window: window, Requests: n, InboundMSSum: n * (1.1 + waitMS), CPUSeconds: n * 0.0011}
		}
		return &prom.Measurements{At: t0.Add(time.Duration(i) * window), Window: window, Load: []prom.PodLoad{load("api-1"), load("api-2"), load("web-1")}}
	}
	var top *optimizer.Topology
	for i := 0; i <= 4; i++ {
		top = c.mergeFed(st, round(i, 0))
	}
	scale := map[string]float64{}
	for _, s := range top.Services {
		scale[s.Name] = s.QueueScale
	}
	if want := map[string]float64{"api": 0.05, "web": 0}; !maps.Equal(scale, want) {
		t.Errorf("queue_scale by service %v, want %v (api: nothing queued, the floor; web: no limit)", scale, want)
	}
	if _, err := optimizer.Compile(top, optimizer.Options{}); err != nil {
		t.Errorf("the topology with a queue scale does not compile: %v", err)
	}
	if v := metric(t, reg, "edgeflow_closed_loop_queue_scale", "service", "api"); v != 0.05 {
		t.Errorf("edgeflow_closed_loop_queue_scale{service=api.default} = %v, want 0.05", v)
	}
	for i := 5; i <= 8; i++ {
		top = c.mergeFed(st, round(i, 100))
	}
	if s := top.Services[0]; s.Name != "api" || s.QueueScale != 1 {
		t.Errorf("%s: queue_scale %v after windows that queued 100 ms a request; want 1 (never above the model)", s.Name, s.QueueScale)
	}
}
