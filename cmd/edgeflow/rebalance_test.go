package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/rebalancer"
)

// TestRebalanceTableSplit: the dry-run table shows the network and queueing parts of the cost
// before and after, and every node's planned utilisation now and at the target.
func TestRebalanceTableSplit(t *testing.T) {
	r := &rebalancer.Report{DryRun: true, CostBefore: 1200, CostTarget: 0, QueueingBefore: 6000, QueueingTarget: 24000,
		Gain: 1, Threshold: 0.05, MaxNodeUtilization: 0.7,
		UtilizationBefore: []optimizer.NodeUse{{Node: "a", Cores: 2, CPU: 600, Utilization: 0.3}, {Node: "b", Cores: 0, CPU: 250}},
		UtilizationTarget: []optimizer.NodeUse{{Node: "a", Cores: 2, CPU: 1200, Utilization: 0.6}, {Node: "b", Cores: 0}}}
	var buf bytes.Buffer
	if err := writeRebalanceTable(&buf, r); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"network 1200.0 → 0.0, queueing 6000.0 → 24000.0, total 7200.0 → 24000.0",
		"limit 0.70", "NODE  CORES  NOW", "a     2      0.30 (600m)  0.60 (1200m)", "b     0      n/a (250m)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table does not show %q:\n%s", want, out)
		}
	}
}

func TestRebalanceFlagsMaxNodeUtilization(t *testing.T) {
	for _, tc := range []struct {
		v  float64
		ok bool
	}{{0.7, true}, {0, true}, {1, true}, {1.5, false}, {-0.1, false}} {
		f := rebalanceFlags{dryRun: true, maxMoves: 1, maxPerNode: 1, maxPerNS: 1, period: 1, gateTimeout: 1, placementTimeout: 1, maxUtil: tc.v}
		if err := f.check(); (err == nil) != tc.ok {
			t.Errorf("--max-node-utilization %v: check says %v", tc.v, err)
		}
		f.maxUtil, f.rateChange = 0.7, tc.v
		if err := f.check(); (err == nil) != (tc.v >= 0) {
			t.Errorf("--rate-change %v: check says %v", tc.v, err)
		}
	}
	if utilizationOrNone(0) >= 0 || utilizationOrNone(0.5) != 0.5 {
		t.Error("0 must mean no limit (negative in the Config)")
	}
}
