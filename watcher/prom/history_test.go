package prom

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// historyTimes lists the evaluation times (the time parameter) of the pod-load queries fp
// received, in the order first asked.
func historyTimes(t *testing.T, fp *fakeProm) []time.Time {
	t.Helper()
	var out []time.Time
	for _, r := range fp.requests() {
		ts := r.Get("time")
		if ts == "" || !strings.Contains(r.Get("query"), "by (namespace, pod") {
			continue
		}
		sec, err := strconv.ParseFloat(ts, 64)
		if err != nil {
			t.Fatalf("time parameter %q: %v", ts, err)
		}
		at := time.Unix(int64(sec), 0).UTC()
		if !slices.ContainsFunc(out, at.Equal) {
			out = append(out, at)
		}
	}
	return out
}

// liveState is a copy of what a Source's rounds keep between them.
type liveState struct {
	load          [loadSignals]map[PodRef]lastGood
	contestedLoad [loadSignals]map[PodRef]bool
	reported      map[string]bool
	delivered     *Measurements
	status        Status
}

func liveStateOf(s *Source) liveState {
	st := liveState{reported: maps.Clone(s.reported), delivered: s.delivered, status: s.Status()}
	for sig := range loadSignals {
		st.load[sig], st.contestedLoad[sig] = maps.Clone(s.load[sig]), maps.Clone(s.contestedLoad[sig])
	}
	return st
}

// TestLoadHistory: the history's windows are the pod-load queries evaluated at past times, one
// window apart, returned oldest first, read by the live rules (a contested pod left out of its
// window, an ignored series logged once, pods outside the namespaces not read), and the live
// state is untouched: the next live round sees no change.
func TestLoadHistory(t *testing.T) {
	t.Parallel()
	const w = 10 * time.Second
	noPod := podSeries("shop/x", "5")
	delete(noPod.labels, "pod")
	scrape := func(s series, instance string) series {
		s.labels["job"], s.labels["instance"] = "kubernetes-pods", instance
		return s
	}
	// window k of history (evaluation time t0 − k·w): a served 100·(4−k) requests; c 10.
	window := func(k int) map[string][]series {
		n := 100 * (4 - k)
		return map[string][]series{
			queryPodRequests: {podSeries("shop/a", strconv.Itoa(n)), podSeries("shop/c", "10"), podSeries("other/x", "50"), noPod},
			queryPodInbound:  {podSeries("shop/a", strconv.Itoa(5*n))},
			queryPodCPU:      {podSeries("shop/a", strconv.Itoa(n/100)), podSeries("shop/c", "1")},
		}
	}
	fp := loadProm(map[string][]series{queryPodRequests: {podSeries("shop/a", "1000")}, queryPodCPU: {podSeries("shop/a", "10")}})
	fp.loadAt = map[time.Time]map[string][]series{}
	for k := range 4 { // nothing at t0 − 4w: Prometheus's history is shorter than asked
		fp.loadAt[t0.Add(-time.Duration(k)*w)] = window(k)
	}
	// At t0 − w, c's CPU comes from two scrapes: contested, left out of that window.
	fp.loadAt[t0.Add(-w)][queryPodCPU] = []series{podSeries("shop/a", "3"), scrape(podSeries("shop/c", "1"), "10.0.0.3:15020"), scrape(podSeries("shop/c", "1"), "10.0.0.66:15020")}
	fp.loadAt[t0][queryPodDownstream] = []series{podSeries("shop/a", "7")}

	h := newHarness(t, Config{Window: w, Namespaces: []string{"shop"}}, fp)
	h.mustDeliver("the first live round")
	before := liveStateOf(h.src)
	ignored := h.metric(h.src.ignored.WithLabelValues(queryPodRequests, reasonMissingLabel))

	got, err := h.src.LoadHistory(context.Background(), 5)
	if err != nil {
		t.Fatal(err)
	}
	at := func(k int) time.Time { return t0.Add(-time.Duration(k) * w) }
	a := func(n float64) PodLoad {
		return PodLoad{Namespace: "shop", Pod: "a", Window: w, Requests: n, InboundMSSum: 5 * n, CPUSeconds: n / 100}
	}
	c := PodLoad{Namespace: "shop", Pod: "c", Window: w, Requests: 10, CPUSeconds: 1}
	newest := a(400)
	newest.DownstreamMSSum = 7
	want := []*Measurements{
		{Load: []PodLoad{a(100), c}, Window: w, At: at(3)},
		{Load: []PodLoad{a(200), c}, Window: w, At: at(2)},
		{Load: []PodLoad{a(300)}, Window: w, At: at(1)}, // c contested
		{Load: []PodLoad{newest, c}, Window: w, At: at(0)},
	}
	if diff := cmp.Diff(want, got, within1e9); diff != "" {
		t.Errorf("history (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]time.Time{at(0), at(1), at(2), at(3), at(4)}, historyTimes(t, fp)); diff != "" {
		t.Errorf("evaluation times asked, newest first (-want +got):\n%s", diff)
	}
	for _, r := range fp.requests() {
		if q := r.Get("query"); r.Has("time") && !strings.Contains(q, "[10s]") {
			t.Errorf("a history query without the window: %s", q)
		}
	}
	if n := h.metric(h.src.ignored.WithLabelValues(queryPodRequests, reasonMissingLabel)) - ignored; n != 4 {
		t.Errorf("ignored_samples_total{pod_requests, missing label} grew by %v over the history, want 4 (one a window)", n)
	}
	if n := h.logs.count("without its pod labels"); n != 1 {
		t.Errorf("the ignored series was logged %d times, want once:\n%s", n, h.logs)
	}

	after := liveStateOf(h.src)
	if diff := cmp.Diff(before, after, cmp.AllowUnexported(liveState{}, lastGood{}), within1e9); diff != "" {
		t.Errorf("LoadHistory changed the live state (-before +after):\n%s", diff)
	}
	h.advance(2 * time.Second)
	h.mustNotDeliver("the live round after the history: nothing changed")
}

// TestLoadHistoryBestEffort: a window without pod loads is left out; a failing query ends the
// reading (the older windows are not asked); loads off or no windows ask nothing; the window
// follows the probe job's scrape interval when it is not set.
func TestLoadHistoryBestEffort(t *testing.T) {
	t.Parallel()
	const w = 10 * time.Second
	at := func(k int, w time.Duration) time.Time { return t0.Add(-time.Duration(k) * w) }
	loads := func(n string) map[string][]series {
		return map[string][]series{queryPodRequests: {podSeries("shop/a", n)}, queryPodCPU: {podSeries("shop/a", "1")}}
	}
	tests := []struct {
		name      string
		cfg       Config
		windows   int
		history   []int // the windows (k: at t0 − k·w) Prometheus has
		fail      int   // a window whose queries fail (-1: none)
		targets   []any
		wantAt    []int // the windows returned, as k
		wantAsked []int // the windows asked, as k
		wantW     time.Duration
		wantLog   string
	}{
		{name: "a window without pod loads", cfg: Config{Window: w}, windows: 4, history: []int{0, 2, 3}, fail: -1,
			wantAt: []int{3, 2, 0}, wantAsked: []int{0, 1, 2, 3}, wantW: w},
		{name: "a failing query ends the reading", cfg: Config{Window: w}, windows: 5, history: []int{0, 1, 2, 3, 4}, fail: 2,
			wantAt: []int{1, 0}, wantAsked: []int{0, 1, 2}, wantW: w, wantLog: "cannot read the pod loads' history"},
		{name: "the probe job's scrape interval", cfg: Config{}, windows: 3, history: []int{0, 1, 2}, fail: -1,
			targets: []any{probeTarget("a", "b", "10.0.0.2")}, // 15 s: a window of 1 m
			wantAt:  []int{2, 1, 0}, wantAsked: []int{0, 1, 2}, wantW: WindowScrapes * 15 * time.Second},
		{name: "pod loads off", cfg: Config{Window: w, PodRequestsQuery: DisableLoad}, windows: 5, history: []int{0, 1}, fail: -1, wantW: w},
		{name: "no windows", cfg: Config{Window: w}, windows: 0, history: []int{0, 1}, fail: -1, wantW: w},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fp := loadProm(nil)
			fp.targets = tt.targets
			fp.loadAt, fp.failAt = map[time.Time]map[string][]series{}, map[time.Time]bool{}
			for _, k := range tt.history {
				fp.loadAt[at(k, tt.wantW)] = loads(strconv.Itoa(100 * (k + 1)))
			}
			if tt.fail >= 0 {
				fp.failAt[at(tt.fail, tt.wantW)] = true
			}
			h := newHarness(t, tt.cfg, fp)
			got, err := h.src.LoadHistory(context.Background(), tt.windows)
			if err != nil {
				t.Fatal(err)
			}
			var gotAt []int
			for _, m := range got {
				k := int(t0.Sub(m.At) / tt.wantW)
				if !m.At.Equal(at(k, tt.wantW)) || m.Window != tt.wantW || len(m.Load) != 1 || m.Load[0].Requests != float64(100*(k+1)) || m.Load[0].Window != tt.wantW {
					t.Errorf("window at %v: %+v; want window %v, a's load of t0 − %d windows", m.At, m, tt.wantW, k)
				}
				gotAt = append(gotAt, k)
			}
			if diff := cmp.Diff(tt.wantAt, gotAt); diff != "" {
				t.Errorf("windows returned, as k in t0 − k·w (-want +got):\n%s", diff)
			}
			var asked []int
			for _, ts := range historyTimes(t, fp) {
				asked = append(asked, int(t0.Sub(ts)/tt.wantW))
			}
			if diff := cmp.Diff(tt.wantAsked, asked); diff != "" {
				t.Errorf("windows asked (-want +got):\n%s", diff)
			}
			if tt.wantLog != "" && h.logs.count(tt.wantLog) != 1 {
				t.Errorf("want one log line %q:\n%s", tt.wantLog, h.logs)
			}
			if st := h.src.Status(); st.Synced || st.LoadReason != "" {
				t.Errorf("Status after the history: %+v, want untouched (no round yet)", st)
			}
		})
	}
}

func TestLoadHistoryMisuse(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{}, loadProm(nil))
	if _, err := h.src.LoadHistory(context.Background(), -1); err == nil || !strings.Contains(err.Error(), "-1 windows") {
		t.Errorf("LoadHistory(-1): %v, want an error naming -1 windows", err)
	}
	h.src.running.Store(true) // as Run does
	if _, err := h.src.LoadHistory(context.Background(), 5); err == nil || !strings.Contains(err.Error(), "after Run") {
		t.Errorf("LoadHistory once Run started: %v, want an error", err)
	}
	if n := len(h.prom.requests()); n != 0 {
		t.Errorf("%d requests sent, want none", n)
	}
}

// TestLoadHistoryAttempts: with the call-attempt queries on, each window of history has its
// attempts (evaluated at the window's time); a failing call-attempt query leaves its window
// without them, saying so, and the reading goes on.
func TestLoadHistoryAttempts(t *testing.T) {
	t.Parallel()
	const w = 10 * time.Second
	fp := loadProm(map[string][]series{queryPodRequests: {podSeries("shop/api-1", "100")}})
	fp.loadAt = map[time.Time]map[string][]series{
		t0:         {queryPodRequests: {podSeries("shop/api-1", "100")}},
		t0.Add(-w): {queryPodRequests: {podSeries("shop/api-1", "90")}},
	}
	fp.attempts = map[string][]series{
		queryAttempts:       {attemptSeries("shop/web-1", "xds:///api.shop", bandN1, "60")},
		queryAttemptSeconds: {attemptSeries("shop/web-1", "xds:///api.shop", bandN1, "0.3")},
	}
	h := newHarness(t, Config{Window: w, AttemptsQuery: DefaultAttemptsQuery}, fp)
	got, err := h.src.LoadHistory(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []Attempt{{Namespace: "shop", Pod: "web-1", Target: "xds:///api.shop", Locality: bandN1, Attempts: 60, Seconds: 0.3}}
	if len(got) != 2 {
		t.Fatalf("%d windows of history, want 2", len(got))
	}
	for _, m := range got {
		if diff := cmp.Diff(want, m.Attempts, within1e9); diff != "" || !m.AttemptsRead {
			t.Errorf("window at %v: attempts read %v (-want +got):\n%s", m.At, m.AttemptsRead, diff)
		}
	}
	asked := 0
	for _, r := range fp.requests() {
		if r.Has("time") && strings.Contains(r.Get("query"), "grpc_client_attempt") {
			asked++
		}
	}
	if asked != 4 {
		t.Errorf("%d call-attempt queries at past times, want 4 (2 windows × count and sum)", asked)
	}

	fp.set(func(f *fakeProm) { f.attemptErr = true })
	h2 := newHarness(t, Config{Window: w, AttemptsQuery: DefaultAttemptsQuery}, fp)
	got, err = h2.src.LoadHistory(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].AttemptsRead || got[1].AttemptsRead || got[0].Attempts != nil || len(got[1].Load) != 1 {
		t.Errorf("history with the call-attempt queries failing: %+v, want 2 windows of loads without attempts", got)
	}
}
