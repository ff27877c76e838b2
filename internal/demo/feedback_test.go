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
	// Each pod's latest estimate of its own (a pod the plan then spares keeps it; see
	// estimate.SourceLastMeasured).
	latest := func(pod string) (est, lower, n float64, ok bool) {
		for i := len(out.Feedback) - 1; i >= 0; i-- {
			r := out.Feedback[i]
			if e, ok := r.Estimate[pod]; ok {
				return e, r.Lower[pod], r.Requests[pod], true
			}
		}
		return 0, 0, 0, false
	}
	measured := 0
	for _, s := range sc.Cluster.Topology.Services {
		for _, p := range s.Pods {
			est, lower, n, ok := latest(p.Name)
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
			tol := max(0.1, 4/math.Sqrt(n))
			if math.Abs(est-truth) > tol*truth {
				t.Errorf("%s: estimated %.1f req/s over %.0f requests, truth %.1f (±%.0f %%)", p.Name, est, n, truth, 100*tol)
			}
			if !(lower <= est) {
				t.Errorf("%s: lower bound %.1f above the estimate %.1f", p.Name, lower, est)
			}
			t.Logf("%s: estimated %.1f req/s (lower bound %.1f) over %.0f requests, truth %.1f", p.Name, est, lower, n, truth)
		}
	}
	if _, _, _, ok := latest("reviews-0"); !ok || measured < 12 {
		t.Fatalf("%d pods measured (reviews-0 among them: %v); want all 13", measured, ok)
	}
	if lo := out.Feedback[len(out.Feedback)-1].Lower["reviews-0"]; !(lo < 1/service.Seconds()/2) {
		t.Errorf("the plan's last capacity for reviews-0 is %.1f req/s: not its own (slow) one", lo)
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
