package watcher

import (
	"math"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// The penalty world: two nodes 2 ms apart (ICMP) where requests from n1 to n2 pay 3 ms more;
// web calls api, one pod of each on each node; each caller's attempts take the callee band's
// inbound time (5 ms) plus 1 ms of overhead plus the way there and back.
const (
	pwInboundMS  = 5.0
	pwOverheadMS = 1.0
	pwRTTMS      = 2.0
	pwPenaltyMS  = 3.0
	pwWindow     = 30 * time.Second
)

func penaltyTopology() *optimizer.Topology {
	return &optimizer.Topology{Nodes: []optimizer.Node{{Name: "n1"}, {Name: "n2"}}, Latency: []optimizer.Latency{{From: "n1", To: "n2", MS: pwRTTMS}, {From: "n2", To: "n1", MS: pwRTTMS}}}
}

// penaltyWindow is one window of the world's telemetry at at, as prom.Source delivers it.
func penaltyWindow(at time.Time) *prom.Measurements {
	band := func(node string) string { return prom.Locality{Zone: node, SubZone: "edgeflow/band"}.String() }
	attempt := func(pod, node string, ms float64) prom.Attempt {
		return prom.Attempt{Namespace: "default", Pod: pod, Target: "xds:///api", Locality: band(node), Attempts: 200, Seconds: 200 * ms / 1000}
	}
	local := pwInboundMS + pwOverheadMS
	return &prom.Measurements{
		AttemptsRead: true, Window: pwWindow, At: at,
		Attempts: []prom.Attempt{
			attempt("web-1", "n1", local), attempt("web-1", "n2", local+pwRTTMS+pwPenaltyMS),
			attempt("web-2", "n2", local), attempt("web-2", "n1", local+pwRTTMS),
			// Left out: a caller edgeflow does not manage, a target that is no managed service,
			// a locality that names no node (LBLeastRequest's), one that does not parse.
			attempt("loadgen-1", "n2", 50), {Namespace: "default", Pod: "web-1", Target: "xds:///elsewhere", Locality: band("n2"), Attempts: 200, Seconds: 10},
			{Namespace: "default", Pod: "web-1", Target: "xds:///api", Locality: prom.Locality{SubZone: "edgeflow/all"}.String(), Attempts: 200, Seconds: 10},
			{Namespace: "default", Pod: "web-1", Target: "xds:///api", Locality: "n2", Attempts: 200, Seconds: 10},
		},
		Load: []prom.PodLoad{
			{Namespace: "default", Pod: "api-1", Window: pwWindow, Requests: 400, InboundMSSum: 400 * pwInboundMS},
			{Namespace: "default", Pod: "api-2", Window: pwWindow, Requests: 400, InboundMSSum: 400 * pwInboundMS},
		},
	}
}

func latencyOf(t *optimizer.Topology, from, to string) float64 {
	for _, l := range t.Latency {
		if l.From == from && l.To == to {
			return l.MS
		}
	}
	return math.NaN()
}

// The live latency correction: windows of call attempts and pod loads find the hidden 3 ms on
// n1→n2 (within the corrector's rules: from its third window) and only there; the topology
// carries it and the metric shows it; series that name no caller, service or node are left
// out; a window in which the plan in force changed is held; a round without attempts read,
// one inside the window last fed, and a topology per zone feed nothing.
func TestLiveLatencyCorrection(t *testing.T) {
	t.Parallel()
	corr, err := estimate.NewLatencyCorrector(estimate.LatencyConfig{MinRequests: 100})
	if err != nil {
		t.Fatal(err)
	}
	var published *optimizer.Allocation
	plan := func() (*optimizer.Topology, *optimizer.Allocation) { return nil, published }
	c, reg := newCluster(t, LiveConfig{Prom: fakePromSource(t, &fakeProm{}), Latency: corr, Plan: plan})
	ks := state([]string{"n1", "n2"}, service("web", "web-1@n1", "web-2@n2"), service("api", "api-1@n1", "api-2@n2"))
	start := time.Unix(1_800_000_000, 0)
	feed := func(i int) *optimizer.Topology {
		return c.correctLatency(ks, penaltyWindow(start.Add(time.Duration(i)*pwWindow)), penaltyTopology())
	}
	for i := range 2 {
		if got := latencyOf(feed(i), "n1", "n2"); got != pwRTTMS {
			t.Fatalf("window %d: n1→n2 %v ms before MinWindows windows, want the ICMP %v", i+1, got, pwRTTMS)
		}
	}
	top := feed(2)
	if got := latencyOf(top, "n1", "n2"); math.Abs(got-(pwRTTMS+pwPenaltyMS)) > 0.01 {
		t.Errorf("n1→n2 %v ms after 3 windows, want ICMP + penalty = %v", got, pwRTTMS+pwPenaltyMS)
	}
	if got := latencyOf(top, "n2", "n1"); got != pwRTTMS {
		t.Errorf("n2→n1 %v ms, want the ICMP %v (no penalty there)", got, pwRTTMS)
	}
	if got := metric(t, reg, "edgeflow_closed_loop_latency_penalty_seconds", "source_node", "n1", "target_node", "n2"); math.Abs(got*1000-pwPenaltyMS) > 0.01 {
		t.Errorf("penalty metric n1→n2 = %v, want %v", got, pwPenaltyMS)
	}
	if got := metric(t, reg, "edgeflow_closed_loop_latency_excess_seconds", "source_node", "n1", "target_node", "n2"); math.Abs(got*1000-pwPenaltyMS) > 0.01 {
		t.Errorf("excess metric n1→n2 = %v, want the estimate %v", got, pwPenaltyMS)
	}

	// Fed nothing: a round inside the window last fed, a round without attempts, a zone topology.
	before := c.latFeed.fedAt
	c.correctLatency(ks, penaltyWindow(start.Add(2*pwWindow+time.Second)), penaltyTopology())
	noAttempts := penaltyWindow(start.Add(3 * pwWindow))
	noAttempts.AttemptsRead = false
	c.correctLatency(ks, noAttempts, penaltyTopology())
	zone := penaltyTopology()
	zone.LatencyGranularity = optimizer.LatencyPerZone
	if got := c.correctLatency(ks, penaltyWindow(start.Add(3*pwWindow)), zone); latencyOf(got, "n1", "n2") != pwRTTMS {
		t.Errorf("a per-zone topology took a node pair's penalty: %v", got.Latency)
	}
	if c.latFeed.fedAt != before {
		t.Errorf("fed at %v, want nothing fed after %v", c.latFeed.fedAt, before)
	}

	// The plan in force changes: that window is held (an idle round: nothing moves), the
	// penalty stays in force.
	published = &optimizer.Allocation{}
	r := c.latFeed.feed(ks, penaltyWindow(start.Add(4*pwWindow)), penaltyTopology())
	if !r.fed || !r.held {
		t.Errorf("window with a new plan: fed %v held %v, want fed and held", r.fed, r.held)
	}
	if got := c.latFeed.inForce()[estimate.NodePair{From: "n1", To: "n2"}]; math.Abs(got-pwPenaltyMS) > 0.01 {
		t.Errorf("penalty in force after a held window %v, want %v", got, pwPenaltyMS)
	}
}

// A serve that starts (each slice of the reproduction starts one; a restart, a failover) takes
// the penalty from Prometheus's history at once: the windows of history are fed before the first
// live one, never held, and not at all while no latency is measured (nothing to subtract).
func TestLiveLatencyCorrectionFromHistory(t *testing.T) {
	t.Parallel()
	corr, err := estimate.NewLatencyCorrector(estimate.LatencyConfig{MinRequests: 100})
	if err != nil {
		t.Fatal(err)
	}
	plan := func() (*optimizer.Topology, *optimizer.Allocation) { return nil, &optimizer.Allocation{} } // a new plan every time
	c, reg := newCluster(t, LiveConfig{Prom: fakePromSource(t, &fakeProm{}), Latency: corr, Plan: plan})
	ks := state([]string{"n1", "n2"}, service("web", "web-1@n1", "web-2@n2"), service("api", "api-1@n1", "api-2@n2"))
	start := time.Unix(1_800_000_000, 0)
	var history []*prom.Measurements
	for i := range 3 {
		history = append(history, penaltyWindow(start.Add(time.Duration(i)*pwWindow)))
	}
	c.feedLatencyHistory(ks, history, penaltyTopology())
	if n := len(c.latFeed.inForce()); n != 0 {
		t.Errorf("%d penalties from history fed before any latency was measured, want none", n)
	}
	c.mu.Lock()
	c.latency.usable = true
	c.mu.Unlock()
	c.feedLatencyHistory(ks, history, penaltyTopology())
	if got := c.latFeed.inForce()[estimate.NodePair{From: "n1", To: "n2"}]; math.Abs(got-pwPenaltyMS) > 0.01 {
		t.Errorf("penalty n1→n2 after 3 windows of history %v ms, want %v (history is never held)", got, pwPenaltyMS)
	}
	if got := metric(t, reg, "edgeflow_closed_loop_latency_penalty_seconds", "source_node", "n1", "target_node", "n2"); math.Abs(got*1000-pwPenaltyMS) > 0.01 {
		t.Errorf("penalty metric n1→n2 = %v s, want %v ms", got, pwPenaltyMS)
	}
	top := c.correctLatency(ks, penaltyWindow(start.Add(2*pwWindow+time.Second)), penaltyTopology()) // inside the last window: not fed
	if got := latencyOf(top, "n1", "n2"); math.Abs(got-(pwRTTMS+pwPenaltyMS)) > 0.01 {
		t.Errorf("first live topology: n1→n2 %v ms, want %v", got, pwRTTMS+pwPenaltyMS)
	}
}
