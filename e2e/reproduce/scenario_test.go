package reproduce

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestOverrideReplicas(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	p, err := Override(Presets["full"], env(map[string]string{"REPRODUCE_REPLICAS": "details=2,reviews=2,b=5"}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := replicaCounts(p.Apps[0]), "productpage 3, details 2, reviews 2, ratings 2"; got != want {
		t.Errorf("bookinfo: %q, want %q", got, want)
	}
	if got, want := replicaCounts(p.Apps[1]), "a 3, b 5, c 3, d 2, e 3"; got != want {
		t.Errorf("dag: %q, want %q", got, want)
	}
	if !strings.HasSuffix(p.Name, "+replicas") {
		t.Errorf("preset name %q does not say the replicas were changed", p.Name)
	}
	if got := replicaCounts(Bookinfo); got != "productpage 3, details 2, reviews 3, ratings 2" {
		t.Errorf("the override changed the package's Bookinfo: %q", got)
	}
	p, err = Override(Presets["full"], env(map[string]string{"REPRODUCE_REPLICAS": "neutral"}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := replicaCounts(p.Apps[0])+"; "+replicaCounts(p.Apps[1]), "productpage 3, details 3, reviews 4, ratings 3; a 3, b 4, c 3, d 3, e 3"; got != want {
		t.Errorf("neutral: %q, want %q", got, want)
	}
	for _, bad := range []string{"details=0", "details", "nosuch=2", "details=x", "neutral,details=2", "" + ","} {
		_, err := Override(Presets["quick"], env(map[string]string{"REPRODUCE_REPLICAS": bad}))
		if err == nil || !strings.Contains(err.Error(), "REPRODUCE_REPLICAS") {
			t.Errorf("REPRODUCE_REPLICAS=%s: error %v, want one naming the variable", bad, err)
		}
	}
	p, err = Override(Presets["full"], env(map[string]string{"REPRODUCE_WARMUP": "3s", "REPRODUCE_DURATION": "7s"}))
	if err != nil || p.Warmup != 3*time.Second || p.Duration != 7*time.Second {
		t.Errorf("REPRODUCE_WARMUP=3s REPRODUCE_DURATION=7s: warm-up %v, duration %v, error %v", p.Warmup, p.Duration, err)
	}
	if _, err := Override(Presets["full"], env(map[string]string{"REPRODUCE_WARMUP": "-1s"})); err == nil {
		t.Error("REPRODUCE_WARMUP=-1s accepted")
	}
}

// TestOverrideCPUAndWorkload: REPRODUCE_CPU sets the named components' CPU requests in a copy;
// REPRODUCE_WORKLOAD changes the named fields of the preset's workload only; REPRODUCE_ARRIVALS
// sends Poisson arrivals; bad entries are
// refused naming the variable and the entry.
func TestOverrideCPUAndWorkload(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	p, err := Override(Presets["paper"], env(map[string]string{"REPRODUCE_CPU": "productpage=500m,a=250m",
		"REPRODUCE_WORKLOAD": "service=2ms,fixed=1ms,limit=0,cores=2,metrics=1", "REPRODUCE_ARRIVALS": "poisson"}))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Poisson || Presets["paper"].Poisson || !strings.HasSuffix(p.Name, "+poisson") {
		t.Errorf("REPRODUCE_ARRIVALS=poisson: Poisson %v (the package's paper preset %v), name %q", p.Poisson, Presets["paper"].Poisson, p.Name)
	}
	if c := p.Apps[0].Components[0]; c.Name != "productpage" || c.CPU != "500m" || p.Apps[0].Components[1].CPU != "100m" {
		t.Errorf("bookinfo's components after REPRODUCE_CPU: %+v", p.Apps[0].Components)
	}
	if c := p.Apps[1].Components[0]; c.Name != "a" || c.CPU != "250m" {
		t.Errorf("dag's a after REPRODUCE_CPU: %+v", c)
	}
	if PaperApps[0].Components[0].CPU != "300m" {
		t.Errorf("REPRODUCE_CPU changed the package's PaperApps: %+v", PaperApps[0].Components[0])
	}
	w := *p.Workload
	if w.ServiceTime != 2*time.Millisecond || w.ServiceFixed != time.Millisecond || w.LimitCPU || w.NodeCores != 2 || !w.Metrics ||
		w.Workers != PaperWorkload.Workers {
		t.Errorf("workload after REPRODUCE_WORKLOAD: %+v (the paper's %+v)", w, PaperWorkload)
	}
	if !PaperWorkload.LimitCPU || PaperWorkload.NodeCores != 1 || PaperWorkload.ServiceTime != 1100*time.Microsecond {
		t.Errorf("REPRODUCE_WORKLOAD changed the package's PaperWorkload: %+v", PaperWorkload)
	}
	for _, c := range []struct{ key, value, want string }{
		{"REPRODUCE_CPU", "productpage=0", `"productpage=0"`},
		{"REPRODUCE_CPU", "productpage=lots", `"productpage=lots"`},
		{"REPRODUCE_CPU", "nosuch=100m", `no component "nosuch"`},
		{"REPRODUCE_WORKLOAD", "service=fast", `"service=fast"`},
		{"REPRODUCE_WORKLOAD", "workers=0", `"workers=0"`},
		{"REPRODUCE_WORKLOAD", "limit=yes", `"limit=yes"`},
		{"REPRODUCE_WORKLOAD", "speed=2", `"speed=2"`},
		{"REPRODUCE_ARRIVALS", "bursty", `"bursty"`},
		{"REPRODUCE_WORKLOAD", "service=1ms,fixed=2ms", "fixed 2ms is more than service 1ms"},
	} {
		_, err := Override(Presets["paper"], env(map[string]string{c.key: c.value}))
		if err == nil || !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s=%s: error %v; want one naming the variable and %s", c.key, c.value, err, c.want)
		}
	}
}

// Every run of a setup gives every row at every rate one slice on its placement; the placements
// alternate S L | L S (one switch a run, ABBA across run pairs); the order within a placement
// is shuffled by the seed (recorded: the same seed gives the same order), and not the same in
// every run.
func TestScheduleInterleaves(t *testing.T) {
	p := Presets["full"]
	p.Runs = 10
	rates := []float64{100, 200, 300}
	both := []string{PlacementScheduler, PlacementLARP}
	got := schedule(p, "bookinfo", "B", rates, both)
	if want := p.Runs * len(rates) * len(p.Rows()); len(got) != want {
		t.Fatalf("%d slices, want %d (runs × rates × rows)", len(got), want)
	}
	switches, orders := 0, map[string]bool{}
	for run := 1; run <= p.Runs; run++ {
		seen := map[string]int{}
		var places, order []string
		for i, s := range got {
			if s.Run != run {
				continue
			}
			if i > 0 && got[i-1].Placement != s.Placement {
				switches++
			}
			if len(places) == 0 || places[len(places)-1] != s.Placement {
				places = append(places, s.Placement)
			}
			if larp := slices.ContainsFunc(p.Rows(), func(q Policy) bool { return q.Name == s.Policy && q.LARP }); larp != (s.Placement == PlacementLARP) {
				t.Errorf("run %d: %s on placement %s", run, s.Policy, s.Placement)
			}
			seen[fmt.Sprintf("%s@%g", s.Policy, s.RPS)]++
			if s.Placement == PlacementScheduler {
				order = append(order, fmt.Sprintf("%s@%g", s.Policy, s.RPS))
			}
		}
		for _, pol := range p.Rows() {
			for _, r := range rates {
				if n := seen[fmt.Sprintf("%s@%g", pol.Name, r)]; n != 1 {
					t.Errorf("run %d: %s at %g req/s ran %d times, want once", run, pol.Name, r, n)
				}
			}
		}
		want := both
		if run%2 == 0 {
			want = []string{PlacementLARP, PlacementScheduler}
		}
		if !slices.Equal(places, want) {
			t.Errorf("run %d visits %v, want %v", run, places, want)
		}
		orders[strings.Join(order, " ")] = true
	}
	if switches != p.Runs {
		t.Errorf("%d placement switches in %d runs, want one a run", switches, p.Runs)
	}
	if len(orders) < p.Runs/2 {
		t.Errorf("only %d distinct orders of the scheduler's slices in %d runs: not shuffled", len(orders), p.Runs)
	}
	if again := schedule(p, "bookinfo", "B", rates, both); !slices.Equal(again, got) {
		t.Error("the same seed gave another order")
	}
	p.Seed = 2
	if other := schedule(p, "bookinfo", "B", rates, both); slices.Equal(other, got) {
		t.Error("another seed gave the same order")
	}
	p.Policies = []string{"proposed"} // a placement without rows is not visited
	for _, s := range schedule(p, "bookinfo", "B", rates, both) {
		if s.Placement != PlacementLARP {
			t.Fatalf("a run visits %s with no row to run there", s.Placement)
		}
	}
}

// The closed loop's rows run only where a preset names them; REPRODUCE_SLOW slows one pod of
// each component it names, refusing names no app has, factors that are not positive, and LARP
// rows (whose placement starts the pods anew).
func TestClosedLoopRowsAndSlow(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	var names []string
	for _, q := range Presets["full"].Rows() {
		names = append(names, q.Name)
	}
	if want := []string{"default-k8s", "least-request", "localization", "opttraffic", "lata-only", "proposed", "beyond"}; !slices.Equal(names, want) {
		t.Errorf("the full preset's rows: %v, want the paper's seven %v", names, want)
	}
	names = nil
	for _, q := range Presets["closedloop"].Rows() {
		names = append(names, q.Name)
		if q.LARP {
			t.Errorf("closedloop row %s runs on LARP's placement; the comparison is on the scheduler's", q.Name)
		}
	}
	if !slices.Equal(names, closedLoopRows) {
		t.Errorf("the closedloop preset's rows: %v, want %v", names, closedLoopRows)
	}
	p, err := Override(Presets["closedloop"], env(map[string]string{"REPRODUCE_SLOW": "details=1.5,reviews=1.5"}))
	if err != nil {
		t.Fatal(err)
	}
	if p.Slow["details"] != 1.5 || p.Slow["reviews"] != 1.5 || len(p.Slow) != 2 || !strings.HasSuffix(p.Name, "+slow") {
		t.Errorf("REPRODUCE_SLOW=details=1.5,reviews=1.5: %v, preset %q", p.Slow, p.Name)
	}
	for _, bad := range []string{"details", "nosuch=1.5", "details=0", "details=-2", "details=x", "details=+Inf"} {
		if _, err := Override(Presets["closedloop"], env(map[string]string{"REPRODUCE_SLOW": bad})); err == nil || !strings.Contains(err.Error(), "REPRODUCE_SLOW") {
			t.Errorf("REPRODUCE_SLOW=%s: error %v, want one naming the variable", bad, err)
		}
	}
	if _, err := Override(Presets["quick"], env(map[string]string{"REPRODUCE_SLOW": "details=1.5"})); err == nil {
		t.Error("REPRODUCE_SLOW with the LARP rows accepted")
	}
}

// TestWarmupForEstimatorRows: a slice of a row on measured pods (its flags start with the
// estimator's) warms up EstimatorWarmup when
// the preset's warm-up is shorter; other rows, the smoke preset and settle's slices (no warm-up)
// keep theirs.
func TestWarmupForEstimatorRows(t *testing.T) {
	p := Presets["paper"]
	closed := Policies[slices.IndexFunc(Policies, func(q Policy) bool { return q.Name == "closed-loop" })]
	lata := Policies[slices.IndexFunc(Policies, func(q Policy) bool { return q.Name == "lata-only" })]
	cap80 := Policies[slices.IndexFunc(Policies, func(q Policy) bool { return q.Name == "closed-loop-cap80" })]
	for _, tc := range []struct {
		name string
		p    Preset
		pol  Policy
		want time.Duration
	}{
		{"closed-loop", p, closed, EstimatorWarmup},
		{"closed-loop-cap80 (the estimator's flags and more)", p, cap80, EstimatorWarmup},
		{"lata-only", p, lata, p.Warmup},
		{"smoke", Presets["smoke"], closed, Presets["smoke"].Warmup},
		{"settle", func() Preset { q := p; q.Warmup = 0; return q }(), closed, 0},
		{"a longer warm-up stays", func() Preset { q := p; q.Warmup = time.Minute; return q }(), closed, time.Minute},
	} {
		if got := warmupFor(tc.p, tc.pol); got != tc.want {
			t.Errorf("%s: warm-up %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestSettleForEstimatorRows: a run with a row that plans on measured capacities settles a new
// placement long enough for the estimator's first estimates (EstimatorSettle); one without
// keeps the preset's settle time, and a preset without any settles none.
func TestSettleForEstimatorRows(t *testing.T) {
	p := Presets["paper"]
	p.Policies = nil // the paper's seven
	if got := settleFor(p); got != SettleTime {
		t.Errorf("paper's seven rows: settle %v, want %v", got, SettleTime)
	}
	p.Policies = []string{"localization", "closed-loop"}
	if got := settleFor(p); got != EstimatorSettle {
		t.Errorf("with closed-loop: settle %v, want %v", got, EstimatorSettle)
	}
	p.Settle = -1
	if got := settleFor(p); got != 0 {
		t.Errorf("no settle asked, with closed-loop: %v, want none", got)
	}
}
