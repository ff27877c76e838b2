package demo

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edgeflow/edgeflow/examples"
	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
	"github.com/edgeflow/edgeflow/optimizer"
)

func bookinfo(t *testing.T) *optimizer.Topology {
	t.Helper()
	topo, err := optimizer.ParseTopology(bytes.NewReader(examples.Bookinfo()), "bookinfo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

// TestRunPolicyFollowsThePlan runs LATA on the bundled Bookinfo through the real xDS server and
// real grpc-go xDS clients, and checks at the callees that every caller pod split its requests
// as planned: each route's observed share within 5 binomial standard errors of its planned
// fraction (plus the 1/10,000 of integer weights); single routes and unplanned routes exact.
func TestRunPolicyFollowsThePlan(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	const rate = 80 // light enough for a shared machine running other tests under -race
	sc := Scenario{
		Cluster: Config{Topology: bookinfo(t), Workers: 1, ServiceTime: 2 * time.Millisecond, Seed: 1},
		Load:    loadgen.Config{Rate: rate, Warmup: 200 * time.Millisecond, Duration: 3 * time.Second, Timeout: 5 * time.Second},
	}
	out, err := RunPolicy(context.Background(), sc, optimizer.LATA)
	if err != nil {
		t.Fatal(err)
	}
	if out.NACKs != 0 {
		t.Errorf("%v xDS NACKs", out.NACKs)
	}
	if out.Plan == nil || out.Plan.Policy != optimizer.LATA {
		t.Fatalf("published plan %+v, want lata", out.Plan)
	}

	sent := map[[3]string]uint64{} // edge + caller → requests
	for _, r := range out.Routes {
		sent[[3]string{r.From, r.To, r.Caller}] += r.N
	}
	observed := map[[4]string]uint64{}
	for _, r := range out.Routes {
		observed[[4]string{r.From, r.To, r.Caller, r.Callee}] = r.N
	}
	planned := map[[4]string]float64{}
	for _, c := range out.Plan.Calls {
		for _, r := range c.Routes {
			planned[[4]string{c.From, c.To, r.Caller, r.Callee}] = r.Fraction
		}
	}
	for k := range observed {
		if _, ok := planned[k]; !ok {
			t.Errorf("%s→%s: %d requests from %s to %s, which the plan does not route", k[0], k[1], observed[k], k[2], k[3])
		}
	}
	for k, f := range planned {
		n := sent[[3]string{k[0], k[1], k[2]}]
		if n == 0 {
			t.Errorf("%s→%s: caller %s sent nothing", k[0], k[1], k[2])
			continue
		}
		got := float64(observed[k]) / float64(n)
		tol := 5*math.Sqrt(f*(1-f)/float64(n)) + 1e-4
		if math.Abs(got-f) > tol {
			t.Errorf("%s→%s: %s → %s: observed %.3f of %d requests, planned %.3f (tolerance %.3f)", k[0], k[1], k[2], k[3], got, n, f, tol)
		}
	}
	if out.Deviation.Requests == 0 {
		t.Error("no deviation computed")
	}

	// Every request is counted once at each hop: each service receives what its callers send.
	// Requests that failed (a machine so starved that they timed out) may have stopped midway.
	if out.Load.Errors > 0 {
		t.Logf("skipping the per-hop counts: %d requests failed (%v); generator lag %v", out.Load.Errors, out.Load.ErrorKinds, out.Load.MaxSendLag)
		goleak.VerifyNone(t, ignore)
		return
	}
	received := map[string]uint64{} // by callee service
	for _, r := range out.Routes {
		received[r.To] += r.N
	}
	fromOutside := map[string]uint64{}
	for pod, st := range out.Pods {
		fromOutside[strings.TrimRight(pod, "-0123456789")] += st.Received[""]
	}
	all := (&loadgen.Schedule{Rate: rate}).Count(sc.Load.Warmup + sc.Load.Duration)
	if fromOutside["productpage"] != uint64(all) {
		t.Errorf("productpage received %d requests from outside, the load generator sent %d", fromOutside["productpage"], all)
	}
	for _, svc := range []string{"details", "reviews"} {
		if received[svc] != uint64(all) {
			t.Errorf("%s received %d calls, want %d (one per productpage request)", svc, received[svc], all)
		}
	}
	if received["ratings"] != received["reviews"] {
		t.Errorf("ratings received %d calls, reviews %d", received["ratings"], received["reviews"])
	}
	// Ingress is spread by smooth weighted round-robin: the three productpage pods differ by
	// at most one request.
	var lo, hi uint64 = math.MaxUint64, 0
	for pod, st := range out.Pods {
		if strings.HasPrefix(pod, "productpage-") {
			lo, hi = min(lo, st.Received[""]), max(hi, st.Received[""])
		}
	}
	if hi-lo > 1 {
		t.Errorf("productpage pods received between %d and %d ingress requests", lo, hi)
	}
	goleak.VerifyNone(t, ignore)
}

// TestInjectedLatency: with no service time and no queueing, the mean end-to-end latency is the
// plan's network latency per request (cost / rate, planned on the scaled latencies) plus the RPCs' own cost, and
// round-robin is slower than LATA by the difference of their plans.
func TestInjectedLatency(t *testing.T) {
	const (
		rate  = 40
		scale = 2
	)
	mean := map[optimizer.Policy]time.Duration{}
	network := map[optimizer.Policy]time.Duration{}
	for _, p := range []optimizer.Policy{optimizer.RoundRobin, optimizer.LATA} {
		sc := Scenario{
			Cluster: Config{Topology: bookinfo(t), Workers: 64, LatencyScale: scale},
			Load:    loadgen.Config{Rate: rate, Warmup: 200 * time.Millisecond, Duration: 2 * time.Second, Timeout: 5 * time.Second},
		}
		out, err := RunPolicy(context.Background(), sc, p)
		if err != nil {
			t.Fatal(err)
		}
		if lag := out.Load.MaxSendLag; lag > 20*time.Millisecond || out.Load.Errors > 0 {
			t.Skipf("machine too busy to measure latency: the load generator fell %v behind, %d errors", lag, out.Load.Errors)
		}
		network[p] = time.Duration(out.Plan.Cost / rate * float64(time.Millisecond)) // planned with the scaled latencies
		mean[p] = out.Load.Latency.Mean()
		// A request never answers before its injected delays. Above them: four loopback RPCs and
		// the sleeps' wake-up lag (one late timer per hop: a pod admits a request at its
		// reception plus the delay), a few ms on a busy machine, more under -race. The injected delay
		// is that of the routes the requests took: grpc-go picks among localities at random by
		// weight, so under round-robin the routes only approach the plan. They are counted over
		// the whole run; the measured requests' share of it lies within bounds of the warm-up's.
		lo, hi := injected(t, sc, out, rate)
		t.Logf("%s: mean latency %v; injected %v to %v, planned %v", p, mean[p], lo, hi, network[p])
		if mean[p] < lo || mean[p] > hi+25*time.Millisecond {
			t.Errorf("%s: mean latency %v, want the injected %v to %v (planned %v) plus a little", p, mean[p], lo, hi, network[p])
		}
	}
	want := network[optimizer.RoundRobin] - network[optimizer.LATA]
	if got := mean[optimizer.RoundRobin] - mean[optimizer.LATA]; got < want*6/10 {
		t.Errorf("round-robin is %v slower than lata, want about %v", got, want)
	}
}

func TestRTT(t *testing.T) {
	m, err := optimizer.Compile(bookinfo(t), optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	n3, _ := m.NodeIndex("n3")
	// An L7 penalty is added unscaled, only in its direction.
	delay := rttFrom(m, n3, 1.5, map[NodePair]time.Duration{{"n2", "n3"}: 3 * time.Millisecond, {"n3", "n1"}: time.Second})
	for from, want := range map[string]time.Duration{
		"n1": 12 * time.Millisecond, // 8 ms × 1.5
		"n2": 12 * time.Millisecond, // 6 ms × 1.5 + 3 ms
		"n3": 0,
		"n4": 6 * time.Millisecond,
		"":   0, // from outside the cluster
		"n9": 0, // unknown
	} {
		if got := delay(from); got != want {
			t.Errorf("delay from %q to n3 = %v, want %v", from, got, want)
		}
	}
}

func TestWithIngressRate(t *testing.T) {
	topo := &optimizer.Topology{Ingress: []optimizer.Ingress{{Service: "a", RPS: 10}, {Service: "b", RPS: 30}}}
	got, err := WithIngressRate(topo, 100)
	if err != nil {
		t.Fatal(err)
	}
	if got.Ingress[0].RPS != 25 || got.Ingress[1].RPS != 75 {
		t.Errorf("ingress %+v, want 25 and 75", got.Ingress)
	}
	if topo.Ingress[0].RPS != 10 {
		t.Error("the input was modified")
	}
	if _, err := WithIngressRate(&optimizer.Topology{}, 100); err == nil {
		t.Error("no ingress: want an error")
	}
}

func TestSplitDeviation(t *testing.T) {
	plan := &optimizer.Allocation{Calls: []optimizer.CallAllocation{{
		From: "a", To: "b",
		Routes: []optimizer.Route{
			{Caller: "a-0", Callee: "b-0", Fraction: 0.75},
			{Caller: "a-0", Callee: "b-1", Fraction: 0.25},
			{Caller: "a-1", Callee: "b-1", Fraction: 1},
		},
	}}}
	tests := []struct {
		name   string
		routes []RouteCount
		want   Deviation
	}{
		{
			name: "exact",
			routes: []RouteCount{
				{From: "a", To: "b", Caller: "a-0", Callee: "b-0", N: 75},
				{From: "a", To: "b", Caller: "a-0", Callee: "b-1", N: 25},
				{From: "a", To: "b", Caller: "a-1", Callee: "b-1", N: 10},
			},
			want: Deviation{PP: 0, Planned: 0.75, Observed: 0.75, From: "a", To: "b", Caller: "a-0", Callee: "b-0", Requests: 100},
		},
		{
			name: "off by 5 pp",
			routes: []RouteCount{
				{From: "a", To: "b", Caller: "a-0", Callee: "b-0", N: 70},
				{From: "a", To: "b", Caller: "a-0", Callee: "b-1", N: 30},
			},
			want: Deviation{PP: 5, Planned: 0.75, Observed: 0.70, From: "a", To: "b", Caller: "a-0", Callee: "b-0", Requests: 100},
		},
		{
			name: "unplanned route",
			routes: []RouteCount{
				{From: "a", To: "b", Caller: "a-1", Callee: "b-0", N: 1},
				{From: "a", To: "b", Caller: "a-1", Callee: "b-1", N: 3},
			},
			want: Deviation{PP: 25, Planned: 0, Observed: 0.25, From: "a", To: "b", Caller: "a-1", Callee: "b-0", Requests: 4},
		},
		{
			name:   "nothing observed",
			routes: nil,
			want:   Deviation{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := SplitDeviation(plan, tc.routes)
			if math.Abs(got.PP-tc.want.PP) > 1e-9 || math.Abs(got.Observed-tc.want.Observed) > 1e-9 {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			got.PP, got.Observed = tc.want.PP, tc.want.Observed
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// injected bounds the mean injected delay of the measured requests of a run: the routes'
// delays are known over the whole run (warm-up included, Routes), and each of the W warm-up
// requests of the T took between 0 and the longest possible (every call edge once, as
// TestLoopback checks, over the longest link).
func injected(t *testing.T, sc Scenario, out *Outcome, rate float64) (lo, hi time.Duration) {
	t.Helper()
	m, err := optimizer.Compile(sc.Cluster.Topology, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	node := map[string]int{}
	for _, svc := range sc.Cluster.Topology.Services {
		for _, pod := range svc.Pods {
			i, ok := m.NodeIndex(pod.Node)
			if !ok {
				t.Fatalf("pod %s on unknown node %s", pod.Name, pod.Node)
			}
			node[pod.Name] = i
		}
	}
	scale := sc.Cluster.LatencyScale
	var total, longest float64 // ms
	for _, r := range out.Routes {
		total += float64(r.N) * m.Latency.At(node[r.Caller], node[r.Callee]) * scale
	}
	for _, l := range sc.Cluster.Topology.Latency {
		longest = max(longest, l.MS*scale)
	}
	maxPerRequest := longest * float64(len(sc.Cluster.Topology.Calls))
	all := float64((&loadgen.Schedule{Rate: rate}).Count(sc.Load.Warmup + sc.Load.Duration))
	warm := float64((&loadgen.Schedule{Rate: rate}).Count(sc.Load.Warmup))
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	return ms(max(0, total-warm*maxPerRequest) / (all - warm)), ms(total / (all - warm))
}
