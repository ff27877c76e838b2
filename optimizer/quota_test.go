package optimizer

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestQuotaQueueShape: the quota model's cost is convex in the load (its chords' slopes never
// fall: lata-q's linearisation needs it), its sojourn is the request's CPU at no load and grows
// to +Inf at μ, and its wait (beyond the CPU) lies between 0 and M/M/1's at the same μ (c
// servers of μ/c wait less than one of μ) for the pods a Kubernetes limit makes (50m to 4
// cores, 0.2 to 20 ms of CPU a request).
func TestQuotaQueueShape(t *testing.T) {
	for _, limit := range []int64{50, 100, 300, 1000, 4000} {
		for _, cpuMS := range []float64{0.2, 1.1, 5, 20} {
			mu := float64(limit) / 1000 / (cpuMS / 1000)
			q := newPodQueue(mu, limit, 1)
			if got := q.sojourn(0); math.Abs(got-cpuMS/1000) > 1e-12 {
				t.Errorf("limit %dm, %g ms a request: sojourn at no load %v s, want the CPU %v s", limit, cpuMS, got, cpuMS/1000)
			}
			if !math.IsInf(q.sojourn(mu), 1) {
				t.Errorf("limit %dm, %g ms a request: sojourn at μ %v, want +Inf", limit, cpuMS, q.sojourn(mu))
			}
			segs := queueSegments(0, q, 0, 0.99, QueueResolution)
			for i := 1; i < len(segs); i++ {
				if segs[i].slope < segs[i-1].slope*(1-1e-9) {
					t.Fatalf("limit %dm, %g ms a request: slope falls from %v to %v at segment %d: not convex", limit, cpuMS, segs[i-1].slope, segs[i].slope, i)
				}
			}
			for rho := 0.05; rho < 0.99; rho += 0.05 {
				l := rho * mu
				wait, mm1 := q.sojourn(l)-q.cpu, 1/(mu-l)-1/mu
				if !(wait >= 0) || wait > mm1*(1+1e-9) {
					t.Errorf("limit %dm, %g ms a request, ρ %.2f: quota wait %v s, want in [0, M/M/1's %v]", limit, cpuMS, rho, wait, mm1)
				}
			}
		}
	}
}

// quotaBookinfo is the paper preset's first hop (e2e/reproduce PaperApps): 3 entry pods on n1–n3
// sending every request once to details, whose 4 pods (one a node) each have a 100m limit and
// the capacity it gives at 1.1 ms of CPU a request (91 req/s); 4 ms between nodes. limit 0
// leaves the limit out (lata-q's M/M/1 at the same capacity).
func quotaBookinfo(rate float64, limit int64) *Topology {
	top := &Topology{Ingress: []Ingress{{Service: "productpage", RPS: rate}}, Calls: []Call{{From: "productpage", To: "details"}}}
	for i := 1; i <= 4; i++ {
		top.Nodes = append(top.Nodes, Node{Name: fmt.Sprintf("n%d", i)})
		for j := i + 1; j <= 4; j++ {
			top.Latency = append(top.Latency, Latency{From: fmt.Sprintf("n%d", i), To: fmt.Sprintf("n%d", j), MS: 4})
		}
	}
	pp := Service{Name: "productpage"}
	for i := 1; i <= 3; i++ {
		pp.Pods = append(pp.Pods, Pod{Name: fmt.Sprintf("productpage-%d", i), Node: fmt.Sprintf("n%d", i)})
	}
	mu := 0.1 / 0.0011
	details := Service{Name: "details", CPU: 100, CPULimit: limit, CapacityRPS: &mu}
	for i := 1; i <= 4; i++ {
		details.Pods = append(details.Pods, Pod{Name: fmt.Sprintf("details-%d", i), Node: fmt.Sprintf("n%d", i)})
	}
	top.Services = []Service{pp, details}
	return top
}

// firstHopAcross plans top (quotaBookinfo's) by lata-q and returns the share of its one call
// edge's requests that cross nodes and each callee's load, req/s.
func firstHopAcross(t *testing.T, top *Topology) (float64, map[string]float64) {
	t.Helper()
	m, err := Compile(top, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := Plan(m, LATAQ)
	if err != nil {
		t.Fatal(err)
	}
	var cross, total float64
	load := map[string]float64{}
	for _, r := range a.Calls[0].Routes {
		if r.LatencyMS > 0 {
			cross += r.RPS
		}
		total += r.RPS
		load[r.Callee] += r.RPS
	}
	return cross / total, load
}

// TestLATAQKeepsQuotaPodsLocal: lata-q on the paper preset's first hop. With the pods' CPU
// limit it keeps every call on its node while the local pods' quota has room (100 req/s:
// 33 a pod, 37 % of μ; Localization measured no throttling there), where M/M/1 at the same
// capacity moves calls to the idle fourth pod across the network; at 300 req/s (100 a pod
// locally, past μ) both spread, and no pod passes the utilisation cap.
func TestLATAQKeepsQuotaPodsLocal(t *testing.T) {
	remote := func(rate float64, limit int64) (float64, map[string]float64) {
		t.Helper()
		return firstHopAcross(t, quotaBookinfo(rate, limit))
	}
	quota, _ := remote(100, 100)
	mm1, _ := remote(100, 0)
	t.Logf("100 req/s: calls across nodes, quota model %.1f %%, M/M/1 %.1f %%", 100*quota, 100*mm1)
	if quota > 0.01 {
		t.Errorf("100 req/s, 100m pods: %.1f %% of the calls cross nodes; want every call local (the quota has room)", 100*quota)
	}
	if mm1 < 0.05 {
		t.Errorf("100 req/s without the limit (M/M/1): %.1f %% cross; the test no longer tells the models apart", 100*mm1)
	}
	for _, limit := range []int64{100, 0} {
		share, load := remote(200, limit)
		t.Logf("200 req/s, limit %dm: %.1f %% across nodes, loads %v", limit, 100*share, load)
		share, load = remote(300, limit)
		t.Logf("300 req/s, limit %dm: %.1f %% across nodes, loads %v", limit, 100*share, load)
		for pod, l := range load {
			if l > DefaultUtilizationCap*0.1/0.0011*(1+1e-6) {
				t.Errorf("300 req/s, limit %dm: %s at %.1f req/s, past the cap", limit, pod, l)
			}
		}
		if share < 0.2 {
			t.Errorf("300 req/s, limit %dm: %.1f %% across nodes; the local pods cannot take 100 req/s each", limit, 100*share)
		}
	}
}

// TestQueueScaleLowersTheWait: a service's queue_scale prices that share of the quota model's
// wait (s + κ·wait, convex still), is rejected outside (0, 1], and moves lata-q's plan on the
// paper preset's first hop toward the nodes' own pods as κ falls, never past the cap. At 200
// req/s (67 req/s a local pod, 74 % of μ) the share across nodes is 24.1 % at κ = 1, 19.5 % at
// 0.2 (about what the simulated quota waits under Poisson arrivals) and 3.2 % at 0.05; at 300
// req/s the local pods' cap holds it at 25 %.
func TestQueueScaleLowersTheWait(t *testing.T) {
	mu := 0.1 / 0.0011
	full, scaled := newPodQueue(mu, 100, 1), newPodQueue(mu, 100, 0.2)
	for rho := 0.1; rho < 0.99; rho += 0.1 {
		l := rho * mu
		if got, want := scaled.sojourn(l)-scaled.cpu, 0.2*(full.sojourn(l)-full.cpu); math.Abs(got-want) > 1e-12 {
			t.Errorf("ρ %.1f: scaled wait %v s, want 0.2 × %v", rho, got, full.sojourn(l)-full.cpu)
		}
	}
	segs := queueSegments(0, scaled, 0, 0.99, QueueResolution)
	for i := 1; i < len(segs); i++ {
		if segs[i].slope < segs[i-1].slope*(1-1e-9) {
			t.Fatalf("scaled model: slope falls from %v to %v at segment %d: not convex", segs[i-1].slope, segs[i].slope, i)
		}
	}
	for _, bad := range []float64{-0.5, 1.5, math.NaN()} {
		top := quotaBookinfo(100, 100)
		top.Services[1].QueueScale = bad
		if _, err := Compile(top, Options{}); err == nil || !strings.Contains(err.Error(), "queue_scale") {
			t.Errorf("queue_scale %v: Compile said %v, want an error naming queue_scale", bad, err)
		}
	}
	across := func(rate, scale float64) (float64, map[string]float64) {
		t.Helper()
		top := quotaBookinfo(rate, 100)
		top.Services[1].QueueScale = scale
		return firstHopAcross(t, top)
	}
	for _, rate := range []float64{200, 300} {
		last := 2.0
		for _, scale := range []float64{1, 0.5, 0.2, 0.05} {
			share, load := across(rate, scale)
			t.Logf("%g req/s, queue_scale %g: %.1f %% across nodes, loads %v", rate, scale, 100*share, load)
			if share > last+1e-9 {
				t.Errorf("%g req/s, queue_scale %g: %.1f %% across, more than at a higher scale (%.1f %%)", rate, scale, 100*share, 100*last)
			}
			last = share
			for pod, l := range load {
				if l > DefaultUtilizationCap*mu*(1+1e-6) {
					t.Errorf("%g req/s, queue_scale %g: %s at %.1f req/s, past the cap", rate, scale, pod, l)
				}
			}
		}
	}
	// The scaler's floor is what a pod that measured no wait gets (a constant stream under its
	// quota): the plan is then nearly Localization's.
	if share, _ := across(200, 0.05); share > 0.05 {
		t.Errorf("200 req/s, queue_scale 0.05 (the WaitScaler's floor): %.1f %% across; want at most 5 %%", 100*share)
	}
	if lo, _ := across(200, 0.2); lo >= func() float64 { hi, _ := across(200, 1); return hi }() {
		t.Errorf("200 req/s: queue_scale 0.2 sends %.1f %% across, no fewer than the whole model", 100*lo)
	}
}
