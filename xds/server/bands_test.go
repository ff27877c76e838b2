package server

import (
	"context"
	"fmt"
	"maps"
	"math"
	"sync/atomic"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// TestRealClientBands shows that grpc-go's xDS client takes what LBBands serves and runs it:
// it ACKs the WrrLocality{LeastRequest} cluster and the band assignment (a NACK fails the
// test), splits the RPCs between the two bands by the plan's locality weights, and inside the
// band of two pods, one of them 20 ms slow, picks by least-request.
//
// The plan is round-robin's on capacities 1:1:1 — band n2 (fast, slow) 2/3, band n3 (far) 1/3
// — whatever the pods' speed: a band is picked by weight alone (weighted_target), so band
// n2's share is binomial, σ = 1.9 % over 600 RPCs, and the band is ±4σ. Inside band n2,
// least-request with two choices sends to the slow pod only when both draws are it or it has
// fewer RPCs in flight: ~25 % of the band's RPCs with 8 concurrent callers, against 50 % for
// round-robin (TestRealClientLeastRequest); the test wants under 37.5 %.
func TestRealClientBands(t *testing.T) {
	if testing.Short() {
		t.Skip("real xDS client: 600 RPCs, some slow")
	}
	addr := map[string]string{}
	for pod, delay := range map[string]time.Duration{"fast": 0, "slow": 20 * time.Millisecond, "far": 0} {
		addr[pod] = testkit.ServeSlowEcho(t, testkit.Listen(t), pod, delay).Addr
	}
	top := &optimizer.Topology{
		Nodes:   []optimizer.Node{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}},
		Latency: []optimizer.Latency{{From: "n1", To: "n2", MS: 2}, {From: "n1", To: "n3", MS: 4}, {From: "n2", To: "n3", MS: 2}},
		Services: []optimizer.Service{
			{Name: "client", Pods: []optimizer.Pod{{Name: "c-0", Node: "n1"}}},
			{Name: "echo", Pods: []optimizer.Pod{
				{Name: "fast", Node: "n2", Address: addr["fast"]},
				{Name: "slow", Node: "n2", Address: addr["slow"]},
				{Name: "far", Node: "n3", Address: addr["far"]},
			}},
		},
		Calls:   []optimizer.Call{{From: "client", To: "echo"}},
		Ingress: []optimizer.Ingress{{Service: "client", RPS: 10}},
	}
	const n, workers = 600, 8
	h, c := dialWhenReady(t, top, xds.LBBands, 3)
	counts := callConcurrently(t, c, n, workers)
	band := counts["fast"] + counts["slow"]
	bandShare := float64(band) / n
	slowShare := float64(counts["slow"]) / float64(max(band, 1))
	t.Logf("band n2 %d of %d RPCs (%.1f%%, planned 66.7%%): fast %d, slow %d (%.1f%% of the band); band n3 (far) %d",
		band, n, 100*bandShare, counts["fast"], counts["slow"], 100*slowShare, counts["far"])
	if math.Abs(bandShare-2.0/3) > 0.077 {
		t.Errorf("band n2 got %.1f%% of the RPCs, want 66.7%% ± 7.7%% (the plan's locality weights)", 100*bandShare)
	}
	if slowShare >= 0.375 {
		t.Errorf("the slow pod got %.1f%% of its band's RPCs, want under 37.5%% (least-request)", 100*slowShare)
	}
	for _, set := range []string{"cds", "eds"} {
		if got := counter(t, h.srv.m.nacks.WithLabelValues(set)); got != 0 {
			t.Errorf("%v %s NACKs from grpc-go", got, set)
		}
	}
}

// TestEnvoyClientBands: an Envoy-like ADS client, which NACKs what Envoy's rules reject
// (xds.CheckResponse), accepts what LBBands serves an Envoy node: LEAST_REQUEST clusters with
// locality weights and the active_request_bias, and assignments of band localities.
func TestEnvoyClientBands(t *testing.T) {
	t.Parallel()
	c := bookinfoEnvoy(t, Config{LBPolicy: xds.LBBands})
	c.waitFor(t, "the bands clusters and assignments", func(s envoyState) error {
		if len(s.clusters) == 0 || len(s.clas) != len(s.clusters) {
			return fmt.Errorf("%d clusters, %d assignments", len(s.clusters), len(s.clas))
		}
		for _, cl := range s.clusters {
			if cl.GetLbPolicy() != cluster.Cluster_LEAST_REQUEST || cl.GetLeastRequestLbConfig().GetActiveRequestBias().GetDefaultValue() != xds.ActiveRequestBias {
				return fmt.Errorf("cluster %s: lb_policy %v, least_request_lb_config %v", cl.GetName(), cl.GetLbPolicy(), cl.GetLeastRequestLbConfig())
			}
		}
		for _, cla := range s.clas {
			for _, l := range cla.GetEndpoints() {
				if sz := l.GetLocality().GetSubZone(); sz != xds.BandSubZone && sz != xds.FailoverSubZone {
					return fmt.Errorf("assignment %s: locality %v is not a band", cla.GetClusterName(), l.GetLocality())
				}
			}
		}
		return nil
	})
}

// TestPooledServicesMetric: edgeflow_xds_service_pooled has a series of 1 for each service the
// closed-loop plan in force pools under LBBands, and none once it is banded again: echo is
// pooled while it has no measured capacity (never measured: the planner pools it), banded
// once its pods have capacities far above its load, and pooled again when its load exceeds
// the utilisation cap of their capacity. Under round-robin delivery nothing is pooled.
func TestPooledServicesMetric(t *testing.T) {
	t.Parallel()
	top := func(capacity float64) *optimizer.Topology {
		var mu *float64 // 0: not measured
		if capacity > 0 {
			mu = &capacity
		}
		return &optimizer.Topology{
			Nodes:   []optimizer.Node{{Name: "n1"}, {Name: "n2"}},
			Latency: []optimizer.Latency{{From: "n1", To: "n2", MS: 2}},
			Services: []optimizer.Service{
				{Name: "client", Pods: []optimizer.Pod{{Name: "c-0", Node: "n1"}}},
				{Name: "echo", Pods: []optimizer.Pod{
					{Name: "e-1", Node: "n1", Address: "127.0.0.1:1", CapacityRPS: mu},
					{Name: "e-2", Node: "n2", Address: "127.0.0.1:2", CapacityRPS: mu},
				}},
			},
			Calls:   []optimizer.Call{{From: "client", To: "echo"}},
			Ingress: []optimizer.Ingress{{Service: "client", RPS: 10}},
		}
	}
	pooled := func(h *harness) map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		mfs, err := h.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "edgeflow_xds_service_pooled" {
				continue
			}
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
		return out
	}
	for _, tc := range []struct {
		name string
		lb   xds.LBPolicy
		want []map[string]float64 // after each topology: unmeasured, capacity 100, capacity 5
	}{
		{"bands", xds.LBBands, []map[string]float64{{"echo": 1}, {}, {"echo": 1}}},
		{"round-robin", xds.LBRoundRobin, []map[string]float64{{}, {}, {}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startServer(t, Config{Policy: optimizer.ClosedLoop, LBPolicy: tc.lb, DebounceQuiet: -1})
			for i, capacity := range []float64{0, 100, 5} {
				h.srv.Update(top(capacity))
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := h.srv.WaitPublished(ctx, uint64(i+1))
				cancel()
				if err != nil {
					t.Fatalf("capacity %g: %v", capacity, err)
				}
				a := h.srv.Allocation()
				if got := pooled(h); !maps.Equal(got, tc.want[i]) {
					t.Errorf("capacity %g: edgeflow_xds_service_pooled %v, want %v (the allocation pools %v)", capacity, got, tc.want[i], a.Pooled)
				}
			}
		})
	}
}

// TestSetPooledNeverEmpty: setPooled moves edgeflow_xds_service_pooled from one set of
// services to the next, deleting only the series of services that left it, so a scrape
// during a publication never reads a service that stays pooled as missing. A reader gathers
// while the set moves between {a} and {a, b} a few thousand times: every gather must hold a's
// series (a Reset followed by the Sets, as before, left instants without it), and the last set
// must be exactly the series left.
func TestSetPooledNeverEmpty(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	series := func() map[string]float64 {
		out := map[string]float64{}
		mfs, err := reg.Gather()
		if err != nil {
			t.Error(err)
			return out
		}
		for _, mf := range mfs {
			if mf.GetName() == "edgeflow_xds_service_pooled" {
				for _, s := range mf.GetMetric() {
					out[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
				}
			}
		}
		return out
	}
	m.setPooled([]string{"a"})
	ctx, cancel := context.WithCancel(context.Background())
	var gathers atomic.Int64
	done := make(chan int)
	go func() {
		missing := 0
		for ctx.Err() == nil {
			if series()["a"] != 1 {
				missing++
			}
			gathers.Add(1)
		}
		done <- missing
	}()
	sets := 0
	for ; gathers.Load() < 2000; sets++ { // the writer runs as long as the reader reads
		if sets%2 == 0 {
			m.setPooled([]string{"a", "b"})
		} else {
			m.setPooled([]string{"a"})
		}
	}
	cancel()
	if missing := <-done; missing > 0 {
		t.Errorf("%d of %d gathers during %d sets read no series for a, which stayed pooled throughout", missing, gathers.Load(), sets)
	}
	m.setPooled([]string{"c"})
	if got, want := series(), map[string]float64{"c": 1}; !maps.Equal(got, want) {
		t.Errorf("after setPooled([c]): %v, want %v", got, want)
	}
	m.setPooled(nil)
	if got := series(); len(got) != 0 {
		t.Errorf("after setPooled(nil): %v, want no series", got)
	}
}
