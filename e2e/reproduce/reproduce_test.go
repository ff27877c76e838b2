package reproduce

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/e2e/testbed"
)

func TestMain(m *testing.M) {
	raisePriority()
	testbed.VerifyMain(m, "e2e/reproduce")
}

// TestReproduce runs the experiment: the preset REPRODUCE_PRESET (quick, the default, or full),
// writing the report into REPRODUCE_OUT when set (make reproduce: docs/). On scenario B at the
// middle rate it asserts the paper's qualitative claims that hold here (checkClaims): proposed
// and lata-only have a lower P99 than default-k8s (their comparisons with localization and
// opttraffic are logged); and the rebalancer made at least one move with no pod left Pending.
func TestReproduce(t *testing.T) {
	name := os.Getenv("REPRODUCE_PRESET")
	if name == "" {
		name = "quick"
	}
	p, ok := Presets[name]
	if !ok {
		t.Fatalf("REPRODUCE_PRESET=%q: want quick or full", name)
	}
	p, err := Override(p, os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 24*time.Hour)
	defer cancel()
	out := os.Getenv("REPRODUCE_OUT")
	write := func(o *Outcome) {
		if out == "" {
			return
		}
		if err := WriteReport(o, out); err != nil {
			t.Fatal(err)
		}
		t.Logf("report written to %s (%d cells)", out, len(o.Cells))
	}
	o := Run(t, ctx, p, os.Stderr, write)
	write(o)
	checkClaims(t, o)
}

// asserted are the baselines checkClaims holds proposed and lata-only to. The comparisons with
// localization and opttraffic are logged, not asserted: on this testbed every caller has a
// callee pod on its own node and at 200 req/s nothing overloads, so the local-first baselines
// pay no network time where lata's equal shares do (lata-only was second best in 1 of 12 cells
// of the committed full run; proposed beat them in every scenario-B cell of it, but lost to
// opttraffic in 2 of 3 quick runs on a loaded machine). docs/reproduction.md explains it.
var asserted = map[string]bool{"default-k8s": true}

// checkClaims asserts the qualitative claims on scenario B at the middle rate of every app that
// hold on this testbed (asserted), and logs the others.
func checkClaims(t *testing.T, o *Outcome) {
	if len(o.Preset.Rows()) != len(Policies) {
		t.Logf("claims not checked: only the rows %v ran", o.Preset.Policies)
		return
	}
	mid := o.middle()
	for _, st := range o.Setups {
		if st.Moves < 1 {
			t.Errorf("%s %s: edgeflow rebalance made no move", st.App, st.Scenario)
		}
		if len(st.Pending) > 0 {
			t.Errorf("%s %s: pods left Pending after the rebalancer: %v", st.App, st.Scenario, st.Pending)
		}
		if st.Scenario != "B" {
			continue
		}
		p99 := func(policy string) float64 {
			r := o.Find(Cell{App: st.App, Scenario: "B", Policy: policy, RPS: mid})
			if r == nil {
				t.Fatalf("%s B %s at %g req/s was not run", st.App, policy, mid)
			}
			return pooled(r).P99
		}
		for _, winner := range []string{"proposed", "lata-only"} {
			for _, base := range []string{"default-k8s", "localization", "opttraffic"} {
				w, b := p99(winner), p99(base)
				t.Logf("%s B %g req/s: %s P99 %.1f ms vs %s %.1f ms (%+.0f %%)", st.App, mid, winner, w, base, b, pct(w, b))
				if !asserted[base] {
					continue
				}
				if !(w < b) {
					t.Errorf("%s B %g req/s: %s P99 %.1f ms is not below %s's %.1f ms", st.App, mid, winner, w, base, b)
				}
			}
		}
	}
}
