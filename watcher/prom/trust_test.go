package prom

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// probeTarget is an active target of the probe job, as /api/v1/targets lists it: the chart's
// and the testbed's relabelling (instance is the probed node's address).
func probeTarget(from, to, instance string) map[string]any {
	return map[string]any{"labels": map[string]string{"job": DefaultProbeJob, "instance": instance, "source_node": from, "target_node": to},
		"scrapeInterval": "15s"}
}

// probe is a latency series of the probe job with the labels its target gives it, plus extra.
func probe(from, to, instance, seconds string, extra ...string) series {
	s := lat(from, to, seconds)
	s.labels["job"], s.labels["instance"] = DefaultProbeJob, instance
	for i := 0; i+1 < len(extra); i += 2 {
		s.labels[extra[i]] = extra[i+1]
	}
	return s
}

// A probe series counts only when it carries every label of its pair's target: a series of the
// probe job with another instance, or for a pair no target probes, is ignored and counted.
func TestProbeSeriesPinnedToTargets(t *testing.T) {
	t.Parallel()
	prom := &fakeProm{calls: []series{},
		targets: []any{probeTarget("a", "b", "10.0.0.2"), map[string]any{"labels": map[string]string{"job": "kubernetes-pods"}, "scrapeInterval": "5s"}},
		latency: []series{
			probe("a", "b", "10.0.0.2", "0.010"),
			probe("b", "a", "10.0.0.1", "0.001"), // no target probes b→a
		}}
	h := newHarness(t, Config{ProbePins: PinTargets}, prom)
	m := h.mustDeliver("first answer")
	if diff := cmp.Diff(map[Pair]float64{{"a", "b"}: 10}, m.Latency); diff != "" {
		t.Errorf("latency (-want +got):\n%s", diff)
	}
	if n := h.metric(h.src.ignored.WithLabelValues(queryLatency, reasonUntrusted)); n != 1 {
		t.Errorf("untrusted latency samples = %v, want 1 (b→a)", n)
	}
	if !strings.Contains(h.logs.String(), "no target of the probe job produces") {
		t.Errorf("the untrusted series is not logged:\n%s", h.logs)
	}

	// A series that claims the pair with another instance is ignored: the pair keeps its value.
	prom.set(func(f *fakeProm) {
		f.latency = []series{probe("a", "b", "10.0.0.2", "0.010"), probe("a", "b", "10.9.9.9", "0.500")}
	})
	h.advance(time.Second)
	h.mustNotDeliver("a series of another instance")

	// Without the targets API nothing is trusted (the pins last read stay: none here).
	cold := newHarness(t, Config{ProbePins: PinTargets}, &fakeProm{calls: []series{}, latency: []series{probe("a", "b", "10.0.0.2", "0.010")}})
	if m := cold.mustDeliver("first answer without targets"); len(m.Latency) != 0 {
		t.Errorf("latency %v trusted without the probe job's targets", m.Latency)
	}
	if !strings.Contains(cold.logs.String(), "cannot read the probe job's targets") {
		t.Errorf("the missing targets are not logged:\n%s", cold.logs)
	}
}

// A pair with two series that both carry its target's labels (an honor_labels scrape adding its
// own) is contested: it keeps its last trusted latency, is listed, counted and logged, and is
// measured again once the second series is gone. A pair contested from the start is not measured.
func TestContestedPairKeepsLastTrustedValue(t *testing.T) {
	t.Parallel()
	real := []series{probe("a", "b", "10.0.0.2", "0.010"), probe("a", "c", "10.0.0.3", "0.020")}
	forged := probe("a", "b", "10.0.0.2", "0.500", "pod", "attacker")
	forgedNew := probe("c", "a", "10.0.0.1", "0.500", "pod", "attacker")
	prom := &fakeProm{calls: []series{}, latency: real,
		targets: []any{probeTarget("a", "b", "10.0.0.2"), probeTarget("a", "c", "10.0.0.3"), probeTarget("c", "a", "10.0.0.1")}}
	h := newHarness(t, Config{ProbePins: PinTargets}, prom)
	h.mustDeliver("first answer")

	prom.set(func(f *fakeProm) {
		f.latency = append(append([]series{}, real...), forged, probe("c", "a", "10.0.0.1", "0.005"), forgedNew)
	})
	h.advance(time.Second)
	m := h.mustDeliver("forged series")
	if diff := cmp.Diff(map[Pair]float64{{"a", "b"}: 10, {"a", "c"}: 20}, m.Latency); diff != "" {
		t.Errorf("latency with forged series (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[Pair]bool{{"a", "b"}: true, {"c", "a"}: true}, m.Contested); diff != "" {
		t.Errorf("contested (-want +got):\n%s", diff)
	}
	if len(m.Stale) != 0 {
		t.Errorf("stale %v: a contested pair keeps its value, not stale", m.Stale)
	}
	if n := h.metric(h.src.contested.WithLabelValues(queryLatency)); n != 2 {
		t.Errorf("edgeflow_prometheus_contested_series{signal=latency} = %v, want 2", n)
	}
	if got := DescribeContested(m, 0); got != "a→b, c→a" {
		t.Errorf("DescribeContested = %q", got)
	}
	if !strings.Contains(h.logs.String(), "more than one probe series") {
		t.Errorf("the contested pairs are not logged:\n%s", h.logs)
	}

	// Kept through StaleAfter and more: the value is the last trusted one, not forgotten.
	h.advance(2 * DefaultStaleAfter)
	h.round()
	prom.set(func(f *fakeProm) { f.latency = append([]series{}, real...) })
	h.advance(time.Second)
	m = h.mustDeliver("the forged series gone") // c→a was never measured: the pair set changes
	if len(m.Contested) != 0 || m.Latency[Pair{"a", "b"}] != 10 {
		t.Errorf("after the forgery: contested %v, latency %v", m.Contested, m.Latency)
	}
	if n := h.metric(h.src.contested.WithLabelValues(queryLatency)); n != 0 {
		t.Errorf("edgeflow_prometheus_contested_series{signal=latency} = %v, want 0", n)
	}
}

// Pod loads: a pod whose series come from more than one scrape (job, instance) is contested and
// keeps its last trusted load, marked stale (no new window for the estimator); the pods and call
// edges of namespaces not managed are not read.
func TestContestedPodAndManagedNamespaces(t *testing.T) {
	t.Parallel()
	sidecar := func(pod, instance, v string) series {
		s := podSeries(pod, v)
		s.labels["job"], s.labels["instance"] = "kubernetes-pods", instance
		return s
	}
	prom := loadProm(map[string][]series{queryPodRequests: {
		sidecar("shop/api-1", "10.1.0.1:15020", "600"), sidecar("shop/api-1", "10.1.0.1:15020", "6"), // one scrape, two series
		sidecar("shop/api-2", "10.1.0.2:15020", "300"),
		sidecar("other/x", "10.1.0.9:15020", "50"),
	}})
	prom.calls = []series{call("shop/web", "shop/api", "10"), call("other/x", "shop/api", "99"), call("shop/web", "other/y", "99")}
	h := newHarness(t, Config{Namespaces: []string{"shop"}}, prom)
	m := h.mustDeliver("first answer")
	reqs := func(m *Measurements) map[string]float64 {
		out := map[string]float64{}
		for _, l := range m.Load {
			out[l.Name()] = l.Requests
		}
		return out
	}
	if diff := cmp.Diff(map[string]float64{"shop/api-1": 606, "shop/api-2": 300}, reqs(m)); diff != "" {
		t.Errorf("pod requests (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]CallRate{{From: Workload{"web", "shop"}, To: Workload{"api", "shop"}, RPS: 10}}, m.Calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}

	prom.set(func(f *fakeProm) {
		f.load = maps.Clone(f.load)
		f.load[queryPodRequests] = []series{
			sidecar("shop/api-1", "10.1.0.1:15020", "600"), sidecar("shop/api-1", "10.1.0.66:15020", "90000"), // forged
			sidecar("shop/api-2", "10.1.0.2:15020", "330"),
		}
	})
	h.advance(DefaultWindowFor(h))
	m = h.mustDeliver("a forged pod series")
	if diff := cmp.Diff(map[string]float64{"shop/api-1": 606, "shop/api-2": 330}, reqs(m)); diff != "" {
		t.Errorf("pod requests with a forged series (-want +got):\n%s", diff)
	}
	for _, l := range m.Load {
		if want := l.Pod == "api-1"; l.Contested != want || l.Stale != want {
			t.Errorf("%s: contested %v, stale %v; want %v", l.Name(), l.Contested, l.Stale, want)
		}
	}
	if n := h.metric(h.src.contested.WithLabelValues(queryPodRequests)); n != 1 {
		t.Errorf("edgeflow_prometheus_contested_series{signal=pod_requests} = %v, want 1", n)
	}
	if got := DescribeContested(m, 0); got != "shop/api-1" {
		t.Errorf("DescribeContested = %q", got)
	}
}

// DefaultWindowFor is the harness source's window: a delivery of pod loads is due each window.
func DefaultWindowFor(h *harness) time.Duration { return h.src.windowFor() }
