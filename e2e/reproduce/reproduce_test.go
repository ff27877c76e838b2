package reproduce

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/internal/testkit"
)

func TestMain(m *testing.M) {
	raisePriority()
	code := m.Run()
	testkit.RemoveBuilt()
	removePodBinary()
	// As testbed.VerifyMain: fail the run if a child process or (goleak) a goroutine is left.
	if code == 0 {
		if kids := testbed.Children(); len(kids) > 0 {
			fmt.Fprintf(os.Stderr, "e2e/reproduce: processes left running: %s\n", strings.Join(kids, ", "))
			code = 1
		}
	}
	if code == 0 {
		goleak.VerifyTestMain(ran(code))
	}
	os.Exit(code)
}

// ran is a goleak.TestingM whose tests already ran.
type ran int

func (r ran) Run() int { return int(r) }

// TestReproduce runs the experiment: the preset REPRODUCE_PRESET (smoke, the default, quick or
// full), writing the report into REPRODUCE_OUT when set (make reproduce: docs/; the smoke
// writes it into a temporary folder otherwise) and everything it measured into REPRODUCE_RAW
// when set (make reproduce: bin/reproduction.gob; make reproduce-report writes the report again
// from it). check says what it asserts: for the smoke (CI), what holds on any run of a working
// loop (smokeProblems, reportProblems), no latency compared; for quick and full, on scenario B
// at the middle rate, the paper's qualitative claims that hold here (checkClaims, asserted):
// proposed has a lower P99 than default-k8s, localization and opttraffic, lata-only than
// default-k8s and localization, and a plan no costlier in network time than opttraffic's
// (asserted); and the rebalancer made at least one move with no pod left Pending.
func TestReproduce(t *testing.T) {
	name := os.Getenv("REPRODUCE_PRESET")
	if name == "" {
		name = "smoke"
	}
	p, ok := Presets[name]
	if !ok {
		t.Fatalf("REPRODUCE_PRESET=%q: want one of %v", name, slices.Sorted(maps.Keys(Presets)))
	}
	p, err := Override(p, os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	var placed *Outcome
	if path := os.Getenv(PlacementsEnv); path != "" {
		if placed, err = LoadOutcomes(path); err != nil {
			t.Fatalf("%s: %v", PlacementsEnv, err)
		}
		if err := CheckPlacements(placed, p); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 24*time.Hour)
	defer cancel()
	// A first SIGINT or SIGTERM (Ctrl-C on make reproduce, a CI job cancelled) cancels ctx: the
	// run stops at its next wait or slice (the load generator's under way returns at once) and
	// t's cleanups stop every process it started and remove the testbed's namespaces, which a
	// kill by the signal's default would leave behind. A second signal kills at once.
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	context.AfterFunc(ctx, stopSignals)
	out, raw := os.Getenv("REPRODUCE_OUT"), os.Getenv("REPRODUCE_RAW")
	if out == "" && p.Smoke {
		out = t.TempDir()
	}
	write := func(o *Outcome) {
		if raw != "" {
			if err := SaveOutcome(o, raw); err != nil {
				t.Fatal(err)
			}
		}
		if out == "" {
			return
		}
		if err := WriteReport(o, out); err != nil {
			t.Fatal(err)
		}
		t.Logf("report written to %s (%d cells)", out, len(o.Cells))
	}
	o := Run(t, ctx, p, os.Stderr, write, placed)
	write(o)
	check(t, o, out)
}

// check asserts on a run's outcome, whose report is in dir ("": none written): the smoke's
// checks (smokeProblems, reportProblems) for a smoke preset, else the paper's claims
// (checkClaims).
func check(t *testing.T, o *Outcome, dir string) {
	if !o.Preset.Smoke {
		checkClaims(t, o)
		return
	}
	problems := smokeProblems(o)
	if dir != "" {
		problems = append(problems, reportProblems(o, dir)...)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if len(problems) == 0 {
		t.Logf("smoke: %d cells served, the report whole, the plans in the policies' order, the rebalancer settled", len(o.Cells))
	}
}

// TestRenderReport writes the report again, into REPRODUCE_OUT, from the outcome a run saved in
// REPRODUCE_RAW (make reproduce-report), or from the parts of a grid run apart (make reproduce
// SETUP=…: a comma-separated list or a glob, merged by MergeOutcomes), and checks it as
// TestReproduce does.
func TestRenderReport(t *testing.T) {
	raw, out := os.Getenv("REPRODUCE_RAW"), os.Getenv("REPRODUCE_OUT")
	if raw == "" || out == "" {
		t.Skip("REPRODUCE_RAW (a saved outcome) and REPRODUCE_OUT (where the report goes) are not both set")
	}
	o, err := LoadOutcomes(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteReport(o, out); err != nil {
		t.Fatal(err)
	}
	t.Logf("report written to %s from %s (%d cells, %d slices)", out, raw, len(o.Cells), o.Slices)
	check(t, o, out)
}

// asserted are the baselines checkClaims holds proposed and lata-only to on scenario B, by P99:
// all three of the for proposed; default-k8s and localization for lata-only. With the
// paper's replica ratios (3 caller pods, 2 callee pods) Localization must send two callers'
// traffic to one callee pod (at 200 req/s ~80 % busy, against lata's 60 %), and default-k8s
// sends most calls across nodes, so both lose structurally; proposed's placement also leaves
// OptTraffic (on the scheduler's placement) cross-node remainders that proposed keeps local.
//
// lata-only against OptTraffic is asserted on what LATA decides, the network time of the plan
// serve publishes priced at the testbed's configured RTTs (Stats.NetMS), not on P99. On one
// placement both keep every pod at its share and differ only in where the traffic beyond the
// same-node pods goes: `edgeflow plan` on the scheduler's placements of the full run of
// 2026-12-02 prices that at 0 ms a request for Bookinfo A and 1.7 ms for Bookinfo B (24.0
// against 25.7 ms), against a P99 of ~150 ms that is mostly queueing and moves by ±20 %
// between single runs. The quick runs put lata-only's median P99 1–18 % below OptTraffic's,
// once within 1 % (149.6 against 150.5 ms; pooled 153.0 against 149.7): P99 cannot decide a
// 1 % difference here, so asserting it would fail CI at random; it is logged. The plan's network time can: LATA minimises it from serve's measured RTTs, so
// it is above OptTraffic's only if serve's inputs misled it.
var asserted = map[string][]string{
	"proposed":  {"default-k8s", "localization", "opttraffic"},
	"lata-only": {"default-k8s", "localization"},
}

// checkClaims asserts the qualitative claims on scenario B at the middle rate of every app that
// hold on this testbed (asserted), and logs the others.
func checkClaims(t *testing.T, o *Outcome) {
	for _, q := range Policies {
		if !q.Extra && !slices.ContainsFunc(o.Preset.Rows(), func(r Policy) bool { return r.Name == q.Name }) {
			t.Logf("claims not checked: only the rows %v ran", o.Preset.Policies)
			return
		}
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
		// p99 gives the median of the runs' P99 (what is asserted) and the P99 of the runs'
		// latencies pooled (the report's headline, logged beside it).
		p99 := func(policy string) (median, pooledP99 float64) {
			r := o.Find(Cell{App: st.App, Scenario: "B", Policy: policy, RPS: mid})
			if r == nil {
				t.Fatalf("%s B %s at %g req/s was not run", st.App, policy, mid)
			}
			s := o.stats(r)
			return medianOf(s.RunP99), s.P99
		}
		for _, winner := range []string{"proposed", "lata-only"} {
			for _, base := range []string{"default-k8s", "localization", "opttraffic"} {
				w, wp := p99(winner)
				b, bp := p99(base)
				t.Logf("%s B %g req/s: %s P99 %.1f ms vs %s %.1f ms (%+.0f %%; median of the runs' P99; pooled: %.1f vs %.1f ms, %+.0f %%)",
					st.App, mid, winner, w, base, b, pct(w, b), wp, bp, pct(wp, bp))
				if !slices.Contains(asserted[winner], base) {
					continue
				}
				if !(w < b) {
					t.Errorf("%s B %g req/s: %s's median P99 over the runs %.1f ms is not below %s's %.1f ms", st.App, mid, winner, w, base, b)
				}
			}
		}
		// recorded: the outcome has plan costs at all (one saved before they were has none).
		recorded := func(policy string) bool {
			return len(o.Find(Cell{App: st.App, Scenario: "B", Policy: policy, RPS: mid}).PlanCost) > 0
		}
		l, ot, pr := o.netMS(st.App, "B", "lata-only", mid), o.netMS(st.App, "B", "opttraffic", mid), o.netMS(st.App, "B", "proposed", mid)
		switch {
		case !recorded("lata-only") || !recorded("opttraffic"):
			t.Logf("%s B %g req/s: the plans' network time was not recorded (an outcome saved before it was)", st.App, mid)
		case math.IsNaN(l) || math.IsNaN(ot):
			t.Errorf("%s B %g req/s: serve's plan could not be read in any run (lata-only %.1f, opttraffic %.1f ms)", st.App, mid, l, ot)
		default:
			t.Logf("%s B %g req/s: the plan's network time at the configured RTTs: lata-only %.2f ms a request, opttraffic %.2f, proposed %.2f (on LARP's placement)",
				st.App, mid, l, ot, pr)
			// 1 %: serve's measured RTTs are a few tenths of a ms off the configured ones, which
			// can tip LATA between two plans that cost nearly the same.
			if l > ot*1.01 {
				t.Errorf("%s B %g req/s: lata-only's plan costs %.2f ms of network a request at the configured RTTs, more than opttraffic's %.2f", st.App, mid, l, ot)
			}
		}
	}
}
