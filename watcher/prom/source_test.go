package prom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// series is one sample of the fake Prometheus's answer.
type series struct {
	labels map[string]string
	value  string
}

func lat(from, to, seconds string) series {
	return series{labels: map[string]string{"__name__": "probe_icmp_duration_seconds", "phase": "rtt", "source_node": from, "target_node": to}, value: seconds}
}

// call is a call-rate sample; from and to are "namespace/name".
func call(from, to, rps string) series {
	fns, fname, _ := strings.Cut(from, "/")
	tns, tname, _ := strings.Cut(to, "/")
	return series{labels: map[string]string{
		"source_workload": fname, "source_workload_namespace": fns,
		"destination_workload": tname, "destination_workload_namespace": tns,
	}, value: rps}
}

// fakeProm speaks the instant-query endpoint of the Prometheus HTTP API: the latency query
// (recognised by "probe_icmp") gets latency, the success query ("probe_success" alone) gets
// success (nil: 1 for every latency series), a pod-load query ("by (namespace, pod)") gets
// load[its query name] (loadQueryOf), any other query gets calls. A pod-load query evaluated
// at a time (the time parameter) is answered from the history instead: loadAt[that time].
type fakeProm struct {
	mu         sync.Mutex
	latency    []series
	success    []series
	calls      []series
	load       map[string][]series
	loadFail   map[string]bool                   // the pod-load queries (by name) answered with HTTP 500
	loadAt     map[time.Time]map[string][]series // pod loads by evaluation time, then query name; a time not in it has none
	failAt     map[time.Time]bool                // pod-load queries evaluated at these times answered with HTTP 500
	status     int                               // non-zero: answer with this HTTP status and body
	body       string                            // with status
	resultType string                            // "" means vector
	targets    []any                             // non-nil: /api/v1/targets answers these active targets
	attempts   map[string][]series               // the call-attempt queries' answers, by query name
	attemptErr bool                              // the call-attempt queries answered with HTTP 500
	received   []url.Values
}

func (f *fakeProm) set(fn func(f *fakeProm)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeProm) requests() []url.Values {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]url.Values(nil), f.received...)
}

func (f *fakeProm) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/api/v1/targets" {
		f.mu.Lock()
		targets := f.targets
		f.mu.Unlock()
		if targets == nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"activeTargets": targets}})
		return
	}
	if r.URL.Path != "/api/v1/query" {
		http.NotFound(w, r)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.received = append(f.received, r.Form)
	if f.status != 0 {
		w.WriteHeader(f.status)
		fmt.Fprint(w, f.body)
		return
	}
	var at time.Time // the evaluation time asked for; zero: now
	if ts := r.Form.Get("time"); ts != "" {
		sec, err := strconv.ParseFloat(ts, 64)
		if err != nil {
			http.Error(w, "bad time: "+err.Error(), http.StatusBadRequest)
			return
		}
		at = time.Unix(0, int64(math.Round(sec*1e9))).UTC()
	}
	if q := r.Form.Get("query"); strings.Contains(q, "grpc_client_attempt") {
		if f.attemptErr {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, "call-attempt query exploded")
			return
		}
		name := queryAttempts
		if strings.Contains(q, "_sum") {
			name = queryAttemptSeconds
		}
		writeVector(w, f.attempts[name])
		return
	}
	if q := r.Form.Get("query"); strings.Contains(q, "by (namespace, pod") && (f.loadFail[loadQueryOf(q)] || f.failAt[at]) {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, "pod-load query exploded")
		return
	}
	src := f.calls
	switch q := r.Form.Get("query"); {
	case strings.Contains(q, "probe_icmp"):
		src = f.latency
	case strings.Contains(q, "by (namespace, pod") && !at.IsZero():
		src = f.loadAt[at][loadQueryOf(q)]
	case strings.Contains(q, "by (namespace, pod"):
		src = f.load[loadQueryOf(q)]
	case strings.Contains(q, "probe_success"):
		src = f.success
		if src == nil { // a latency pair with an RTT answered every probe, one with NaN none
			for _, l := range f.latency {
				v, err := strconv.ParseFloat(l.value, 64)
				switch {
				case l.labels["source_node"] == "" || l.labels["target_node"] == "":
				case math.IsNaN(v):
					src = append(src, series{labels: l.labels, value: "0"})
				case err == nil && v >= 0 && !math.IsInf(v, 0):
					src = append(src, series{labels: l.labels, value: "1"})
				}
			}
		}
	}
	var data any
	switch f.resultType {
	case "", "vector":
		result := []any{}
		for _, s := range src {
			result = append(result, map[string]any{"metric": s.labels, "value": []any{1.7e9, s.value}})
		}
		data = map[string]any{"resultType": "vector", "result": result}
	case "scalar":
		data = map[string]any{"resultType": "scalar", "result": []any{1.7e9, "1"}}
	case "matrix":
		data = map[string]any{"resultType": "matrix", "result": []any{}}
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": data}); err != nil {
		panic(err)
	}
}

// writeVector answers a query with src as an instant vector.
func writeVector(w http.ResponseWriter, src []series) {
	result := []any{}
	for _, s := range src {
		result = append(result, map[string]any{"metric": s.labels, "value": []any{1.7e9, s.value}})
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"resultType": "vector", "result": result}}); err != nil {
		panic(err)
	}
}

// syncBuffer collects log output written from any goroutine, and counts lines in it.
type syncBuffer struct{ testkit.LogBuffer }

func (b *syncBuffer) count(s string) int { return strings.Count(b.String(), s) }

// harness is a Source on a fake Prometheus with a fake clock; tests drive rounds by hand.
type harness struct {
	t     *testing.T
	prom  *fakeProm
	srv   *httptest.Server
	src   *Source
	clock *testkit.FakeClock
	reg   *prometheus.Registry
	logs  *syncBuffer
}

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func newHarness(t *testing.T, cfg Config, prom *fakeProm) *harness {
	t.Helper()
	h := &harness{t: t, prom: prom, clock: testkit.NewFakeClock(t0), reg: prometheus.NewRegistry(), logs: &syncBuffer{}}
	h.srv = httptest.NewServer(prom)
	t.Cleanup(h.srv.Close)
	if cfg.URL == "" {
		cfg.URL = h.srv.URL
	}
	cfg.RoundTripper = h.srv.Client().Transport
	if cfg.ProbePins == "" {
		cfg.ProbePins = PinOff // fakeProm has no targets API; the pins' tests set PinTargets
	}
	cfg.Clock = h.clock
	cfg.Logger = slog.New(slog.NewTextHandler(h.logs, nil))
	cfg.Registerer = h.reg
	src, err := NewSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.src = src
	return h
}

// advance moves the fake clock forward by d and returns the new time.
func (h *harness) advance(d time.Duration) time.Time {
	h.clock.Step(d)
	return h.clock.Now()
}

// round runs one query round and returns what would be delivered (nil for nothing).
func (h *harness) round() *Measurements { return h.src.round(context.Background()) }

// mustDeliver runs a round that must deliver.
func (h *harness) mustDeliver(what string) *Measurements {
	h.t.Helper()
	m := h.round()
	if m == nil {
		h.t.Fatalf("%s: nothing delivered", what)
	}
	return m
}

// mustNotDeliver runs a round that must deliver nothing.
func (h *harness) mustNotDeliver(what string) {
	h.t.Helper()
	if m := h.round(); m != nil {
		h.t.Fatalf("%s: unexpected delivery %+v", what, m)
	}
}

func (h *harness) metric(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

// exposition compares the registry's exposition of the named metrics with want.
func (h *harness) exposition(want string, names ...string) {
	h.t.Helper()
	if err := testutil.GatherAndCompare(h.reg, strings.NewReader(want), names...); err != nil {
		h.t.Error(err)
	}
}

func TestFirstAnswerDelivered(t *testing.T) {
	t.Parallel()
	prom := &fakeProm{
		latency: []series{lat("edge-a", "edge-b", "0.0125"), lat("edge-b", "edge-a", "0.013"), lat("edge-a", "edge-a", "0.0001")},
		calls:   []series{call("shop/productpage", "shop/reviews", "100"), call("shop/frontend", "shop/productpage", "100")},
	}
	h := newHarness(t, Config{}, prom)
	if st := h.src.Status(); st.OK || st.Synced || st.Reason == "" {
		t.Errorf("Status before the first round: %+v", st)
	}
	got := h.mustDeliver("first answer")
	want := &Measurements{
		Latency:     map[Pair]float64{{"edge-a", "edge-b"}: 12.5, {"edge-b", "edge-a"}: 13, {"edge-a", "edge-a"}: 0.1},
		Loss:        map[Pair]float64{{"edge-a", "edge-b"}: 0, {"edge-b", "edge-a"}: 0, {"edge-a", "edge-a"}: 0},
		Unreachable: map[Pair]bool{},
		Stale:       map[Pair]bool{},
		Contested:   map[Pair]bool{},
		Calls: []CallRate{
			{From: Workload{"frontend", "shop"}, To: Workload{"productpage", "shop"}, RPS: 100},
			{From: Workload{"productpage", "shop"}, To: Workload{"reviews", "shop"}, RPS: 100},
		},
		StaleCalls: map[CallEdge]bool{},
		Window:     4 * DefaultScrapeInterval, // the fake has no targets API: the default
		At:         t0,
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })); diff != "" {
		t.Errorf("first Measurements (-want +got):\n%s", diff)
	}
	if st := h.src.Status(); !st.OK || !st.Synced || st.Reason != "" || !st.Since.Equal(t0) || !st.LastSuccess.Equal(t0) {
		t.Errorf("Status after the first answer: %+v", st)
	}

	// The queries as sent: $window and $scrape_interval substituted, Prometheus's evaluation timeout set.
	reqs := prom.requests()
	if len(reqs) != 7 {
		t.Fatalf("%d requests, want 7", len(reqs))
	}
	if q := reqs[0].Get("query"); q != `quantile_over_time(0.5, (probe_icmp_duration_seconds{job="edgeflow-icmp",phase="rtt"} > 0)[1m:15s])` {
		t.Errorf("latency query sent: %s", q)
	}
	if q := reqs[1].Get("query"); q != `avg_over_time(probe_success{job="edgeflow-icmp"}[1m])` {
		t.Errorf("success query sent: %s", q)
	}
	if q := reqs[2].Get("query"); q != `sum by (reporter, source_workload, source_workload_namespace, destination_workload, destination_workload_namespace)`+
		` (rate(istio_requests_total{reporter=~"source|destination"}[1m]))` {
		t.Errorf("calls query sent: %s", q)
	}
	for i, want := range []string{
		`sum by (namespace, pod, job, instance) (increase(istio_requests_total{reporter="destination"}[1m]))`,
		`sum by (namespace, pod, job, instance) (increase(istio_request_duration_milliseconds_sum{reporter="destination"}[1m]))`,
		`sum by (namespace, pod, job, instance) (increase(istio_request_duration_milliseconds_sum{reporter="source"}[1m]))`,
		`sum by (namespace, pod, job, instance) (increase(container_cpu_usage_seconds_total{container!="",container!="istio-proxy"}[1m]))`,
	} {
		if q := reqs[3+i].Get("query"); q != want {
			t.Errorf("pod-load query %d sent: %s, want %s", i, q, want)
		}
	}
	if to := reqs[0].Get("timeout"); to != "5s" {
		t.Errorf("timeout sent: %q, want 5s", to)
	}
	if reqs[0].Has("time") {
		t.Error("the evaluation time should be Prometheus's own (no time parameter)")
	}

	h.exposition(fmt.Sprintf(`
# HELP edgeflow_prometheus_deliveries_total Measurements delivered (first answer, a changed set of pairs, edges or pods, a change beyond hysteresis, or a window of pod load).
# TYPE edgeflow_prometheus_deliveries_total counter
edgeflow_prometheus_deliveries_total 1
# HELP edgeflow_prometheus_last_success_timestamp_seconds Unix time of the last query round that succeeded.
# TYPE edgeflow_prometheus_last_success_timestamp_seconds gauge
edgeflow_prometheus_last_success_timestamp_seconds %d
# HELP edgeflow_prometheus_queries_total Prometheus queries run, by query (latency, success, calls, pod_requests, pod_inbound, pod_downstream, pod_cpu, attempts, attempt_seconds) and result (ok, error).
# TYPE edgeflow_prometheus_queries_total counter
edgeflow_prometheus_queries_total{query="calls",result="error"} 0
edgeflow_prometheus_queries_total{query="calls",result="ok"} 1
edgeflow_prometheus_queries_total{query="latency",result="error"} 0
edgeflow_prometheus_queries_total{query="latency",result="ok"} 1
edgeflow_prometheus_queries_total{query="pod_cpu",result="error"} 0
edgeflow_prometheus_queries_total{query="pod_cpu",result="ok"} 1
edgeflow_prometheus_queries_total{query="pod_downstream",result="error"} 0
edgeflow_prometheus_queries_total{query="pod_downstream",result="ok"} 1
edgeflow_prometheus_queries_total{query="pod_inbound",result="error"} 0
edgeflow_prometheus_queries_total{query="pod_inbound",result="ok"} 1
edgeflow_prometheus_queries_total{query="pod_requests",result="error"} 0
edgeflow_prometheus_queries_total{query="pod_requests",result="ok"} 1
edgeflow_prometheus_queries_total{query="success",result="error"} 0
edgeflow_prometheus_queries_total{query="success",result="ok"} 1
# HELP edgeflow_prometheus_up 1 if the last query round succeeded, else 0.
# TYPE edgeflow_prometheus_up gauge
edgeflow_prometheus_up 1
`, t0.Unix()), "edgeflow_prometheus_deliveries_total", "edgeflow_prometheus_last_success_timestamp_seconds",
		"edgeflow_prometheus_queries_total", "edgeflow_prometheus_up")

	// The same answer again is no change.
	h.advance(2 * time.Second)
	h.mustNotDeliver("an identical answer")
	if n := h.metric(h.src.suppressed); n != 0 {
		t.Errorf("suppressed = %v after an identical answer, want 0", n)
	}
}

func TestCustomWindowAndQuery(t *testing.T) {
	t.Parallel()
	prom := &fakeProm{latency: []series{{labels: map[string]string{"from": "a", "to": "b"}, value: "7"}}}
	h := newHarness(t, Config{
		Window:       90 * time.Second,
		LatencyQuery: `avg_over_time(probe_icmp_rtt_ms[$window]) # probe_icmp`,
		SourceLabel:  "from", TargetLabel: "to",
		LatencyUnit:      1, // already ms
		CallsQuery:       DisableCalls,
		SuccessQuery:     DisableSuccess,
		PodRequestsQuery: DisableLoad, // turns every pod-load query off
		PodCPUQuery:      "ignored without the requests query",
	}, prom)
	m := h.mustDeliver("first answer")
	if m.Latency[Pair{"a", "b"}] != 7 || len(m.Calls) != 0 {
		t.Errorf("Measurements: %+v", m)
	}
	reqs := prom.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests with the calls, success and pod-load queries disabled, want 1", len(reqs))
	}
	if q := reqs[0].Get("query"); q != `avg_over_time(probe_icmp_rtt_ms[1m30s]) # probe_icmp` {
		t.Errorf("query sent: %s", q)
	}
	if n, err := testutil.GatherAndCount(h.reg, "edgeflow_prometheus_queries_total"); err != nil || n != 2 {
		t.Errorf("queries_total series with calls, success and pod-load disabled: %d (%v), want 2 (latency ok/error)", n, err)
	}
}

func TestHysteresis(t *testing.T) {
	t.Parallel()
	other := lat("x", "y", "0.050")
	tests := []struct {
		name           string
		cfg            Config
		old, new       series
		wantDeliver    bool
		wantSuppressed float64
	}{
		{"latency unchanged", Config{}, lat("a", "b", "0.100"), lat("a", "b", "0.100"), false, 0},
		{"latency below relative", Config{}, lat("a", "b", "0.100"), lat("a", "b", "0.104"), false, 1},  // 4 ms > 0.5 ms, < 5 %
		{"latency below absolute", Config{}, lat("a", "b", "0.002"), lat("a", "b", "0.0024"), false, 1}, // 20 % > 5 %, 0.4 ms < 0.5 ms
		{"latency above both", Config{}, lat("a", "b", "0.010"), lat("a", "b", "0.011"), true, 0},
		{"latency falls beyond both", Config{}, lat("a", "b", "0.100"), lat("a", "b", "0.090"), true, 0},
		{"latency from zero", Config{}, lat("a", "b", "0"), lat("a", "b", "0.0006"), true, 0},
		{"custom thresholds hold", Config{HysteresisRelative: 0.5, HysteresisLatencyMS: 20}, lat("a", "b", "0.100"), lat("a", "b", "0.140"), false, 1},
		{"no thresholds", Config{HysteresisRelative: -1, HysteresisLatencyMS: -1}, lat("a", "b", "0.100"), lat("a", "b", "0.100001"), true, 0},
		{"calls below relative", Config{}, call("ns/a", "ns/b", "100"), call("ns/a", "ns/b", "104"), false, 1},
		{"calls below absolute", Config{}, call("ns/a", "ns/b", "2"), call("ns/a", "ns/b", "2.9"), false, 1},
		{"calls above both", Config{}, call("ns/a", "ns/b", "10"), call("ns/a", "ns/b", "12"), true, 0},
		{"new call edge", Config{}, call("ns/a", "ns/b", "10"), call("ns/a", "ns/c", "10"), true, 0},
		{"new pair", Config{}, lat("a", "b", "0.010"), lat("a", "c", "0.010"), true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prom := &fakeProm{}
			put := func(s series) {
				prom.set(func(f *fakeProm) {
					if _, ok := s.labels["source_node"]; ok {
						f.latency, f.calls = []series{other, s}, nil
					} else {
						f.latency, f.calls = []series{other}, []series{s}
					}
				})
			}
			h := newHarness(t, tt.cfg, prom)
			put(tt.old)
			first := h.mustDeliver("first answer")
			put(tt.new)
			h.advance(2 * time.Second)
			got := h.round()
			if (got != nil) != tt.wantDeliver {
				t.Errorf("delivered = %v, want %v", got != nil, tt.wantDeliver)
			}
			if n := h.metric(h.src.suppressed); n != tt.wantSuppressed {
				t.Errorf("suppressed_changes_total = %v, want %v", n, tt.wantSuppressed)
			}
			if got != nil && got == first {
				t.Error("a delivery reused the previous snapshot")
			}
			if want := map[bool]float64{false: 1, true: 2}[tt.wantDeliver]; h.metric(h.src.deliveries) != want {
				t.Errorf("deliveries_total = %v, want %v", h.metric(h.src.deliveries), want)
			}
		})
	}
}

func TestSlowDriftIsDelivered(t *testing.T) {
	t.Parallel()
	prom := &fakeProm{}
	at := func(seconds string) { prom.set(func(f *fakeProm) { f.latency = []series{lat("a", "b", seconds)} }) }
	h := newHarness(t, Config{}, prom)
	steps := []struct {
		seconds string
		want    float64 // delivered ms, 0 for no delivery
	}{
		{"0.100", 100},
		{"0.103", 0},      // 3 ms from 100: below 5 %
		{"0.106", 106},    // 6 ms from the 100 delivered: beyond
		{"0.109", 0},      // 3 ms from the 106 delivered
		{"0.111", 0},      // 5 ms from 106: below 5 % (5.3 ms)
		{"0.1114", 111.4}, // 5.4 ms from 106: beyond
	}
	for i, s := range steps {
		at(s.seconds)
		h.advance(2 * time.Second)
		m := h.round()
		switch {
		case s.want == 0 && m != nil:
			t.Errorf("step %d (%s s): delivered %v", i, s.seconds, m.Latency)
		case s.want != 0 && m == nil:
			t.Errorf("step %d (%s s): nothing delivered", i, s.seconds)
		case s.want != 0 && math.Abs(m.Latency[Pair{"a", "b"}]-s.want) > 1e-9:
			t.Errorf("step %d (%s s): delivered %v ms, want %v", i, s.seconds, m.Latency[Pair{"a", "b"}], s.want)
		}
	}
	if n := h.metric(h.src.suppressed); n != 3 {
		t.Errorf("suppressed_changes_total = %v, want 3", n)
	}
}

func TestStaleSeriesKeptThenForgotten(t *testing.T) {
	t.Parallel()
	prom := &fakeProm{
		latency: []series{lat("a", "b", "0.010"), lat("b", "a", "0.012")},
		calls:   []series{call("ns/x", "ns/y", "5"), call("ns/y", "ns/z", "5")},
	}
	h := newHarness(t, Config{StaleAfter: time.Minute}, prom)
	h.mustDeliver("first answer")
	staleMetric := func(lat, calls int) string {
		return fmt.Sprintf(`
# HELP edgeflow_prometheus_stale_series Series seen before that vanished from the query result, kept at their last good value.
# TYPE edgeflow_prometheus_stale_series gauge
edgeflow_prometheus_stale_series{query="calls"} %d
edgeflow_prometheus_stale_series{query="latency"} %d
edgeflow_prometheus_stale_series{query="pod_cpu"} 0
edgeflow_prometheus_stale_series{query="pod_downstream"} 0
edgeflow_prometheus_stale_series{query="pod_inbound"} 0
edgeflow_prometheus_stale_series{query="pod_requests"} 0
`, calls, lat)
	}

	// b→a and x→y vanish: kept, marked stale, counted; the values in effect are unchanged, so
	// nothing is delivered.
	prom.set(func(f *fakeProm) {
		f.latency = []series{lat("a", "b", "0.010")}
		f.calls = []series{call("ns/y", "ns/z", "5")}
	})
	h.advance(10 * time.Second)
	h.mustNotDeliver("series vanished")
	h.exposition(staleMetric(1, 1), "edgeflow_prometheus_stale_series")

	// Another change is delivered with the stale values kept.
	prom.set(func(f *fakeProm) { f.latency = []series{lat("a", "b", "0.020")} })
	h.advance(10 * time.Second)
	m := h.mustDeliver("a change beside stale series")
	if m.Latency[Pair{"b", "a"}] != 12 || !m.Stale[Pair{"b", "a"}] || m.Stale[Pair{"a", "b"}] || m.Latency[Pair{"a", "b"}] != 20 {
		t.Errorf("latency with a stale pair: %v stale %v", m.Latency, m.Stale)
	}
	xy := CallEdge{Workload{"x", "ns"}, Workload{"y", "ns"}}
	if len(m.Calls) != 2 || m.Calls[0].RPS != 5 || !m.StaleCalls[xy] || len(m.StaleCalls) != 1 {
		t.Errorf("calls with a stale edge: %v stale %v", m.Calls, m.StaleCalls)
	}

	// StaleAfter after they were last seen, they are forgotten: the sets changed, so a delivery.
	h.advance(40 * time.Second) // 60 s since last seen
	m = h.mustDeliver("stale series forgotten")
	if _, ok := m.Latency[Pair{"b", "a"}]; ok || len(m.Stale) != 0 {
		t.Errorf("after StaleAfter: latency %v stale %v", m.Latency, m.Stale)
	}
	if len(m.Calls) != 1 || m.Calls[0].From.Name != "y" || len(m.StaleCalls) != 0 {
		t.Errorf("after StaleAfter: calls %v stale %v", m.Calls, m.StaleCalls)
	}
	h.exposition(staleMetric(0, 0), "edgeflow_prometheus_stale_series")
	// A forgotten pair counts as never measured; here the other direction stands in for it.
	if l, unmeasured := FillLatency([]string{"a", "b"}, m.Latency, nil); unmeasured != 0 || l[1].MS != 20 {
		t.Errorf("FillLatency after forgetting: %v, %d unmeasured", l, unmeasured)
	}
	if h.logs.count("forgetting stale series") != 2 || h.logs.count("series vanished") != 2 {
		t.Errorf("logs:\n%s", h.logs.String())
	}
	if v, c := h.metric(h.src.vanished.WithLabelValues(queryLatency)), h.metric(h.src.vanished.WithLabelValues(queryCalls)); v != 1 || c != 1 {
		t.Errorf("edgeflow_prometheus_series_vanished_total: latency %v, calls %v; want 1 each", v, c)
	}
}

func TestStaleSeriesComesBack(t *testing.T) {
	t.Parallel()
	prom := &fakeProm{latency: []series{lat("a", "b", "0.010"), lat("b", "a", "0.012")}, calls: []series{}}
	h := newHarness(t, Config{}, prom)
	h.mustDeliver("first answer")
	prom.set(func(f *fakeProm) { f.latency = f.latency[:1] })
	h.advance(time.Minute)
	h.mustNotDeliver("vanished")
	if n := h.metric(h.src.stale.WithLabelValues(queryLatency)); n != 1 {
		t.Errorf("stale series = %v, want 1", n)
	}
	prom.set(func(f *fakeProm) { f.latency = []series{lat("a", "b", "0.010"), lat("b", "a", "0.012")} })
	h.advance(time.Minute)
	h.mustNotDeliver("back at the same value")
	if n := h.metric(h.src.stale.WithLabelValues(queryLatency)); n != 0 {
		t.Errorf("stale series = %v, want 0", n)
	}
	// Staleness is measured from the last time the series was seen, so coming back renews it.
	prom.set(func(f *fakeProm) { f.latency = f.latency[:1] })
	h.advance(9 * time.Minute)
	h.mustNotDeliver("vanished again, within StaleAfter of its return")
}

func TestQueryFailures(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(h *harness) // makes the next round fail
		fix    func(h *harness)
		want   []string // in Status.Reason
		query  string   // the failing query, as in queries_total
	}{
		{
			name:   "HTTP 500",
			break_: func(h *harness) { h.prom.set(func(f *fakeProm) { f.status, f.body = 500, "upstream exploded" }) },
			fix:    func(h *harness) { h.prom.set(func(f *fakeProm) { f.status = 0 }) },
			want:   []string{"latency query", "calls query", "server error: 500", "upstream exploded"}, // both fail
			query:  queryLatency,
		},
		{
			name: "bad PromQL",
			break_: func(h *harness) {
				h.prom.set(func(f *fakeProm) {
					f.status, f.body = 400, `{"status":"error","errorType":"bad_data","error":"parse error: unexpected end of input"}`
				})
			},
			fix:   func(h *harness) { h.prom.set(func(f *fakeProm) { f.status = 0 }) },
			want:  []string{"latency query", "bad_data", "parse error"},
			query: queryLatency,
		},
		{
			name:   "scalar result",
			break_: func(h *harness) { h.prom.set(func(f *fakeProm) { f.resultType = "scalar" }) },
			fix:    func(h *harness) { h.prom.set(func(f *fakeProm) { f.resultType = "" }) },
			want:   []string{"latency query", "result type scalar, want vector"},
			query:  queryLatency,
		},
		{
			name:   "matrix result",
			break_: func(h *harness) { h.prom.set(func(f *fakeProm) { f.resultType = "matrix" }) },
			fix:    func(h *harness) { h.prom.set(func(f *fakeProm) { f.resultType = "" }) },
			want:   []string{"result type matrix, want vector"},
			query:  queryLatency,
		},
		{
			name: "calls query only",
			break_: func(h *harness) {
				h.prom.set(func(f *fakeProm) { f.calls = []series{{labels: map[string]string{}, value: "x"}} }) // unparsable value
			},
			fix:   func(h *harness) { h.prom.set(func(f *fakeProm) { f.calls = []series{call("ns/a", "ns/b", "1")} }) },
			want:  []string{"calls query", "istio_requests_total"},
			query: queryCalls,
		},
		{
			name: "connection refused",
			break_: func(h *harness) {
				h.srv.Close() // the port now refuses connections
			},
			fix: func(h *harness) {
				addr := strings.TrimPrefix(h.src.cfg.URL, "http://")
				l, err := net.Listen("tcp", addr)
				if err != nil {
					h.t.Fatalf("listening again on %s: %v", addr, err)
				}
				h.srv = &httptest.Server{Listener: l, Config: &http.Server{Handler: h.prom}}
				h.srv.Start()
				h.t.Cleanup(h.srv.Close)
			},
			want:  []string{"latency query", "connection refused"},
			query: queryLatency,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prom := &fakeProm{latency: []series{lat("a", "b", "0.010")}, calls: []series{call("ns/a", "ns/b", "1")}}
			h := newHarness(t, Config{}, prom)
			h.mustDeliver("first answer")
			okBefore := h.metric(h.src.queries.WithLabelValues(tt.query, "ok"))

			tt.break_(h)
			t1 := h.advance(2 * time.Second)
			h.mustNotDeliver("failing round")
			h.advance(2 * time.Second)
			h.mustNotDeliver("second failing round")
			st := h.src.Status()
			if st.OK || !st.Synced || !st.Since.Equal(t1) || !st.LastSuccess.Equal(t0) {
				t.Errorf("Status while failing: %+v (failing since %v, last success %v)", st, t1, t0)
			}
			for _, w := range append(tt.want, h.src.cfg.URL) {
				if !strings.Contains(st.Reason, w) {
					t.Errorf("Status.Reason %q does not mention %q", st.Reason, w)
				}
			}
			if h.metric(h.src.up) != 0 || h.metric(h.src.queries.WithLabelValues(tt.query, "error")) != 2 {
				t.Errorf("up = %v, %s errors = %v; want 0 and 2", h.metric(h.src.up), tt.query,
					h.metric(h.src.queries.WithLabelValues(tt.query, "error")))
			}
			if got := h.metric(h.src.lastSuccess); got != float64(t0.Unix()) {
				t.Errorf("last_success_timestamp_seconds = %v, want %v", got, t0.Unix())
			}
			if strings.Contains(st.Reason, "\n") {
				t.Errorf("Reason %q is not one line", st.Reason)
			}
			if !strings.HasPrefix(st.Reason, ErrQuery.Error()) {
				t.Errorf("Reason %q should start with %q", st.Reason, ErrQuery)
			}

			// Recovery: Status OK again; the same values as delivered before are no change.
			tt.fix(h)
			t3 := h.advance(2 * time.Second)
			if m := h.round(); m != nil {
				t.Errorf("recovery with unchanged values delivered %+v", m)
			}
			if st := h.src.Status(); !st.OK || st.Reason != "" || !st.Since.Equal(t3) || !st.LastSuccess.Equal(t3) {
				t.Errorf("Status after recovery: %+v", st)
			}
			if h.metric(h.src.up) != 1 || h.metric(h.src.queries.WithLabelValues(tt.query, "ok")) != okBefore+1 {
				t.Errorf("after recovery: up = %v, ok queries = %v", h.metric(h.src.up), h.metric(h.src.queries.WithLabelValues(tt.query, "ok")))
			}
		})
	}
}

func TestFailureBeforeFirstAnswer(t *testing.T) {
	t.Parallel()
	prom := &fakeProm{status: http.StatusServiceUnavailable, latency: []series{lat("a", "b", "0.010")}}
	h := newHarness(t, Config{CallsQuery: DisableCalls}, prom)
	h.mustNotDeliver("Prometheus unavailable")
	if st := h.src.Status(); st.OK || st.Synced || !st.Since.Equal(t0) || !st.LastSuccess.IsZero() || !strings.Contains(st.Reason, "server error: 503") {
		t.Errorf("Status: %+v", st)
	}
	prom.set(func(f *fakeProm) { f.status = 0 })
	h.advance(2 * time.Second)
	if m := h.mustDeliver("first answer after a failure"); m.Latency[Pair{"a", "b"}] != 10 {
		t.Errorf("Measurements: %+v", m)
	}
	if st := h.src.Status(); !st.OK || !st.Synced {
		t.Errorf("Status: %+v", st)
	}
}

func TestBadSamplesIgnored(t *testing.T) {
	t.Parallel()
	noTarget := lat("a", "z", "0.001")
	delete(noTarget.labels, "target_node")
	prom := &fakeProm{
		latency: []series{
			lat("a", "c", "+Inf"), lat("a", "d", "-0.001"), noTarget,
			lat("b", "a", "0.010"), lat("c", "c", "0.0002"), // intra-node is fine
		},
		calls: []series{call("ns/a", "ns/b", "NaN"), call("ns/a", "ns/c", "3")},
	}
	h := newHarness(t, Config{}, prom)
	m := h.mustDeliver("first answer")
	want := map[Pair]float64{{"b", "a"}: 10, {"c", "c"}: 0.2}
	if diff := cmp.Diff(want, m.Latency); diff != "" {
		t.Errorf("latency (-want +got):\n%s", diff)
	}
	if len(m.Calls) != 1 || m.Calls[0].To.Name != "c" {
		t.Errorf("calls: %+v", m.Calls)
	}
	check := func(round int) {
		t.Helper()
		for _, c := range []struct {
			query, reason string
			want          float64
		}{
			{queryLatency, reasonBadValue, 2}, {queryLatency, reasonMissingLabel, 1}, {queryCalls, reasonBadValue, 1}, {queryCalls, reasonMissingLabel, 0},
		} {
			if got := h.metric(h.src.ignored.WithLabelValues(c.query, c.reason)); got != c.want*float64(round) {
				t.Errorf("round %d: ignored_samples_total{query=%q,reason=%q} = %v, want %v", round, c.query, c.reason, got, c.want*float64(round))
			}
		}
	}
	check(1)

	// Counted every round, logged once per series.
	h.advance(2 * time.Second)
	h.mustNotDeliver("the same answer")
	check(2)
	if n := h.logs.count("ignoring an RTT") + h.logs.count("ignoring a call rate"); n != 3 {
		t.Errorf("%d log lines for bad samples after two rounds, want 3 (once per series):\n%s", n, h.logs.String())
	}
	if n := h.logs.count("without its node labels"); n != 1 {
		t.Errorf("%d log lines for the unlabelled series, want 1", n)
	}
	if !strings.Contains(h.logs.String(), `series="probe_icmp_duration_seconds{phase=\"rtt\", source_node=\"a\", target_node=\"c\"}"`) {
		t.Errorf("the log does not name the series:\n%s", h.logs.String())
	}

	// A measured pair turning bad is a vanished series: kept at its last good value, stale.
	prom.set(func(f *fakeProm) { f.latency[3] = lat("b", "a", "-1") })
	h.advance(2 * time.Second)
	h.mustNotDeliver("a good pair turned negative")
	if n := h.metric(h.src.stale.WithLabelValues(queryLatency)); n != 1 {
		t.Errorf("stale latency series = %v, want 1", n)
	}
}

func TestCallRatesParsed(t *testing.T) {
	t.Parallel()
	prom := &fakeProm{
		latency: []series{},
		calls: []series{
			call("shop/reviews", "shop/ratings", "20"),
			call("shop/productpage", "shop/reviews", "30"),
			call("shop/productpage", "shop/reviews", "12.5"), // a second series of one edge: summed
			call("shop/productpage", "shop/details", "40"),
			call("edge/gateway", "shop/productpage", "40"),
			call("shop/idle", "shop/reviews", "0"),
			call("/nobody", "shop/reviews", "1"), // no source namespace: ignored
		},
	}
	h := newHarness(t, Config{}, prom)
	m := h.mustDeliver("first answer")
	want := []CallRate{
		{From: Workload{"gateway", "edge"}, To: Workload{"productpage", "shop"}, RPS: 40},
		{From: Workload{"idle", "shop"}, To: Workload{"reviews", "shop"}, RPS: 0},
		{From: Workload{"productpage", "shop"}, To: Workload{"details", "shop"}, RPS: 40},
		{From: Workload{"productpage", "shop"}, To: Workload{"reviews", "shop"}, RPS: 42.5},
		{From: Workload{"reviews", "shop"}, To: Workload{"ratings", "shop"}, RPS: 20},
	}
	if diff := cmp.Diff(want, m.Calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if len(m.Latency) != 0 {
		t.Errorf("latency: %v", m.Latency)
	}
	if got := h.metric(h.src.ignored.WithLabelValues(queryCalls, reasonMissingLabel)); got != 1 {
		t.Errorf("ignored calls samples = %v, want 1", got)
	}
	if !strings.Contains(h.logs.String(), "without its workload labels") {
		t.Errorf("no log line for the unlabelled call series:\n%s", h.logs.String())
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no URL", Config{}, "Config.URL: empty"},
		{"unparsable URL", Config{URL: "http://[::1"}, "Config.URL"},
		{"no scheme", Config{URL: "prometheus:9090"}, `Config.URL: prometheus:9090: scheme "prometheus"`},
		{"ftp", Config{URL: "ftp://prometheus:9090"}, `scheme "ftp", want http or https`},
		{"no host", Config{URL: "http:///api"}, "Config.URL: http:///api: no host"},
		{"negative interval", Config{URL: "http://p", Interval: -time.Second}, "Config.Interval: negative"},
		{"negative window", Config{URL: "http://p", Window: -time.Second}, "Config.Window: negative"},
		{"sub-millisecond window", Config{URL: "http://p", Window: 1500 * time.Microsecond}, "Config.Window: 1.5ms is not a whole number of milliseconds"},
		{"negative timeout", Config{URL: "http://p", Timeout: -1}, "Config.Timeout: negative"},
		{"negative StaleAfter", Config{URL: "http://p", StaleAfter: -time.Minute}, "Config.StaleAfter: negative"},
		{"blank latency query", Config{URL: "http://p", LatencyQuery: "  "}, "Config.LatencyQuery"},
		{"blank calls query", Config{URL: "http://p", CallsQuery: " "}, "Config.CallsQuery: blank"},
		{"same labels", Config{URL: "http://p", SourceLabel: "node", TargetLabel: "node"}, `Config.TargetLabel: "node" is also the SourceLabel`},
		{"bad label", Config{URL: "http://p", SourceLabel: "\xff"}, "Config.SourceLabel"},
		{"negative unit", Config{URL: "http://p", LatencyUnit: -1000}, "Config.LatencyUnit: -1000"},
		{"NaN unit", Config{URL: "http://p", LatencyUnit: math.NaN()}, "Config.LatencyUnit: NaN"},
		{"NaN hysteresis", Config{URL: "http://p", HysteresisRelative: math.NaN()}, "Config.HysteresisRelative: NaN"},
		{"infinite hysteresis", Config{URL: "http://p", HysteresisRPS: math.Inf(1)}, "Config.HysteresisRPS: +Inf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewSource(tt.cfg)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewSource: %v; want an ErrInvalidConfig mentioning %q", err, tt.want)
			}
		})
	}

	s, err := NewSource(Config{URL: "https://prometheus.monitoring:9090/prom/"})
	if err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	if c.Interval != DefaultInterval || c.Window != 0 || s.windowFor() != 4*DefaultScrapeInterval || c.Timeout != DefaultTimeout || c.StaleAfter != DefaultStaleAfter ||
		c.LatencyQuery != DefaultLatencyQuery || c.CallsQuery != DefaultCallsQuery || c.SourceLabel != "source_node" ||
		c.TargetLabel != "target_node" || c.LatencyUnit != 1000 || c.HysteresisRelative != 0.05 ||
		c.HysteresisLatencyMS != 0.5 || c.HysteresisRPS != 1 || c.Clock == nil || c.Logger == nil {
		t.Errorf("defaults not applied: %+v", c)
	}

	// Registering twice on one registry is an error, not a panic.
	reg := prometheus.NewRegistry()
	if _, err := NewSource(Config{URL: "http://p", Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSource(Config{URL: "http://p", Registerer: reg}); err == nil || !strings.Contains(err.Error(), "registering metrics") {
		t.Errorf("second registration: %v", err)
	}
}

// running is a Source on a fake Prometheus, its Run on a goroutine of its own delivering into
// got.
type running struct {
	t      *testing.T
	src    *Source
	got    chan *Measurements
	cancel context.CancelFunc
	done   chan error
}

// startRun starts Run of a Source made from cfg, on prom, logging nowhere and registering its
// metrics in a registry of its own.
func startRun(t *testing.T, cfg Config, prom *fakeProm) *running {
	t.Helper()
	srv := httptest.NewServer(prom)
	t.Cleanup(srv.Close)
	cfg.URL, cfg.Logger, cfg.Registerer = srv.URL, slog.New(slog.DiscardHandler), prometheus.NewRegistry()
	if cfg.ProbePins == "" {
		cfg.ProbePins = PinOff // fakeProm has no targets API
	}
	src, err := NewSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &running{t: t, src: src, got: make(chan *Measurements, 100), done: make(chan error, 1)}
	var ctx context.Context
	ctx, r.cancel = context.WithCancel(context.Background())
	t.Cleanup(r.cancel)
	go func() { r.done <- src.Run(ctx, func(m *Measurements) { r.got <- m }) }()
	return r
}

// next waits for the next delivery.
func (r *running) next(what string) *Measurements {
	r.t.Helper()
	select {
	case m := <-r.got:
		return m
	case <-time.After(10 * time.Second):
		r.t.Fatalf("%s: nothing delivered within 10s", what)
		return nil
	}
}

// stop cancels Run and returns what it returned.
func (r *running) stop() error {
	r.t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		return err
	case <-time.After(10 * time.Second):
		r.t.Fatal("Run did not return after cancel")
		return nil
	}
}

func TestRunDeliversAndStops(t *testing.T) {
	t.Parallel()
	prom := &fakeProm{latency: []series{lat("a", "b", "0.010")}, calls: []series{}}
	r := startRun(t, Config{Interval: time.Millisecond}, prom)
	src := r.src
	if m := r.next("first delivery"); m.Latency[Pair{"a", "b"}] != 10 {
		t.Errorf("first delivery: %v", m.Latency)
	}
	if st := src.Status(); !st.OK || !st.Synced {
		t.Errorf("Status: %+v", st)
	}
	prom.set(func(f *fakeProm) { f.latency = []series{lat("a", "b", "0.020")} })
	if m := r.next("second delivery"); m.Latency[Pair{"a", "b"}] != 20 {
		t.Errorf("second delivery: %v", m.Latency)
	}
	// Many rounds later, still nothing new was delivered.
	testkit.Eventually(t, 10*time.Second, "20 latency queries (Run stopped querying)", func() bool {
		return testutil.ToFloat64(src.queries.WithLabelValues(queryLatency, "ok")) >= 20
	})
	if len(r.got) != 0 {
		t.Errorf("%d deliveries of unchanged values", len(r.got))
	}

	if err := r.stop(); err != nil {
		t.Errorf("Run returned %v", err)
	}
	if err := src.Run(context.Background(), func(*Measurements) {}); err == nil {
		t.Error("a second Run should fail")
	}
}

// TestRunTicksOnClock: the rounds after the first come from Config.Clock's ticker, so a fake
// clock stepped by the interval runs a round at once, however long the interval.
func TestRunTicksOnClock(t *testing.T) {
	t.Parallel()
	prom := &fakeProm{latency: []series{lat("a", "b", "0.010")}, calls: []series{}}
	clk := testkit.NewFakeClock(t0)
	r := startRun(t, Config{Interval: time.Hour, Clock: clk}, prom)
	if m := r.next("first round"); !m.At.Equal(t0) {
		t.Errorf("first round at %v, want the fake clock's %v", m.At, t0)
	}
	if !clk.HasWaiters() {
		t.Fatal("Run armed no ticker on Config.Clock")
	}
	prom.set(func(f *fakeProm) { f.latency = []series{lat("a", "b", "0.020")} })
	clk.Step(time.Hour)
	if m := r.next("after one interval on the fake clock"); m.Latency[Pair{"a", "b"}] != 20 || !m.At.Equal(t0.Add(time.Hour)) {
		t.Errorf("second round: latency %v at %v", m.Latency, m.At)
	}
	if err := r.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

func TestRunCancelledMidQueryIsNotAFailure(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	started := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(started) })
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	src, err := NewSource(Config{URL: srv.URL, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(*Measurements) { t.Error("delivered") }) }()
	<-started
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if st := src.Status(); st.OK || st.Synced || !st.Since.IsZero() {
		t.Errorf("a round cut short by cancel changed Status: %+v", st)
	}
	if n := testutil.ToFloat64(src.queries.WithLabelValues(queryLatency, "error")); n != 0 {
		t.Errorf("a query cut short by cancel counted as an error (%v)", n)
	}
}
