package prom

import (
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/model"
)

// loadQueryOf names the pod-load query q is (the defaults, or a custom query naming the same
// metric and reporter).
func loadQueryOf(q string) string {
	switch {
	case strings.Contains(q, "container_cpu"):
		return queryPodCPU
	case strings.Contains(q, "duration") && strings.Contains(q, `reporter="source"`):
		return queryPodDownstream
	case strings.Contains(q, "duration"):
		return queryPodInbound
	}
	return queryPodRequests
}

// podSeries is a pod-load sample of pod ("namespace/name").
func podSeries(pod, value string) series {
	ns, name, _ := strings.Cut(pod, "/")
	return series{labels: map[string]string{"namespace": ns, "pod": name}, value: value}
}

// loadProm is a fake Prometheus with one latency pair and these pod loads, by query name.
func loadProm(load map[string][]series) *fakeProm {
	return &fakeProm{latency: []series{lat("a", "b", "0.010")}, calls: []series{}, load: load}
}

// within1e9 compares floats to 1e-9.
var within1e9 = cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })

func TestPodLoadParsed(t *testing.T) {
	t.Parallel()
	noPod := podSeries("shop/x", "5")
	delete(noPod.labels, "pod")
	prom := loadProm(map[string][]series{
		queryPodRequests: {
			podSeries("shop/api-1", "600"), podSeries("shop/api-2", "300"),
			podSeries("shop/api-2", "20"),  // a second series of a pod: summed
			podSeries("shop/idle", "0"),    // a pod that served nothing in the window
			podSeries("shop/bad", "NaN"),   // ignored, counted
			noPod,                          // ignored, counted
			podSeries("other/api-1", "60"), // another namespace, another pod
		},
		queryPodInbound:    {podSeries("shop/api-1", "3000"), podSeries("shop/api-2", "1600"), podSeries("shop/idle", "0")},
		queryPodDownstream: {podSeries("shop/api-1", "1200")}, // api-2 calls nobody: no series
		queryPodCPU: {
			podSeries("shop/api-1", "3"), podSeries("shop/api-2", "1.5"), podSeries("other/api-1", "0.25"),
			podSeries("kube-system/coredns-1", "9"), // not a pod with requests: dropped, uncounted
			podSeries("shop/api-1-bad", "-1"),       // counted even so: a bad sample is the query's problem
		},
	})
	h := newHarness(t, Config{Window: 30 * time.Second}, prom)
	m := h.mustDeliver("first answer")
	w := 30 * time.Second
	want := []PodLoad{
		{Namespace: "other", Pod: "api-1", Window: w, Requests: 60, CPUSeconds: 0.25},
		{Namespace: "shop", Pod: "api-1", Window: w, Requests: 600, InboundMSSum: 3000, DownstreamMSSum: 1200, CPUSeconds: 3},
		{Namespace: "shop", Pod: "api-2", Window: w, Requests: 320, InboundMSSum: 1600, CPUSeconds: 1.5},
		{Namespace: "shop", Pod: "idle", Window: w},
	}
	if diff := cmp.Diff(want, m.Load, within1e9); diff != "" {
		t.Errorf("pod loads (-want +got):\n%s", diff)
	}
	for _, c := range []struct {
		query, reason string
		want          float64
	}{
		{queryPodRequests, reasonBadValue, 1}, {queryPodRequests, reasonMissingLabel, 1},
		{queryPodCPU, reasonBadValue, 1}, {queryPodCPU, reasonMissingLabel, 0},
		{queryPodInbound, reasonBadValue, 0}, {queryPodDownstream, reasonBadValue, 0},
	} {
		if got := h.metric(h.src.ignored.WithLabelValues(c.query, c.reason)); got != c.want {
			t.Errorf("ignored_samples_total{query=%q,reason=%q} = %v, want %v", c.query, c.reason, got, c.want)
		}
	}
	if !strings.Contains(h.logs.String(), "without its pod labels") || !strings.Contains(h.logs.String(), "ignoring a pod-load value") {
		t.Errorf("no log lines for the ignored pod-load series:\n%s", h.logs.String())
	}
	if strings.Contains(h.logs.String(), "coredns") {
		t.Errorf("a pod without requests was logged:\n%s", h.logs.String())
	}
	if st := h.src.Status(); !st.OK || st.LoadReason != "" {
		t.Errorf("Status: %+v", st)
	}
}

// A failing pod-load query (an HTTP error, a result over the series cap, one not a vector) does
// not fail the round: latency and calls go on, the pods keep their last good loads, Status says
// why; the next good answer replaces them.
func TestPodLoadQueryFailureKeepsLastGood(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(f *fakeProm)
		fix    func(f *fakeProm)
		want   string // in Status.LoadReason
	}{
		{
			name:   "HTTP 500 from the CPU query",
			break_: func(f *fakeProm) { f.loadFail = map[string]bool{queryPodCPU: true} },
			fix:    func(f *fakeProm) { f.loadFail = nil },
			want:   "pod_cpu query",
		},
		{
			name: "requests over the series cap",
			break_: func(f *fakeProm) {
				f.load[queryPodRequests] = append(f.load[queryPodRequests], podSeries("shop/c", "1"), podSeries("shop/d", "1"))
			},
			fix:  func(f *fakeProm) { f.load[queryPodRequests] = f.load[queryPodRequests][:2] },
			want: "more than the cap of 3",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			prom := loadProm(map[string][]series{
				queryPodRequests: {podSeries("shop/a", "100"), podSeries("shop/b", "200")},
				queryPodCPU:      {podSeries("shop/a", "1"), podSeries("shop/b", "2")},
			})
			h := newHarness(t, Config{MaxSeries: 3}, prom)
			first := h.mustDeliver("first answer")

			prom.set(tt.break_)
			prom.set(func(f *fakeProm) { f.latency = []series{lat("a", "b", "0.030")} }) // a change to deliver
			h.advance(2 * time.Second)
			m := h.mustDeliver("latency changed while a pod-load query fails")
			if m.Latency[Pair{"a", "b"}] != 30 {
				t.Errorf("latency %v, want a→b 30 ms", m.Latency)
			}
			kept := slices.Clone(first.Load)
			for i := range kept {
				kept[i].Stale = true
			}
			if diff := cmp.Diff(kept, m.Load); diff != "" {
				t.Errorf("pod loads while a query fails, want the last good ones, stale (-want +got):\n%s", diff)
			}
			st := h.src.Status()
			if !st.OK || !strings.Contains(st.LoadReason, tt.want) || !strings.HasPrefix(st.LoadReason, ErrQuery.Error()) {
				t.Errorf("Status while a pod-load query fails: %+v; want OK and LoadReason naming %q", st, tt.want)
			}
			h.advance(2 * time.Second)
			h.mustNotDeliver("still failing, nothing else changed")
			if n := h.logs.count("pod-load queries failed"); n != 1 {
				t.Errorf("%d log lines for the failure after two rounds, want 1", n)
			}

			prom.set(tt.fix)
			prom.set(func(f *fakeProm) { f.load[queryPodCPU] = []series{podSeries("shop/a", "4"), podSeries("shop/b", "2")} })
			h.advance(2 * time.Second)
			m = h.mustDeliver("recovered with a new CPU use")
			if len(m.Load) != 2 || m.Load[0].CPUSeconds != 4 || m.Load[0].Stale {
				t.Errorf("pod loads after recovery: %+v", m.Load)
			}
			if st := h.src.Status(); !st.OK || st.LoadReason != "" {
				t.Errorf("Status after recovery: %+v", st)
			}
		})
	}
}

// A pod whose series vanish keeps its last good load, stale, until StaleAfter; then it is
// forgotten with all its values.
func TestPodLoadStaleThenForgotten(t *testing.T) {
	t.Parallel()
	prom := loadProm(map[string][]series{
		queryPodRequests: {podSeries("shop/a", "100"), podSeries("shop/b", "200")},
		queryPodInbound:  {podSeries("shop/a", "500"), podSeries("shop/b", "800")},
		queryPodCPU:      {podSeries("shop/a", "1"), podSeries("shop/b", "2")},
	})
	h := newHarness(t, Config{StaleAfter: time.Minute, Window: time.Minute}, prom)
	first := h.mustDeliver("first answer")

	// b's CPU vanishes (a cAdvisor scrape missed): b is kept whole, stale.
	prom.set(func(f *fakeProm) { f.load[queryPodCPU] = f.load[queryPodCPU][:1] })
	h.advance(10 * time.Second)
	h.mustNotDeliver("a series went stale")
	if n := h.metric(h.src.stale.WithLabelValues(queryPodCPU)); n != 1 {
		t.Errorf("stale pod_cpu series = %v, want 1", n)
	}
	// b vanishes from the requests too; a's load changes, so the round is delivered.
	prom.set(func(f *fakeProm) {
		f.load[queryPodRequests] = []series{podSeries("shop/a", "200")}
		f.load[queryPodInbound] = []series{podSeries("shop/a", "1000")}
	})
	h.advance(10 * time.Second)
	m := h.mustDeliver("a's load doubled")
	want := []PodLoad{
		{Namespace: "shop", Pod: "a", Window: time.Minute, Requests: 200, InboundMSSum: 1000, CPUSeconds: 1},
		{Namespace: "shop", Pod: "b", Window: time.Minute, Requests: 200, InboundMSSum: 800, CPUSeconds: 2, Stale: true},
	}
	if diff := cmp.Diff(want, m.Load); diff != "" {
		t.Errorf("pod loads with b stale (-want +got):\n%s", diff)
	}
	if first.Load[1].Stale {
		t.Error("a delivered snapshot changed")
	}

	// StaleAfter after b was last seen it is forgotten: the pod set changed, a delivery.
	h.advance(50 * time.Second) // 60 s since the requests of b were last seen (t0 + 10 s)
	m = h.mustDeliver("b forgotten")
	if len(m.Load) != 1 || m.Load[0].Pod != "a" {
		t.Errorf("pod loads after StaleAfter: %+v", m.Load)
	}
	for sig, known := range h.src.load {
		if _, ok := known[PodRef{"shop", "b"}]; ok {
			t.Errorf("%s still holds the forgotten pod b", loadQueryNames[sig])
		}
	}
	if n := h.metric(h.src.stale.WithLabelValues(queryPodCPU)); n != 0 {
		t.Errorf("stale pod_cpu series = %v after b was forgotten, want 0", n)
	}
}

func TestPodLoadHysteresis(t *testing.T) {
	t.Parallel()
	// A 10 s window; api served 1,000 requests (100 rps) of 5 ms each, 2 ms waiting on callees,
	// and used 5 CPU-seconds (0.5 cores).
	base := map[string]string{queryPodRequests: "1000", queryPodInbound: "5000", queryPodDownstream: "2000", queryPodCPU: "5"}
	tests := []struct {
		name        string
		query, next string
		wantDeliver bool
	}{
		{"request rate within relative", queryPodRequests, "1040", false},         // +4 rps of 100: under 5 %
		{"request rate beyond both", queryPodRequests, "1060", true},              // +6 rps, 6 %
		{"CPU within absolute", queryPodCPU, "5.09", false},                       // +0.009 cores
		{"CPU beyond both", queryPodCPU, "5.5", true},                             // +0.05 cores, 10 %
		{"inbound mean within absolute", queryPodInbound, "5400", false},          // 5.4 ms: +0.4 ms
		{"inbound mean beyond both", queryPodInbound, "6000", true},               // 6 ms
		{"downstream mean beyond both", queryPodDownstream, "2600", true},         // 2.6 ms: +0.6 ms, 30 %
		{"request rate and inbound mean within", queryPodRequests, "1030", false}, // the mean moves with the requests (5000/1030)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			load := map[string][]series{}
			for q, v := range base {
				load[q] = []series{podSeries("shop/api", v)}
			}
			prom := loadProm(load)
			h := newHarness(t, Config{Window: 10 * time.Second}, prom)
			h.mustDeliver("first answer")
			prom.set(func(f *fakeProm) { f.load[tt.query] = []series{podSeries("shop/api", tt.next)} })
			h.advance(2 * time.Second)
			got := h.round()
			if (got != nil) != tt.wantDeliver {
				t.Errorf("delivered = %v, want %v", got != nil, tt.wantDeliver)
			}
			if !tt.wantDeliver && h.metric(h.src.suppressed) != 1 {
				t.Errorf("suppressed_changes_total = %v, want 1", h.metric(h.src.suppressed))
			}
		})
	}
}

func TestPodLoadQueriesOff(t *testing.T) {
	t.Parallel()
	prom := loadProm(map[string][]series{
		queryPodRequests: {podSeries("shop/a", "100")},
		queryPodInbound:  {podSeries("shop/a", "500")},
		queryPodCPU:      {podSeries("shop/a", "1")},
	})
	h := newHarness(t, Config{Window: time.Minute, PodInboundQuery: DisableLoad, PodDownstreamQuery: DisableLoad, CallsQuery: DisableCalls}, prom)
	m := h.mustDeliver("first answer")
	want := []PodLoad{{Namespace: "shop", Pod: "a", Window: time.Minute, Requests: 100, CPUSeconds: 1}}
	if diff := cmp.Diff(want, m.Load); diff != "" {
		t.Errorf("pod loads with inbound and downstream off (-want +got):\n%s", diff)
	}
	var sent []string
	for _, r := range prom.requests() {
		if q := r.Get("query"); strings.Contains(q, "by (namespace, pod") {
			sent = append(sent, loadQueryOf(q))
		}
	}
	if diff := cmp.Diff([]string{queryPodRequests, queryPodCPU}, sent); diff != "" {
		t.Errorf("pod-load queries sent (-want +got):\n%s", diff)
	}
}

// Pod loads kept through failing pod-load queries expire StaleAfter after they were last seen.
func TestPodLoadFailingQueryExpires(t *testing.T) {
	t.Parallel()
	prom := loadProm(map[string][]series{queryPodRequests: {podSeries("shop/a", "100")}, queryPodCPU: {podSeries("shop/a", "1")}})
	h := newHarness(t, Config{StaleAfter: time.Minute}, prom)
	h.mustDeliver("first answer")
	prom.set(func(f *fakeProm) { f.loadFail = map[string]bool{queryPodRequests: true} })
	h.advance(30 * time.Second)
	h.mustNotDeliver("failing: the loads are kept, stale")
	if n := h.metric(h.src.stale.WithLabelValues(queryPodRequests)); n != 1 {
		t.Errorf("stale pod_requests series = %v while its query fails, want 1", n)
	}
	if n := h.metric(h.src.stale.WithLabelValues(queryPodCPU)); n != 0 {
		t.Errorf("stale pod_cpu series = %v: its query answers, want 0", n)
	}
	h.advance(30 * time.Second)
	m := h.mustDeliver("failing for StaleAfter: the loads are forgotten")
	if len(m.Load) != 0 || m.Latency[Pair{"a", "b"}] != 10 {
		t.Errorf("after StaleAfter of failures: loads %+v, latency %v", m.Load, m.Latency)
	}
	if n := h.metric(h.src.stale.WithLabelValues(queryPodRequests)); n != 0 {
		t.Errorf("stale pod_requests series = %v after they were forgotten, want 0", n)
	}
}

// While there are pod loads, a snapshot is delivered once per window even when nothing moved
// beyond hysteresis: each window is one more sample for the capacity estimate.
func TestPodLoadDeliveredEachWindow(t *testing.T) {
	t.Parallel()
	prom := loadProm(map[string][]series{queryPodRequests: {podSeries("shop/a", "100")}})
	h := newHarness(t, Config{Window: 10 * time.Second}, prom)
	first := h.mustDeliver("first answer")
	h.advance(8 * time.Second)
	h.mustNotDeliver("the same loads within the window")
	h.advance(2 * time.Second)
	m := h.mustDeliver("the same loads a window later")
	if !m.At.Equal(first.At.Add(10*time.Second)) || len(m.Load) != 1 {
		t.Errorf("delivered at %v with loads %+v", m.At, m.Load)
	}
	h.advance(2 * time.Second)
	h.mustNotDeliver("the next window has not passed")

	// Without pod loads, no such delivery.
	h2 := newHarness(t, Config{Window: 10 * time.Second, StaleAfter: time.Second}, loadProm(nil))
	h2.mustDeliver("first answer")
	h2.advance(20 * time.Second)
	h2.mustNotDeliver("nothing changed, no pod loads")
}

// FuzzParseLoad: whatever the pod-load vectors hold, every load kept names its pod and has a
// finite, non-negative value, the sum of that pod's good samples.
func FuzzParseLoad(f *testing.F) {
	f.Add("shop", "api-1", 12.5, "shop", "api-1", 7.5, uint8(0))
	f.Add("", "api-1", math.NaN(), "shop", "", math.Inf(1), uint8(3))
	f.Add("shop", "api-1", -1.0, "shop", "api-2", 1e308, uint8(1))
	src, err := NewSource(Config{URL: "http://prometheus.invalid:9090", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ns1, pod1 string, v1 float64, ns2, pod2 string, v2 float64, sig uint8) {
		sample := func(ns, pod string, v float64) *model.Sample {
			return &model.Sample{Metric: model.Metric{LabelNamespace: model.LabelValue(ns), LabelPod: model.LabelValue(pod)}, Value: model.SampleValue(v)}
		}
		var vecs [loadSignals]model.Vector
		vecs[int(sig)%int(loadSignals)] = model.Vector{sample(ns1, pod1, v1), sample(ns2, pod2, v2)}
		good := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) && v >= 0 }
		want := map[PodRef]float64{}
		for _, s := range []struct {
			ns, pod string
			v       float64
		}{{ns1, pod1, v1}, {ns2, pod2, v2}} {
			if s.ns != "" && s.pod != "" && good(s.v) {
				want[PodRef{s.ns, s.pod}] += s.v
			}
		}
		out, _ := src.parseLoad(vecs, time.Minute, map[string]bool{})
		got := out[int(sig)%int(loadSignals)]
		if len(got) != len(want) {
			t.Fatalf("%d pods kept, want %d: %v", len(got), len(want), got)
		}
		for p, lg := range got {
			if p.Namespace == "" || p.Name == "" || math.IsNaN(lg.value) || lg.value < 0 || lg.window != time.Minute {
				t.Errorf("kept %v: %+v", p, lg)
			}
			if w := want[p]; lg.value != w && !(math.IsInf(w, 1) && math.IsInf(lg.value, 1)) {
				t.Errorf("%v: %v, want %v", p, lg.value, w)
			}
		}
	})
}

// BenchmarkLoadRound: one round's pod-load work for 10,000 mesh pods (and as many more pods'
// CPU series, dropped): parse the four vectors, merge them into the last good values, list the
// loads.
func BenchmarkLoadRound(b *testing.B) {
	src, err := NewSource(Config{URL: "http://prometheus.invalid:9090", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	const pods = 10_000
	var vecs [loadSignals]model.Vector
	for i := range pods {
		for sig := range loadSignals {
			m := model.Metric{LabelNamespace: "shop", LabelPod: model.LabelValue(fmt.Sprintf("pod-%05d", i))}
			vecs[sig] = append(vecs[sig], &model.Sample{Metric: m, Value: model.SampleValue(100 + i%7)})
		}
		m := model.Metric{LabelNamespace: "other", LabelPod: model.LabelValue(fmt.Sprintf("pod-%05d", i))}
		vecs[loadCPU] = append(vecs[loadCPU], &model.Sample{Metric: m, Value: 1})
	}
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(2 * time.Second)
		fresh, contested := src.parseLoad(vecs, time.Minute, map[string]bool{})
		src.mergeLoad(fresh, contested, now)
		if n := len(src.loads()); n != pods {
			b.Fatalf("%d loads, want %d", n, pods)
		}
	}
}
