package prom

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// attemptSeries is a call-attempt sample of caller pod ("namespace/name") to target at locality.
func attemptSeries(pod, target, locality, value string) series {
	ns, name, _ := strings.Cut(pod, "/")
	return series{labels: map[string]string{"namespace": ns, "pod": name, LabelGRPCTarget: target, LabelGRPCLocality: locality}, value: value}
}

var (
	bandN1 = Locality{Zone: "n1", SubZone: "edgeflow/band"}.String()
	bandN2 = Locality{Zone: "n2", SubZone: "edgeflow/band"}.String()
)

// The call-attempt queries, on when AttemptsQuery is set: each caller pod's attempts to a target
// at a locality, paired with their summed seconds; a series without its labels or with a bad
// value is ignored and counted; a caller outside the managed namespaces is dropped; a count
// without a sum, or with none, is left out.
func TestAttemptsParsed(t *testing.T) {
	t.Parallel()
	noTarget := attemptSeries("shop/web-1", "", bandN1, "5")
	fp := loadProm(nil)
	fp.attempts = map[string][]series{
		queryAttempts: {
			attemptSeries("shop/web-1", "xds:///api", bandN1, "600"),
			attemptSeries("shop/web-1", "xds:///api", bandN2, "300"),
			attemptSeries("shop/web-1", "xds:///api", bandN2, "20"),  // a second series: summed
			attemptSeries("shop/web-2", "xds:///api", bandN1, "0"),   // none in the window: left out
			attemptSeries("shop/web-3", "xds:///api", bandN1, "10"),  // no sum: left out
			attemptSeries("shop/web-4", "xds:///api", bandN1, "NaN"), // ignored, counted
			attemptSeries("other/web-1", "xds:///api", bandN1, "40"), // not managed: dropped
			noTarget, // ignored, counted
		},
		queryAttemptSeconds: {
			attemptSeries("shop/web-1", "xds:///api", bandN1, "1.2"),
			attemptSeries("shop/web-1", "xds:///api", bandN2, "2.5"),
			attemptSeries("shop/web-1", "xds:///api", bandN2, "0.1"),
			attemptSeries("shop/web-2", "xds:///api", bandN1, "0"),
			attemptSeries("other/web-1", "xds:///api", bandN1, "0.1"),
		},
	}
	h := newHarness(t, Config{Window: 30 * time.Second, Namespaces: []string{"shop"}, AttemptsQuery: DefaultAttemptsQuery}, fp)
	m := h.mustDeliver("first answer")
	want := []Attempt{
		{Namespace: "shop", Pod: "web-1", Target: "xds:///api", Locality: bandN1, Attempts: 600, Seconds: 1.2},
		{Namespace: "shop", Pod: "web-1", Target: "xds:///api", Locality: bandN2, Attempts: 320, Seconds: 2.6},
	}
	if diff := cmp.Diff(want, m.Attempts, within1e9); diff != "" || !m.AttemptsRead {
		t.Errorf("attempts (read %v; -want +got):\n%s", m.AttemptsRead, diff)
	}
	for reason, want := range map[string]float64{reasonBadValue: 1, reasonMissingLabel: 1} {
		if got := h.metric(h.src.ignored.WithLabelValues(queryAttempts, reason)); got != want {
			t.Errorf("ignored_samples_total{query=%q,reason=%q} = %v, want %v", queryAttempts, reason, got, want)
		}
	}
	if !strings.Contains(h.logs.String(), "call-attempt series without its labels") {
		t.Errorf("no log line for the series without its labels:\n%s", h.logs.String())
	}
}

// A failing call-attempt query fails neither the round nor the other signals: the round has no
// attempts and says so (AttemptsRead false, not "none"), Status.AttemptsReason says why, logged
// once; the next answer has them again.
func TestAttemptsQueryFailure(t *testing.T) {
	t.Parallel()
	fp := loadProm(map[string][]series{queryPodRequests: {podSeries("shop/api-1", "100")}})
	fp.attempts = map[string][]series{
		queryAttempts:       {attemptSeries("shop/web-1", "xds:///api", bandN1, "60")},
		queryAttemptSeconds: {attemptSeries("shop/web-1", "xds:///api", bandN1, "0.3")},
	}
	h := newHarness(t, Config{AttemptsQuery: DefaultAttemptsQuery}, fp)
	if m := h.mustDeliver("first answer"); len(m.Attempts) != 1 || !m.AttemptsRead {
		t.Fatalf("first answer: attempts %+v, read %v", m.Attempts, m.AttemptsRead)
	}
	fp.set(func(f *fakeProm) { f.attemptErr, f.latency = true, []series{lat("a", "b", "0.030")} })
	h.advance(2 * time.Second)
	m := h.mustDeliver("latency changed while the call-attempt queries fail")
	if m.AttemptsRead || m.Attempts != nil || len(m.Load) != 1 || m.Latency[Pair{"a", "b"}] != 30 {
		t.Errorf("while failing: attempts %+v (read %v), loads %+v, latency %v", m.Attempts, m.AttemptsRead, m.Load, m.Latency)
	}
	if st := h.src.Status(); !st.OK || !strings.Contains(st.AttemptsReason, "attempt") || st.LoadReason != "" {
		t.Errorf("Status while failing: %+v; want OK with AttemptsReason", st)
	}
	h.advance(2 * time.Second)
	h.mustNotDeliver("still failing, nothing else changed")
	if n := h.logs.count("call-attempt queries failed"); n != 1 {
		t.Errorf("%d log lines for the failure after two rounds, want 1", n)
	}
	fp.set(func(f *fakeProm) { f.attemptErr, f.latency = false, []series{lat("a", "b", "0.010")} })
	h.advance(2 * time.Second)
	if m := h.mustDeliver("recovered"); !m.AttemptsRead || len(m.Attempts) != 1 || h.src.Status().AttemptsReason != "" {
		t.Errorf("after recovery: attempts %+v (read %v), status %+v", m.Attempts, m.AttemptsRead, h.src.Status())
	}
}

// The call-attempt queries are off unless AttemptsQuery is set, and a seconds query that is
// blank or "-" beside one that is on is a configuration error naming the field.
func TestAttemptsConfig(t *testing.T) {
	t.Parallel()
	fp := loadProm(nil)
	h := newHarness(t, Config{}, fp)
	if m := h.mustDeliver("first answer"); m.AttemptsRead {
		t.Error("attempts read with AttemptsQuery empty")
	}
	for _, q := range fp.requests() {
		if strings.Contains(q.Get("query"), "grpc_client_attempt") {
			t.Errorf("a call-attempt query was sent with the queries off: %s", q.Get("query"))
		}
	}
	for _, secs := range []string{" ", DisableAttempts} {
		_, err := NewSource(Config{URL: "http://127.0.0.1:1", AttemptsQuery: DefaultAttemptsQuery, AttemptSecondsQuery: secs})
		if err == nil || !strings.Contains(err.Error(), "AttemptSecondsQuery") {
			t.Errorf("AttemptSecondsQuery %q: error %v, want one naming the field", secs, err)
		}
	}
}
