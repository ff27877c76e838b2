package app

import (
	"context"
	"math"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape GETs the pod's /metrics and parses it with Prometheus' text parser.
func scrape(t *testing.T, p *Pod) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	p.Metrics().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("%s: /metrics answered %d", p.Name(), rec.Code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatalf("%s: /metrics does not parse: %v\n%s", p.Name(), err, rec.Body.String())
	}
	return mfs
}

// series returns the metrics of family name whose labels include want.
func series(mfs map[string]*dto.MetricFamily, name string, want map[string]string) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range mfs[name].GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if got[k] != v {
				match = false
			}
		}
		if match {
			out = append(out, m)
		}
	}
	return out
}

// TestPodMetrics: a front pod calling a leaf pod twice per request, three requests from
// outside. Istio's counters count them at both ends with the standard labels, the histograms
// agree with the counters, the busy time is the sum of the service times, and the CPU request
// is exported as kube-state-metrics does.
func TestPodMetrics(t *testing.T) {
	t.Parallel()
	const service = 2 * time.Millisecond
	leaf := newPod(t, Config{Name: "details-0", Node: "n2", Workload: "details", Namespace: "shop", Workers: 1,
		ServiceTime: Fixed(service), Delay: func(string) time.Duration { return time.Millisecond }})
	leafConn := serve(t, leaf)
	front := newPod(t, Config{Name: "productpage-0", Node: "n1", Workload: "productpage", Namespace: "shop", Workers: 1,
		ServiceTime: Fixed(service), CPURequest: 0.5,
		Downstream: []Downstream{{Service: "details", Namespace: "shop", Rate: 2, Conn: leafConn}}})
	frontConn := serve(t, front)
	for range 3 {
		if _, err := Call(context.Background(), frontConn, "", ""); err != nil {
			t.Fatal(err)
		}
	}

	fm, lm := scrape(t, front), scrape(t, leaf)
	for _, c := range []struct {
		pod    string
		mfs    map[string]*dto.MetricFamily
		labels map[string]string
		want   float64
	}{
		{"productpage-0", fm, map[string]string{"reporter": "destination", "source_workload": "unknown", "source_canonical_revision": "latest",
			"destination_workload": "productpage", "destination_workload_namespace": "shop", "destination_service": "productpage.shop.svc.cluster.local",
			"destination_service_name": "productpage", "destination_version": "v1", "request_protocol": "grpc", "response_code": "200",
			"grpc_response_status": "0", "response_flags": "-", "connection_security_policy": "none"}, 3},
		{"productpage-0", fm, map[string]string{"reporter": "source", "source_workload": "productpage", "source_workload_namespace": "shop",
			"destination_workload": "details", "destination_service": "details.shop.svc.cluster.local", "destination_service_namespace": "shop",
			"grpc_response_status": "0", "connection_security_policy": "unknown"}, 6},
		{"details-0", lm, map[string]string{"reporter": "destination", "source_workload": "productpage", "source_workload_namespace": "shop",
			"source_app": "productpage", "source_version": "v1", "source_canonical_service": "productpage", "source_principal": "unknown",
			"destination_workload": "details", "destination_canonical_service": "details"}, 6},
	} {
		ms := series(c.mfs, "istio_requests_total", c.labels)
		hs := series(c.mfs, "istio_request_duration_milliseconds", c.labels)
		if len(ms) != 1 || len(hs) != 1 {
			t.Errorf("%s: %d counters and %d histograms labelled %v, want one each", c.pod, len(ms), len(hs), c.labels)
			continue
		}
		var names []string
		for _, l := range ms[0].GetLabel() {
			names = append(names, l.GetName())
		}
		if want := slices.Sorted(slices.Values(istioLabels)); !slices.Equal(names, want) {
			t.Errorf("%s: labels %v, want Istio's %v", c.pod, names, want)
		}
		if got := ms[0].GetCounter().GetValue(); got != c.want {
			t.Errorf("%s: istio_requests_total%v = %v, want %v", c.pod, c.labels, got, c.want)
		}
		h := hs[0].GetHistogram()
		if float64(h.GetSampleCount()) != c.want || len(h.GetBucket()) != len(istioDurationBuckets)+1 { // and +Inf
			t.Errorf("%s: histogram of %d samples in %d buckets, want %v in Istio's %d", c.pod, h.GetSampleCount(), len(h.GetBucket()),
				c.want, len(istioDurationBuckets)+1)
		}
		// Every request took at least its service time (the leaf's inbound time excludes its
		// injected network delay, the caller's outbound time includes it).
		if min := c.want * float64(service) / float64(time.Millisecond); h.GetSampleSum() < min {
			t.Errorf("%s: duration sum %v ms, want ≥ %v", c.pod, h.GetSampleSum(), min)
		}
	}
	if n := len(fm["istio_requests_total"].GetMetric()); n != 2 {
		t.Errorf("productpage-0: %d istio_requests_total series, want 2 (inbound, outbound)", n)
	}

	for _, c := range []struct {
		pod *Pod
		mfs map[string]*dto.MetricFamily
		n   int
	}{{front, fm, 3}, {leaf, lm, 6}} {
		cpu := series(c.mfs, "container_cpu_usage_seconds_total", map[string]string{"pod": c.pod.Name(), "namespace": "shop", "container": c.pod.cfg.Workload})
		want := float64(c.n) * service.Seconds()
		if len(cpu) != 1 || math.Abs(cpu[0].GetCounter().GetValue()-want) > 1e-9 {
			t.Errorf("%s: container_cpu_usage_seconds_total %v, want one series of %v s (%d × %v)", c.pod.Name(), cpu, want, c.n, service)
		}
	}
	req := series(fm, "kube_pod_container_resource_requests", map[string]string{"pod": "productpage-0", "namespace": "shop",
		"container": "productpage", "node": "n1", "resource": "cpu", "unit": "core"})
	if len(req) != 1 || req[0].GetGauge().GetValue() != 0.5 {
		t.Errorf("productpage-0: kube_pod_container_resource_requests %v, want one series of 0.5", req)
	}
	if _, ok := lm["kube_pod_container_resource_requests"]; ok {
		t.Error("details-0 has no CPU request, yet exports one")
	}
}

// TestPodMetricsErrors: a failed downstream call is counted with its gRPC status at the source
// and, propagated, at the destination.
func TestPodMetricsErrors(t *testing.T) {
	t.Parallel()
	pod := newPod(t, Config{Name: "front-0", Workers: 1, Downstream: []Downstream{{Service: "leaf", Rate: 1, Conn: failingConn{}}}})
	conn := serve(t, pod)
	if _, err := Call(context.Background(), conn, "", ""); err == nil {
		t.Fatal("want an error")
	}
	mfs := scrape(t, pod)
	for _, reporter := range []string{"source", "destination"} {
		ms := series(mfs, "istio_requests_total", map[string]string{"reporter": reporter, "grpc_response_status": "8", "response_code": "200"})
		if len(ms) != 1 || ms[0].GetCounter().GetValue() != 1 {
			t.Errorf("reporter=%s: %v, want one request with gRPC status 8 (RESOURCE_EXHAUSTED)", reporter, ms)
		}
	}
}

// TestPodAttemptMetrics: with a Locality, a caller pod exports the stand-in of grpc-go's
// grpc.client.attempt.duration: one histogram per (target, status, callee locality), the
// locality the one Locality gives for the peer the call reached (the leaf's address), each
// call's time including the leaf's injected delay; a failed call is labelled with its
// canonical status; a pod without a Locality exports none.
func TestPodAttemptMetrics(t *testing.T) {
	t.Parallel()
	const delay = 3 * time.Millisecond
	leaf := newPod(t, Config{Name: "details-0", Node: "n2", Workload: "details", Workers: 1,
		Delay: func(string) time.Duration { return delay }})
	leafConn := serve(t, leaf)
	leafAddr := leafConn.CanonicalTarget()
	const locality = `{region="", zone="n2", sub_zone="edgeflow/band"}`
	front := newPod(t, Config{Name: "productpage-0", Node: "n1", Workload: "productpage", Workers: 1,
		Downstream: []Downstream{{Service: "details", Rate: 2, Conn: leafConn, Target: "xds:///details"},
			{Service: "broken", Rate: 1, Conn: failingConn{}, Target: "xds:///broken"}},
		Locality: func(addr string) string {
			if strings.HasSuffix(leafAddr, addr) {
				return locality
			}
			return "unexpected " + addr
		}})
	frontConn := serve(t, front)
	for range 3 {
		if _, err := Call(context.Background(), frontConn, "", ""); err == nil {
			t.Fatal("want the broken downstream's error")
		}
	}
	mfs := scrape(t, front)
	ok := series(mfs, "grpc_client_attempt_duration_seconds", map[string]string{"grpc_method": "edgeflow.e2e.Pod/Call",
		"grpc_target": "xds:///details", "grpc_status": "OK", "grpc_lb_locality": locality})
	if len(ok) != 1 {
		t.Fatalf("%d attempt histograms to details at %s, want 1: %v", len(ok), locality, mfs["grpc_client_attempt_duration_seconds"])
	}
	h := ok[0].GetHistogram()
	if h.GetSampleCount() != 6 || h.GetSampleSum() < 6*delay.Seconds() || len(h.GetBucket()) != len(grpcLatencyBounds)+1 {
		t.Errorf("attempts to details: %d in %.4f s over %d buckets; want 6 of at least %v each, grpc-go's %d buckets",
			h.GetSampleCount(), h.GetSampleSum(), len(h.GetBucket()), delay, len(grpcLatencyBounds)+1)
	}
	failed := series(mfs, "grpc_client_attempt_duration_seconds", map[string]string{"grpc_target": "xds:///broken", "grpc_status": "RESOURCE_EXHAUSTED", "grpc_lb_locality": ""})
	if len(failed) != 1 || failed[0].GetHistogram().GetSampleCount() != 3 {
		t.Errorf("failed attempts: %v; want 3 labelled RESOURCE_EXHAUSTED without a locality (no peer)", failed)
	}
	if _, ok := scrape(t, leaf)["grpc_client_attempt_duration_seconds"]; ok {
		t.Error("details-0 has no Locality, yet exports attempt durations")
	}
}
