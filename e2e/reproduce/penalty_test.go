package reproduce

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The hidden L7 penalties of TestClosedLoopFindsL7PenaltyOnTestbed: the scenario (C),
// +3 ms on one node pair; then one large enough that routing around it pays.
const (
	penaltyMS      = 3.0
	largePenaltyMS = 12.0
)

// TestClosedLoopFindsL7PenaltyOnTestbed is scenario (C) of the closed loop as a user runs it:
// the closed loop's application and load of TestClosedLoopOnTestbed on the flat testbed, the
// callers' real grpc-go attempt metric by locality scraped by a real Prometheus, `edgeflow serve
// --policy closed-loop` with its call-attempt queries at their defaults. Once serve has planned,
// the remote node pair that carries the most planned traffic from front to back is given a
// hidden 3 ms: TCP between the two nodes pays it, ICMP does not (testbed.SetTCPPenalty), and
// nothing tells edgeflow. It checks, reading what serve exposes:
//
//	(C1) serve holds a penalty on that pair, in the direction the traffic goes, no more than
//	     1 ms above 3 ms over what the pair paid before, while its estimate of the pair's
//	     excess (edgeflow_closed_loop_latency_excess_seconds: beyond ICMP and the baseline)
//	     is within ±1 ms of 3 ms over what the pair paid before (the excess read just before
//	     the penalty is hidden: up to ~1.5 ms on this testbed, under the corrector's floor);
//	     and no pair the penalty does not touch holds one above 1 ms. The estimate is
//	     checked, not the penalty in force, because the penalty enters as the estimate climbs
//	     through its windows and then moves only by more than the estimate's confidence band
//	     (estimate.LatencyCorrector's hysteresis). A local run's entered at 2.05 ms over the
//	     pair's before, 0.05 ms inside the old ±1 ms on the penalty in force; the project's
//	     CI failed this test on 75e5295 after 394 s, which fits that check's 24 windows
//	     running out (the log that would say was cut);
//	(C2) with the penalty raised to 12 ms the plan moves traffic off the pair (its planned
//	     req/s falls below what it was: it moves as the estimate climbs through its windows),
//	     and from that move on the pair's estimate is within ±15 % of 12 ms over what it paid
//	     before (the estimates of 3 ms in five runs were 2.3–3.5 ms: ±1 ms at 12 ms is tighter
//	     than the estimate's own bias from the measured ICMP and the baseline). The estimate,
//	     not the penalty in force, for (C1)'s reason, and because the move ends the pair's
//	     measurement: a plan that leaves a pair under the sample floor (a run here: 9–15
//	     req/s, 90–150 attempts a window against 200) stops its windows, the rounds after the
//	     move still estimate it on its newest windows (all taken after the raise) and then the
//	     penalty decays. The project's CI failed the old check on the penalty in force on
//	     aa7e61f: it entered at 10.17 ms on the climb (+ 0.32 ms before; the band starts at
//	     10.52), the hysteresis band held it there, and the pair's data then thinned.
//
// Why two steps: on the flat testbed a caller whose node has no callee pod pays the same 2 ms
// to every other node, so routing around 3 ms means swapping with a caller that now sends
// locally, for a saving of about 0.3 ms a request against a plan whose objective is mostly
// queueing: less than the closed loop's damping (a push must gain 1 % of lata-q's objective),
// so the plan rightly stays (the first run of this test: 2.32 ms found, no push). 12 ms makes
// the detour worth it.
func TestClosedLoopFindsL7PenaltyOnTestbed(t *testing.T) {
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	h := NewHarness(t, ctx, "flat", t.Output())
	h.Deploy(loopApp, Workload{Workers: 1, ServiceTime: loopService, Metrics: true})
	s := h.Serve(loopApp, Policy{Name: "closed-loop", Allocation: "closed-loop", LB: "bands"}, loopRate,
		"--prometheus-window", loopWindow.String(), "--log-level", "info")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve's log's tail:\n%s", s.tail())
		}
	})
	nodeOf := h.podNodes()
	t.Logf("set up in %v: pods by node %v", time.Since(begin).Round(time.Second), nodeOf)
	load := h.startLoad(t, loopApp, loopRate)

	// The pair: the remote (caller node, callee node) with the most planned front → back req/s
	// once the plan is on measured capacities (estimates of every pod, as TestClosedLoopOnTestbed's (b)).
	pods := append(h.podsOf("front"), h.podsOf("back")...)
	var flows map[[2]string]float64
	h.eventually(16*loopWindow, "every pod's capacity estimated", func() bool {
		st, err := readLoop(s, h.podsOf("back"))
		if err != nil || !st.estimated(pods) {
			return false
		}
		flows, err = plannedFlows(s, nodeOf)
		return err == nil
	})
	var pair [2]string
	for p, rps := range flows {
		if p[0] != p[1] && (pair == [2]string{} || rps > flows[pair] || rps == flows[pair] && p[0]+p[1] < pair[0]+pair[1]) {
			pair = p
		}
	}
	if flows[pair] <= 0 {
		t.Fatalf("no remote front → back traffic in the plan to hide a penalty on: %v", flows)
	}
	before := flows[pair]
	// What the pair pays already beyond its ICMP RTT and the baseline, which the penalty adds to:
	// the corrector's estimate (edgeflow_closed_loop_latency_excess_seconds) before it is hidden.
	// On this testbed a remote call's overhead is not a same-node call's (up to ~1.5 ms on a busy
	// pair; docs/closed-loop-testbed.md), and a project CI run found 4.03 ms for the hidden 3.
	// The mean of preRounds readings a window apart: the first estimate rests on 3 windows
	// (MinWindows), and the CI run of 952bf17 read −0.96 ms from it and then found the 3 ms as
	// 3.61, more than 1 ms over 3 − 0.96.
	const preRounds = 4
	var pre float64
	var preRead []string
	for i := range preRounds {
		if i > 0 {
			select {
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(loopWindow):
			}
		}
		var ms float64
		h.eventually(8*loopWindow, fmt.Sprintf("the excess of %s → %s measured before the penalty", pair[0], pair[1]), func() bool {
			ex, err := serveGauge(s, "edgeflow_closed_loop_latency_excess_seconds")
			var ok bool
			ms, ok = ex[pair]
			return err == nil && ok
		})
		pre += ms / preRounds
		preRead = append(preRead, fmt.Sprintf("%.2f", ms))
	}
	if err := h.tb.SetTCPPenalty(pair[0], pair[1], penaltyMS); err != nil {
		t.Fatal(err)
	}
	hidden := time.Now()
	t.Logf("planned flows before (req/s, caller node → callee node): %v; the pair's excess before %.2f ms (the mean of %s, a window apart); hid %g ms on TCP %s → %s (so on every request between them)",
		flows, pre, strings.Join(preRead, ", "), penaltyMS, pair[0], pair[1])

	// (C1) Found, estimated within ±1 ms, and nowhere else. The reverse direction pays it too
	// (the responses of its requests cross pair[0] → pair[1]), so it may be found there as well.
	var penalties, excess map[[2]string]float64
	h.eventually(24*loopWindow, fmt.Sprintf("(C1) a penalty in force on %s → %s and its estimate within ±1 ms of %g ms (+ %.2f ms before)", pair[0], pair[1], penaltyMS, pre), func() bool {
		var err error
		if penalties, err = servePenalties(s); err != nil {
			return false
		}
		if excess, err = serveGauge(s, "edgeflow_closed_loop_latency_excess_seconds"); err != nil {
			return false
		}
		return penalties[pair] > 0 && math.Abs(excess[pair]-pre-penaltyMS) <= 1
	})
	found := time.Since(hidden)
	// The penalty in force against the hidden one, and its excess before where that was
	// positive: a negative excess before (a pair paying less than its baseline says) may not
	// last under the penalty. The CI runs of 04a6028 and d75d5a7 read −0.96 and −0.98 ms before
	// (the latter the mean of 4 readings, −1.14 to −0.72), found the 3 ms as 3.61 and 3.22 with
	// the estimate at 2.44 and 2.85, and failed a bound of 3 − 0.96 + 1 and 3 − 0.98 + 1.
	if limit := penaltyMS + max(pre, 0) + 1; penalties[pair] > limit {
		t.Errorf("(C1) a penalty of %.2f ms in force on %s → %s, more than 1 ms over the %g ms hidden (+ %.2f ms before, where positive)", penalties[pair], pair[0], pair[1], penaltyMS, pre)
	}
	for p, ms := range penalties {
		if p != pair && p != [2]string{pair[1], pair[0]} && ms > 1 {
			t.Errorf("(C1) a penalty of %.2f ms on %s → %s, which pays none", ms, p[0], p[1])
		}
	}
	t.Logf("(C1) penalties in force %v ms, the pair's estimate %.2f ms, %v after the penalty was hidden (%.1f windows of %v)", penalties,
		excess[pair], found.Round(time.Second), found.Seconds()/loopWindow.Seconds(), loopWindow)

	if f, err := plannedFlows(s, nodeOf); err == nil {
		t.Logf("(C1) planned flows with %g ms found (req/s): %v", penaltyMS, f)
	}

	// (C2) 12 ms: found, and traffic off the pair.
	if err := h.tb.SetTCPPenalty(pair[0], pair[1], largePenaltyMS); err != nil {
		t.Fatal(err)
	}
	raised, progress := time.Now(), time.Now()
	h.eventually(24*loopWindow, fmt.Sprintf("(C2) the planned req/s on %s → %s below %.1f", pair[0], pair[1], before), func() bool {
		f, err := plannedFlows(s, nodeOf)
		if err != nil {
			return false
		}
		flows = f
		if time.Since(progress) >= loopWindow {
			progress = time.Now()
			p, _ := servePenalties(s)
			t.Logf("(C2) %v after raising it: penalties in force %v ms; planned on the pair %.1f req/s", time.Since(raised).Round(time.Second), p, flows[pair])
		}
		return flows[pair] < before-1
	})
	moved := time.Since(raised)
	p, _ := servePenalties(s)
	t.Logf("(C2) planned flows after (req/s): %v; %s → %s %.1f → %.1f, %v after it was raised; penalties in force then %v ms",
		flows, pair[0], pair[1], before, flows[pair], moved.Round(time.Second), p)
	// The estimate from the move on: the rounds that follow it still rest on the pair's newest
	// windows (all taken after the raise), until the pair's thinned data leaves it unmeasured.
	var seen []string // the pair's estimates read, each once, for the log
	last := math.NaN()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("(C2) the pair's estimates read from the move on: %s ms", strings.Join(seen, ", "))
		}
	})
	h.eventually(12*loopWindow, fmt.Sprintf("(C2) serve's estimate of %s → %s within ±15 %% of %g ms (+ %.2f ms before)", pair[0], pair[1], largePenaltyMS, pre), func() bool {
		ex, err := serveGauge(s, "edgeflow_closed_loop_latency_excess_seconds")
		if err != nil {
			return false
		}
		e, ok := ex[pair]
		if !ok {
			if !math.IsNaN(last) {
				seen, last = append(seen, "unmeasured"), math.NaN()
			}
			return false
		}
		if e != last {
			seen, last = append(seen, fmt.Sprintf("%.2f", e)), e
		}
		return math.Abs(e-pre-largePenaltyMS) <= 0.15*largePenaltyMS
	})
	penalties, _ = servePenalties(s)
	t.Logf("(C2) the pair's estimates read from the move on: %s ms; penalties in force %v ms, %v after it was raised", strings.Join(seen, ", "),
		penalties, time.Since(raised).Round(time.Second))

	sent, failed := load()
	t.Logf("load: %d requests at %.0f req/s, %d failed; test %v", sent, loopRate, failed, time.Since(begin).Round(time.Second))
	if float64(failed) > smokeErrorShare*float64(sent) {
		t.Errorf("%d of %d requests failed, more than %.0f %%", failed, sent, 100*smokeErrorShare)
	}
}

// podNodes returns the node of every pod of the namespace, by pod name.
func (h *Harness) podNodes() map[string]string {
	l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range l.Items {
		out[p.Name] = p.Spec.NodeName
	}
	return out
}

// plannedFlows reads serve's plan in force and sums its req/s by (caller's node, callee's node).
func plannedFlows(s *proc, nodeOf map[string]string) (map[[2]string]float64, error) {
	snap, err := snapshot(s.ui)
	if err != nil {
		return nil, err
	}
	out := map[[2]string]float64{}
	for _, e := range snap.Edges {
		for _, r := range e.Routes {
			from, to := nodeOf[strings.TrimSuffix(r.Caller, "."+ns)], nodeOf[strings.TrimSuffix(r.Callee, "."+ns)]
			if from == "" || to == "" {
				return nil, fmt.Errorf("route %s → %s: a pod of no known node", r.Caller, r.Callee)
			}
			out[[2]string{from, to}] += r.RPS
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no plan yet")
	}
	return out, nil
}

// servePenalties reads serve's edgeflow_closed_loop_latency_penalty_seconds, in ms by
// (source node, target node).
func servePenalties(s *proc) (map[[2]string]float64, error) {
	return serveGauge(s, "edgeflow_closed_loop_latency_penalty_seconds")
}

// serveGauge reads one of serve's gauges by node pair (source_node, target_node), in ms.
func serveGauge(s *proc, name string) (map[[2]string]float64, error) {
	m, err := metrics(s.metrics)
	if err != nil {
		return nil, err
	}
	out := map[[2]string]float64{}
	for labels, v := range series(m, name) {
		out[[2]string{labels["source_node"], labels["target_node"]}] = 1000 * v
	}
	return out, nil
}
