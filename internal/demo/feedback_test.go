package demo

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
	"github.com/edgeflow/edgeflow/optimizer"
)

// TestClosedLoopLearnsCapacity: the closed-loop row starts without any service rate, reads the
// pods' /metrics each window and estimates every pod's capacity within ±10 % of the truth —
// including reviews-0, three times slower than its peers, which nothing tells it — and the xDS
// server then plans with the measured capacities (lata-q's queueing term), holding a window
// after each publication.
func TestClosedLoopLearnsCapacity(t *testing.T) {
	const (
		service = 4 * time.Millisecond
		slow    = 3.0
		rate    = 240
	)
	sc := Scenario{
		Cluster: Config{Topology: bookinfo(t), Workers: 1, ServiceTime: service, Seed: 3,
			PodSlowdown: map[string]float64{"reviews-0": slow}},
		Load:           loadgen.Config{Rate: rate, Warmup: 200 * time.Millisecond, Duration: 10 * time.Second, Timeout: 5 * time.Second},
		FeedbackWindow: time.Second,
	}
	// The topology the stack gets says nothing of capacity (and would be ignored if it did).
	sc.Cluster.Topology = WithServiceRates(sc.Cluster.Topology, 1, service)
	out, err := RunPolicy(context.Background(), sc, optimizer.ClosedLoop)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Feedback) == 0 {
		t.Fatal("the closed loop ran no window")
	}
	last := out.Feedback[len(out.Feedback)-1]
	measured := 0
	for _, s := range sc.Cluster.Topology.Services {
		for _, p := range s.Pods {
			est, ok := last.Estimate[p.Name]
			if !ok {
				continue
			}
			measured++
			truth := 1 / service.Seconds()
			if p.Name == "reviews-0" {
				truth /= slow
			}
			// The estimate is a mean of n exponential service times: its relative standard
			// error is 1/√n. Within ±10 % once n ≥ 1,600 (4 standard errors), else 4/√n.
			n := last.Requests[p.Name]
			tol := max(0.1, 4/math.Sqrt(n))
			if math.Abs(est-truth) > tol*truth {
				t.Errorf("%s: estimated %.1f req/s over %.0f requests, truth %.1f (±%.0f %%)", p.Name, est, n, truth, 100*tol)
			}
			t.Logf("%s: estimated %.1f req/s (lower bound %.1f) over %.0f requests, truth %.1f", p.Name, est, last.Lower[p.Name], n, truth)
			if lo := last.Lower[p.Name]; !(lo <= est) {
				t.Errorf("%s: lower bound %.1f above the estimate %.1f", p.Name, lo, est)
			}
		}
	}
	if _, ok := last.Estimate["reviews-0"]; !ok || measured < 8 {
		t.Fatalf("last window measured %d pods (reviews-0 among them: %v); want reviews-0 and at least 8: %+v", measured, ok, last)
	}
	var updated, held int
	for _, r := range out.Feedback {
		if r.Updated {
			updated++
		}
		if r.Held {
			held++
		}
	}
	if updated == 0 || held == 0 {
		t.Errorf("%d windows updated the server, %d held; want both (a publication is followed by a held window)", updated, held)
	}
	if out.Plan == nil || out.Plan.Policy != optimizer.ClosedLoop || !(out.Plan.QueueCost > 0) {
		t.Fatalf("published plan %+v; want closed-loop, planned with measured capacities (queueing cost > 0)", out.Plan)
	}
}
