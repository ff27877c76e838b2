package live

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/prom"
	"github.com/edgeflow/edgeflow/xds"
)

// TestL7PenaltyFromPrometheus: the live latency correction as serve --policy closed-loop wires
// it — a real kube-apiserver, a real Prometheus scraping the callers' grpc-go attempt metric by
// callee locality and the callees' Istio inbound times, real ICMP probes through the testbed's
// delay — finds a hidden penalty on one node pair (requests from edge-1 to edge-3 pay 35 ms
// beyond the 10 ms RTT that ICMP sees) within ±1 ms, corrects no other pair by more than 1 ms,
// and the plan moves web-1's traffic off the pair (its share to api-3 from all to about half:
// api-3 must still get its capacity share, and web-1 is the next cheapest caller).
func TestL7PenaltyFromPrometheus(t *testing.T) {
	t.Parallel()
	const (
		scrape    = time.Second
		window    = 3 * time.Second
		interval  = 500 * time.Millisecond
		inboundMS = 4.0 // every api pod's inbound time per request
		clientMS  = 0.8 // the caller's own overhead per attempt, the same on every path
		penaltyMS = 35.0
		rps       = 100.0 // attempts a second, per caller and callee band
	)
	rtt := edgeRTT()
	rttOf := func(a, b string) float64 {
		if a == b {
			return 0
		}
		if v, ok := rtt[[2]string{a, b}]; ok {
			return v
		}
		return rtt[[2]string{b, a}]
	}
	callers := []placement{{"web", "web-1", "edge-1"}, {"web", "web-2", "edge-2"}, {"web", "web-3", "edge-3"}}
	callees := []placement{{"api", "api-3", "edge-3"}, {"api", "api-4", "edge-4"}}
	var attempts []reportedAttempt
	for _, c := range callers {
		for _, d := range callees {
			ms := inboundMS + clientMS + rttOf(c.node, d.node)
			if c.node == "edge-1" && d.node == "edge-3" {
				ms += penaltyMS
			}
			attempts = append(attempts, reportedAttempt{namespace: ns, pod: c.pod, target: "xds:///api." + ns,
				locality: prom.Locality{Zone: d.node, SubZone: xds.BandSubZone}.String(), rps: rps, ms: ms})
		}
	}
	loads := []reportedPod{
		{namespace: ns, pod: "api-3", rps: rps * float64(len(callers)), inboundMS: inboundMS, cores: 0.2},
		{namespace: ns, pod: "api-4", rps: rps * float64(len(callers)), inboundMS: inboundMS, cores: 0.2},
	}
	w := newWorld(t, worldOptions{nodes: edges, rtt: rtt, scrape: scrape, podLoad: loads, attempts: attempts,
		kube: true, services: []string{"web", "api"}, pods: append(callers, callees...)})
	corr, err := estimate.NewLatencyCorrector(estimate.LatencyConfig{MinRequests: 100})
	must(t, err)
	w.watch(watchOptions{
		prom: &prom.Config{Interval: interval, Window: window, CallsQuery: prom.DisableCalls, AttemptsQuery: prom.DefaultAttemptsQuery},
		live: watcher.LiveConfig{Latency: corr, CallGraph: &watcher.CallGraph{
			Calls:   []optimizer.Call{{From: "web." + ns, To: "api." + ns}},
			Ingress: []optimizer.Ingress{{Service: "web." + ns, RPS: 3 * rps}}}},
	})

	latency := func(top *optimizer.Topology, from, to string) float64 {
		for _, l := range top.Latency {
			if l.From == from && l.To == to {
				return l.MS
			}
		}
		return math.NaN()
	}
	share := func() (float64, error) { // web-1's share of its calls to api-3 in the plan served
		_, _, alloc := w.srv.Publication()
		if alloc == nil || alloc.Call("web."+ns, "api."+ns) == nil {
			return 0, errors.New("no plan of web → api yet")
		}
		f := 0.0
		for _, r := range alloc.Call("web."+ns, "api."+ns).Routes {
			if r.Caller == "web-1."+ns && r.Callee == "api-3."+ns {
				f += r.Fraction
			}
		}
		return f, nil
	}
	testkit.EventuallyNoError(t, 60*time.Second, "the measured plan before the penalty is found", func() error {
		top := w.cl.Current()
		if top == nil || math.Abs(latency(top, "edge-1", "edge-3")-10) > 2 {
			return errors.New("no measured edge-1 → edge-3 latency yet")
		}
		f, err := share()
		if err != nil {
			return err
		}
		if f < 0.99 {
			return fmt.Errorf("web-1's share to api-3 %.2f, want all of it before the penalty is known", f)
		}
		return nil
	})
	// The pair's latency in the plan is its ICMP plus the penalty, so the probes' own error
	// cancels: it must be what the path pays, 10 + 35 ms. The other pairs must hold no penalty
	// over 1 ms (their latency is the probes', whose error — the delay's release lag, up to
	// 1 ms on a busy machine — is not the correction's).
	testkit.EventuallyNoError(t, 90*time.Second, "the penalty on edge-1 → edge-3 found within ±1 ms, and no other", func() error {
		var errs []error
		if got, want := latency(w.cl.Current(), "edge-1", "edge-3"), rttOf("edge-1", "edge-3")+penaltyMS; !(math.Abs(got-want) <= 1) {
			errs = append(errs, fmt.Errorf("edge-1 → edge-3 %.2f ms in the plan, want %.0f ± 1", got, want))
		}
		for pair, ms := range penaltiesIn(t, w.reg) {
			if pair != [2]string{"edge-1", "edge-3"} && ms > 1 {
				errs = append(errs, fmt.Errorf("a penalty of %.2f ms on %s → %s, which pays none", ms, pair[0], pair[1]))
			}
		}
		return errors.Join(errs...)
	})
	top := w.cl.Current()
	got := penaltiesIn(t, w.reg)[[2]string{"edge-1", "edge-3"}]
	t.Logf("edge-1 → edge-3: %.2f ms in the topology, penalty %.2f ms (truth %v beyond the 10 ms RTT)", latency(top, "edge-1", "edge-3"), got, penaltyMS)
	// The metric is what the plan added: the pair's latency less its ICMP, which the test does
	// not see. The delay holds every packet at least its configured time, so ICMP reads at or
	// over 10 ms and the penalty is at most the plan's latency less 10; the probe's own error
	// (the delay's release lag on a busy machine: up to 2.1 ms over the configured RTT in a CI
	// run here, which also showed that the two directions of a pair err apart, 1.04 and 2.10 ms)
	// bounds it from below. Against the exporter's 35 it is off by that error too: the
	// topology's total is the check on the truth, above.
	if total := latency(top, "edge-1", "edge-3"); got > total-rttOf("edge-1", "edge-3")+0.01 || got < total-rttOf("edge-1", "edge-3")-2.5 || math.Abs(got-penaltyMS) > 2 {
		t.Errorf("penalty metric edge-1 → edge-3 = %.2f ms, want what the plan added to an ICMP of 10–12.5 ms (%.2f–%.2f ms) and %v ± 2 ms",
			got, total-rttOf("edge-1", "edge-3")-2.5, total-rttOf("edge-1", "edge-3"), penaltyMS)
	}
	testkit.EventuallyNoError(t, 30*time.Second, "web-1's traffic off edge-1 → edge-3", func() error {
		f, err := share()
		if err == nil && math.Abs(f-0.5) > 0.05 {
			err = fmt.Errorf("web-1's share to api-3 %.2f, want 0.5 (api-3's capacity share less web-3's whole supply)", f)
		}
		return err
	})
}

// penaltiesIn reads edgeflow_closed_loop_latency_penalty_seconds from reg, in ms by (source
// node, target node).
func penaltiesIn(t *testing.T, reg *prometheus.Registry) map[[2]string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	out := map[[2]string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "edgeflow_closed_loop_latency_penalty_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var pair [2]string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "source_node":
					pair[0] = l.GetValue()
				case "target_node":
					pair[1] = l.GetValue()
				}
			}
			out[pair] = 1000 * m.GetGauge().GetValue()
		}
	}
	return out
}
