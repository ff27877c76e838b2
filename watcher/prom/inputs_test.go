package prom

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func success(from, to, ratio string) series {
	return series{labels: map[string]string{"source_node": from, "target_node": to}, value: ratio}
}

// No query result and no rule turns a missing or failed measurement into 0 ms: a lost probe
// is not a fast one.
func TestLossNeverReadsAsZero(t *testing.T) {
	t.Parallel()
	prom := &fakeProm{
		latency: []series{
			lat("a", "b", "0.010"), // 20 % lost: the RTT of the answered probes stands
			lat("a", "c", "0.040"), // 60 % lost: unreachable
			lat("a", "d", "NaN"),   // every probe lost (a custom query's 0/0; the default has no series)
			lat("a", "e", "0.005"), // an RTT without a success ratio: not measured
			lat("b", "a", "NaN"),   // no RTT, and the probes say they were answered: not measured
		},
		success: []series{success("a", "b", "0.8"), success("a", "c", "0.4"), success("a", "d", "0"), success("b", "a", "1")},
	}
	h := newHarness(t, Config{}, prom)
	m := h.mustDeliver("first answer")
	want := &Measurements{
		Latency:     map[Pair]float64{{"a", "b"}: 10, {"a", "c"}: DefaultUnreachableMS, {"a", "d"}: DefaultUnreachableMS},
		Loss:        map[Pair]float64{{"a", "b"}: 0.2, {"a", "c"}: 0.6, {"a", "d"}: 1},
		Unreachable: map[Pair]bool{{"a", "c"}: true, {"a", "d"}: true},
	}
	approx := cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })
	for name, d := range map[string]string{
		"latency":     cmp.Diff(want.Latency, m.Latency, approx),
		"loss":        cmp.Diff(want.Loss, m.Loss, approx),
		"unreachable": cmp.Diff(want.Unreachable, m.Unreachable),
	} {
		if d != "" {
			t.Errorf("%s (-want +got):\n%s", name, d)
		}
	}
	for p, v := range m.Latency {
		if v == 0 {
			t.Errorf("%v reads 0 ms", p)
		}
	}
	if got := h.metric(h.src.unreachable); got != 2 {
		t.Errorf("edgeflow_prometheus_unreachable_pairs = %v, want 2", got)
	}
	if got := h.metric(h.src.ignored.WithLabelValues(queryLatency, reasonIncomplete)) + h.metric(h.src.ignored.WithLabelValues(querySuccess, reasonIncomplete)); got != 2 {
		t.Errorf("incomplete pairs counted %v, want 2 (a→e, b→a)", got)
	}
	if d := DescribeUnreachable(m, 0); d != "a→c (loss 60%), a→d (loss 100%)" {
		t.Errorf("DescribeUnreachable: %q", d)
	}
	// Logged once per change of the set, not per round nor per change of the loss.
	h.advance(2 * time.Second)
	h.mustNotDeliver("the same answer")
	prom.set(func(f *fakeProm) { f.success[1] = success("a", "c", "0.3") })
	h.advance(2 * time.Second)
	h.round()
	if n := h.logs.count("node pairs unreachable"); n != 1 {
		t.Errorf("%d log lines about unreachable pairs after two identical rounds, want 1:\n%s", n, h.logs.String())
	}
	// The pair recovers: a change, delivered, logged.
	prom.set(func(f *fakeProm) { f.success[1] = success("a", "c", "1") })
	h.advance(2 * time.Second)
	m = h.mustDeliver("a→c answers again")
	if m.Unreachable[Pair{"a", "c"}] || m.Latency[Pair{"a", "c"}] != 40 {
		t.Errorf("after recovery: latency %v, unreachable %v", m.Latency, m.Unreachable)
	}
	if n := h.logs.count("node pairs unreachable"); n != 2 {
		t.Errorf("%d log lines about unreachable pairs after a change, want 2", n)
	}

	// Without a success query, a NaN RTT is still not 0 ms: the pair is not measured.
	h2 := newHarness(t, Config{SuccessQuery: DisableSuccess}, &fakeProm{latency: []series{lat("a", "b", "NaN"), lat("a", "c", "0.003")}})
	m = h2.mustDeliver("first answer")
	if diff := cmp.Diff(map[Pair]float64{{"a", "c"}: 3}, m.Latency, approx); diff != "" {
		t.Errorf("without a success query (-want +got):\n%s", diff)
	}
}

// Of a pair reported by both sides only the caller's report counts; a caller without a
// sidecar is seen through the callee's.
func TestCallReportersDeduplicated(t *testing.T) {
	t.Parallel()
	rep := func(reporter, from, to, rps string) series {
		s := call(from, to, rps)
		s.labels["reporter"] = reporter
		return s
	}
	prom := &fakeProm{calls: []series{
		rep("source", "shop/web", "shop/api", "100"),
		rep("destination", "shop/web", "shop/api", "98"), // the same requests, seen by the callee
		rep("destination", "shop/proxyless", "shop/api", "30"),
		rep("destination", "shop/proxyless", "shop/api", "5"), // a second series: summed
		rep("waypoint", "shop/x", "shop/api", "7"),            // unknown: ignored
	}}
	h := newHarness(t, Config{}, prom)
	m := h.mustDeliver("first answer")
	want := []CallRate{
		{From: Workload{"proxyless", "shop"}, To: Workload{"api", "shop"}, RPS: 35},
		{From: Workload{"web", "shop"}, To: Workload{"api", "shop"}, RPS: 100},
	}
	if diff := cmp.Diff(want, m.Calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

// A response over the size or series cap fails its query's signal with an error naming the
// query; the other signals flow (the calls here).
func TestResponseCaps(t *testing.T) {
	t.Parallel()
	many := []series{}
	for i := range 20 {
		many = append(many, lat("a", fmt.Sprint("n", i), "0.001"))
	}
	for _, tt := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"series", Config{MaxSeries: 10}, "latency query"},
		{"bytes", Config{MaxResponseBytes: 1000}, "response too large"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.cfg, &fakeProm{latency: many, calls: []series{call("shop/a", "shop/b", "5")}})
			m := h.mustDeliver("the latency query over the cap, the calls flowing")
			if len(m.Latency) != 0 || len(m.Calls) != 1 || m.Calls[0].RPS != 5 {
				t.Errorf("delivered latency %v, calls %v: want no latency and the call rate", m.Latency, m.Calls)
			}
			st := h.src.Status()
			if st.OK || !strings.Contains(st.Reason, tt.want) || !strings.Contains(st.Reason, "latency query") {
				t.Errorf("Status: %+v, want a failure naming the latency query and %q", st, tt.want)
			}
		})
	}
}

// A password in the URL reaches Prometheus but no log line, error or Status.
func TestPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-Pa55"
	var gotUser, gotPass string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotUser, gotPass, _ = r.BasicAuth()
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	t.Cleanup(srv.Close)
	h := newHarness(t, Config{URL: strings.Replace(srv.URL, "http://", "http://edgeflow:"+secret+"@", 1)}, &fakeProm{})
	h.mustNotDeliver("a failing Prometheus")
	if gotUser != "edgeflow" || gotPass != secret {
		t.Errorf("basic auth sent: %q %q", gotUser, gotPass)
	}
	st := h.src.Status()
	if st.OK || !strings.Contains(st.Reason, "xxxxx") {
		t.Errorf("Status: %+v, want a failure naming the redacted URL", st)
	}
	for what, s := range map[string]string{"Status": st.Reason, "logs": h.logs.String(), "URL()": h.src.URL()} {
		if strings.Contains(s, secret) {
			t.Errorf("the password appears in %s: %s", what, s)
		}
	}
	if _, err := NewSource(Config{URL: "ftp://u:" + secret + "@p"}); err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("NewSource error: %v", err)
	}
}

// The window, and the latency query's subquery step, follow the probe job's scrape interval
// read from Prometheus's targets API.
func TestWindowFollowsScrapeInterval(t *testing.T) {
	t.Parallel()
	fake := &fakeProm{latency: []series{lat("a", "b", "0.002")}}
	mux := http.NewServeMux()
	mux.Handle("/api/v1/query", fake)
	targets := func(job, interval string) map[string]any {
		return map[string]any{"labels": map[string]string{"job": job}, "scrapeInterval": interval}
	}
	mux.HandleFunc("/api/v1/targets", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"activeTargets": []any{
			targets("kubernetes-pods", "5s"), targets(DefaultProbeJob, "30s"), targets(DefaultProbeJob, "15s"),
		}}})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	h := newHarness(t, Config{URL: srv.URL}, fake)
	m := h.mustDeliver("first answer")
	if m.Window != 2*time.Minute {
		t.Errorf("window %v, want 4 × 30s", m.Window)
	}
	if q := fake.requests()[0].Get("query"); !strings.Contains(q, "[2m:30s]") {
		t.Errorf("latency query sent: %s, want the window and the subquery step [2m:30s]", q)
	}
	if st := h.src.Status(); st.ScrapeInterval != 30*time.Second || st.ScrapeIntervalFrom != "prometheus" {
		t.Errorf("Status: %+v", st)
	}
	// Set by configuration, nothing is asked.
	h2 := newHarness(t, Config{URL: srv.URL, ScrapeInterval: time.Second}, fake)
	if m := h2.mustDeliver("first answer"); m.Window != 4*time.Second {
		t.Errorf("window %v with a 1s scrape interval, want 4s", m.Window)
	}
}
