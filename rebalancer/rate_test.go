package rebalancer

import (
	"context"
	"io"
	"log/slog"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeflow/edgeflow/internal/kubetest"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
)

func TestRateMoved(t *testing.T) {
	for _, tc := range []struct {
		ref, now, change float64
		want             bool
	}{
		{100, 100, 0.25, false},
		{100, 125, 0.25, false}, // at the band's edge: not out of it
		{100, 126, 0.25, true},
		{100, 74, 0.25, true},
		{100, 300, 0.25, true},
		{100, 300, -1, false}, // never
		{0, 0, 0.25, false},
		{0, 5, 0.25, true},
		{100, math.NaN(), 0.25, false},
	} {
		if got := rateMoved(tc.ref, tc.now, tc.change); got != tc.want {
			t.Errorf("rateMoved(%v, %v, %v) = %v, want %v", tc.ref, tc.now, tc.change, got, tc.want)
		}
	}
}

// TestReplanOnRate: a plan records the offered rate it was made at; the controller plans again
// once the rate leaves the band around it (not within it, not before any plan), and the
// reference moves with every plan.
func TestReplanOnRate(t *testing.T) {
	t.Parallel()
	var rps atomic.Value
	rps.Store(100.0)
	topology := func() *optimizer.Topology {
		return &optimizer.Topology{
			Nodes:    []optimizer.Node{{Name: "n1", CPU: 4000}},
			Services: []optimizer.Service{{Name: "web", Namespace: "shop", CPU: 100, Pods: []optimizer.Pod{{Name: "web-0", Node: "n1"}}}},
			Ingress:  []optimizer.Ingress{{Service: "web.shop", RPS: rps.Load().(float64)}},
		}
	}
	reg := prometheus.NewRegistry()
	c := started(t, Config{Topology: topology, DryRun: true, Registerer: reg})
	if c.replanForRate() {
		t.Fatal("re-plan before any plan")
	}
	if _, err := c.Plan(); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		rps  float64
		want bool
	}{{110, false}, {80, false}, {300, true}} {
		rps.Store(step.rps)
		if got := c.replanForRate(); got != step.want {
			t.Fatalf("planned at 100, now %v: re-plan %v, want %v", step.rps, got, step.want)
		}
	}
	if n := testutil.ToFloat64(c.metrics.rateReplans); n != 1 {
		t.Fatalf("edgeflow_rebalance_rate_replans_total %v, want 1", n)
	}
	if _, err := c.Plan(); err != nil { // planned at 300 now
		t.Fatal(err)
	}
	if c.replanForRate() {
		t.Fatal("re-plan at the rate just planned at")
	}
	rps.Store(220.0)
	if !c.replanForRate() {
		t.Fatal("no re-plan after 300 → 220")
	}
	never := started(t, Config{Topology: topology, DryRun: true, RateChange: -1})
	if _, err := never.Plan(); err != nil {
		t.Fatal(err)
	}
	rps.Store(1000.0)
	if never.replanForRate() {
		t.Fatal("RateChange < 0 re-planned")
	}
}

// TestRunReplansOnRate: the running controller (dry-run) plans once, and again soon after the
// rate triples, long before its period (that it does not within the band: TestReplanOnRate).
func TestRunReplansOnRate(t *testing.T) {
	t.Parallel()
	var rps atomic.Value
	rps.Store(100.0)
	cfg := Config{Client: kubetest.NewClientset(), Selector: "edgeflow.io/managed=true", DryRun: true,
		Period: time.Hour, RateCheck: 10 * time.Millisecond, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Topology: func() *optimizer.Topology {
			return &optimizer.Topology{
				Nodes:    []optimizer.Node{{Name: "n1", CPU: 4000}},
				Services: []optimizer.Service{{Name: "web", Namespace: "shop", CPU: 100, Pods: []optimizer.Pod{{Name: "web-0", Node: "n1"}}}},
				Ingress:  []optimizer.Ingress{{Service: "web.shop", RPS: rps.Load().(float64)}},
			}
		}}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, LeaderConfig{}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	runs := func() float64 { return testutil.ToFloat64(c.metrics.runs.WithLabelValues("ok")) }
	testkit.Eventually(t, 10*time.Second, "the first plan", func() bool { return runs() == 1 })
	rps.Store(300.0)
	testkit.Eventually(t, 10*time.Second, "a plan after the rate tripled", func() bool { return runs() == 2 })
	if n := testutil.ToFloat64(c.metrics.rateReplans); n != 1 {
		t.Fatalf("rate re-plans %v, want 1", n)
	}
}
