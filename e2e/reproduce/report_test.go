package reproduce

import (
	"encoding/json"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
	webui "github.com/edgeflow/edgeflow/internal/ui"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// TestWriteReport writes the report of a synthetic outcome (exponential latencies, a
// different mean per policy) and checks the JSON's schema and figures against the samples, the
// Markdown's rows and the PNG.
func TestWriteReport(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	o := &Outcome{Preset: Presets["quick"], Workload: DefaultWorkload, Started: time.Now().Round(0), Ended: time.Now().Round(0).Add(time.Minute)} // wall clock, as a saved outcome has
	o.Setups = []*Setup{{App: "bookinfo", Scenario: "B", Moves: 2,
		Before: map[string]map[string]int{"details": {"n1": 1, "n2": 2}}, After: map[string]map[string]int{"details": {"n1": 3}},
		RTT: []PairAccuracy{{Pair: "n1–n2", ConfiguredMS: 8, MedianMS: 8.2, MinMS: 8.1, MaxMS: 9, Pings: 20}}}}
	for i, p := range Policies {
		r := &Runs{Cell: Cell{App: "bookinfo", Scenario: "B", Policy: p.Name, RPS: 200}}
		for range 2 {
			var lat []time.Duration
			for range 1000 {
				lat = append(lat, time.Duration(rng.ExpFloat64()*float64(time.Duration(70-5*i)*time.Millisecond)))
			}
			r.Results = append(r.Results, &loadgen.Result{Sent: 1000, OK: 1000, Latency: loadgen.NewSamples(lat), Elapsed: 5 * time.Second})
			r.PlanCost = append(r.PlanCost, float64(5000-100*i+10*len(r.PlanCost)))
		}
		o.Cells = append(o.Cells, r)
	}
	o.Cells[0].PlanCost[1] = math.NaN() // not read: the median is of the runs that were
	dir := t.TempDir()
	if err := WriteReport(o, dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "reproduction.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Testbed map[string]any   `json:"testbed"`
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Results) != len(Policies) {
		t.Fatalf("%d results, want %d", len(got.Results), len(Policies))
	}
	if m := missing(got.Results[0], resultKeys); len(m) > 0 {
		t.Errorf("result without %v: %v", m, got.Results[0])
	}
	if m := missing(got.Testbed, testbedKeys); len(m) > 0 {
		t.Errorf("testbed without %v", m)
	}
	want := tickMS(toTicks(loadgen.Merge(o.Cells[0].Results...).Latency.Quantile(0.99))) // at the report's 10 µs
	if p := got.Results[0]["p99_ms"].(float64); p != want {
		t.Errorf("default-k8s p99_ms %v, want %v (pooled samples)", p, want)
	}
	if n, ok := got.Results[0]["plan_network_ms"].(float64); !ok || n != 25 {
		t.Errorf("default-k8s plan_network_ms %v, want 25 (5000 ms·req/s, the one run read, at 200 req/s)", got.Results[0]["plan_network_ms"])
	}
	if n, ok := got.Results[1]["plan_network_ms"].(float64); !ok || n != 24.53 {
		t.Errorf("least-request plan_network_ms %v, want 24.53 (the median of 4900 and 4910 ms·req/s at 200 req/s)", got.Results[1]["plan_network_ms"])
	}
	md, err := os.ReadFile(filepath.Join(dir, "reproduction.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"| bookinfo | B | 200 |", "proposed vs the three baselines", "reproduction-bookinfo-B.png", "DAG B", "lata-only against OptTraffic at 200 req/s: bookinfo/B: 23.0 against 23.5 ms"} {
		if !strings.Contains(string(md), s) {
			t.Errorf("reproduction.md lacks %q", s)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "reproduction-bookinfo-B.png")); err != nil || fi.Size() < 1000 {
		t.Errorf("plot: %v", err)
	}

	// The saved outcome gives the same report again.
	raw := filepath.Join(t.TempDir(), "outcome.gob")
	if err := SaveOutcome(o, raw); err != nil {
		t.Fatal(err)
	}
	o2, err := LoadOutcome(raw)
	if err != nil {
		t.Fatal(err)
	}
	dir2 := t.TempDir()
	if err := WriteReport(o2, dir2); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"reproduction.json", "reproduction.md"} {
		a, _ := os.ReadFile(filepath.Join(dir, f))
		b, _ := os.ReadFile(filepath.Join(dir2, f))
		if string(a) != string(b) {
			t.Errorf("%s written from the saved outcome differs from the original's", f)
		}
	}
	if _, err := LoadOutcome(filepath.Join(dir, "reproduction.json")); err == nil {
		t.Error("LoadOutcome read a JSON report as an outcome")
	}
}

// TestPrice prices a snapshot's routes at the configured RTTs, and refuses one it cannot price.
func TestPrice(t *testing.T) {
	rtt := map[[2]string]float64{{"n1", "n2"}: 8, {"n1", "n3"}: 16}
	snap := func(routes ...webui.Route) *webui.Snapshot {
		return &webui.Snapshot{
			Nodes: []webui.Node{{Name: "n1", Pods: []webui.Pod{{Name: "a-0", Service: "a"}, {Name: "b-0", Service: "b"}}},
				{Name: "n2", Pods: []webui.Pod{{Name: "b-1", Service: "b"}}}, {Name: "n3", Pods: []webui.Pod{{Name: "a-1", Service: "a"}}}},
			Edges: []webui.Edge{{From: "a", To: "b", Routes: routes}},
		}
	}
	// a-0 (n1) sends 60 to b-0 (n1, free) and 40 to b-1 (n2, 8 ms); a-1 (n3) sends 50 to b-0
	// (n1; the pair given as n1–n3, priced either way).
	got, err := price(snap(webui.Route{Caller: "a-0", Callee: "b-0", RPS: 60}, webui.Route{Caller: "a-0", Callee: "b-1", RPS: 40},
		webui.Route{Caller: "a-1", Callee: "b-0", RPS: 50}), rtt)
	if err != nil {
		t.Fatal(err)
	}
	if want := 40*8 + 50*16.0; got.Cost != want {
		t.Errorf("cost %v, want %v", got.Cost, want)
	}
	if got.CalleeRPS["b-0"] != 110 || got.CalleeRPS["b-1"] != 40 {
		t.Errorf("callee req/s %v, want b-0 110, b-1 40", got.CalleeRPS)
	}
	if want := map[[2]string]float64{{"n1", "n2"}: 40, {"n3", "n1"}: 50}; !maps.Equal(got.Traffic, want) {
		t.Errorf("traffic %v, want %v", got.Traffic, want)
	}
	if c, ok := costAt(got.Traffic, map[[2]string]float64{{"n1", "n2"}: 1, {"n3", "n1"}: 2}); !ok || c != 140 {
		t.Errorf("costAt: %v %v, want 140", c, ok)
	}
	if _, ok := costAt(got.Traffic, map[[2]string]float64{{"n1", "n2"}: 1}); ok {
		t.Error("costAt priced traffic on a pair without latency")
	}
	for _, c := range []struct {
		snap *webui.Snapshot
		want string
	}{
		{snap(), "no plan"},
		{snap(webui.Route{Caller: "a-9", Callee: "b-0", RPS: 1}), "a-9 → b-0"},
		{snap(webui.Route{Caller: "a-1", Callee: "b-1", RPS: 1}), "between n3 and n2"},
	} {
		if _, err := price(c.snap, rtt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("price: error %v, want one naming %q", err, c.want)
		}
	}
}

// TestOnMeasuredLatency tells a publication planned on measured RTTs from serve's degraded plan
// (every pair at one latency, or the latency input degraded) and from one missing pairs.
func TestOnMeasuredLatency(t *testing.T) {
	nodes := []string{"n1", "n2", "n3"}
	pairs := func(ms ...float64) []webui.Latency {
		var out []webui.Latency
		for i, a := range nodes {
			for j, b := range nodes {
				if i != j {
					out = append(out, webui.Latency{From: a, To: b, MS: ms[len(out)%len(ms)]})
				}
			}
		}
		return out
	}
	for _, c := range []struct {
		name string
		snap webui.Snapshot
		want string
	}{
		{"measured", webui.Snapshot{Latency: pairs(8, 16, 8, 12, 16, 12)}, ""},
		{"degraded plan", webui.Snapshot{Latency: pairs(1)}, "every node pair at 1 ms"},
		{"latency degraded", webui.Snapshot{Latency: pairs(8, 16), Degraded: []webui.Degraded{{Input: "latency", Message: "2 node pairs unmeasured"}}}, "2 node pairs unmeasured"},
		{"pairs missing", webui.Snapshot{Latency: pairs(8, 16)[:4]}, "4 node pairs' latency, want 6"},
		{"one measured pair for all", webui.Snapshot{Latency: pairs(8.3)}, "every node pair at 8.3 ms"},
	} {
		got := onMeasuredLatency(&c.snap, nodes, ScenarioA)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	// On a flat testbed a publication at one measured latency is the measured plan; the
	// degraded plan's latency still tells the degraded plan.
	flatRTT, err := Scenario("flat")
	if err != nil {
		t.Fatal(err)
	}
	if got := onMeasuredLatency(&webui.Snapshot{Latency: pairs(2.76)}, nodes, flatRTT); got != "" {
		t.Errorf("flat, every pair measured at 2.76 ms: %q, want measured", got)
	}
	if got := onMeasuredLatency(&webui.Snapshot{Latency: pairs(prom.EqualLatencyMS)}, nodes, flatRTT); !strings.Contains(got, "degraded plan") {
		t.Errorf("flat, the degraded plan: %q, want it named", got)
	}
}

// The closed loop's section pairs closed-loop's runs with the other rows' of the same round:
// closed-loop 10 % under the better row in every run gives 0.90, whichever row is better in a
// run; the target follows the scenario (homogeneous: ≤ 1.02 × the better at every rate; slowed
// pods: ≤ 0.90 × each at the two highest rates only).
func TestClosedLoopSection(t *testing.T) {
	o := &Outcome{Preset: Presets["closedloop"]}
	o.Setups = []*Setup{{App: "bookinfo", Scenario: "A"}}
	p99 := map[string][]float64{ // per run: least-request better in run 1, lata-only in runs 2 and 3
		"least-request": {100, 300, 200},
		"lata-only":     {150, 200, 100},
		"lata-q":        {120, 220, 110},
		"closed-loop":   {90, 180, 90},
	}
	for _, rate := range o.Preset.Rates {
		for _, name := range closedLoopRows {
			r := &Runs{Cell: Cell{App: "bookinfo", Scenario: "A", Policy: name, RPS: rate}}
			for _, v := range p99[name] {
				var lat []time.Duration
				for range 1000 { // a run's P99 is v: 1 % of its samples at 2v, the rest at v/2
					lat = append(lat, time.Duration(v/2*float64(time.Millisecond)))
				}
				for i := range 10 {
					lat[i] = time.Duration(v * float64(time.Millisecond))
				}
				r.Results = append(r.Results, &loadgen.Result{Sent: 1000, OK: 1000, Latency: loadgen.NewSamples(lat), Elapsed: 20 * time.Second})
			}
			o.Cells = append(o.Cells, r)
		}
	}
	sec := closedLoopSection(o)
	for _, want := range []string{"| bookinfo | A | 50 |", " 0.90 (0.90–0.90) | ≤ 1.02 × the better |", " 0.90 (0.60–0.90) |", " 0.90 (0.60–0.90) | 0.90 (0.90–0.90)"} {
		if !strings.Contains(sec, want) {
			t.Errorf("closed loop's section without %q:\n%s", want, sec)
		}
	}
	o.Preset.Slow = map[string]float64{"details": 1.5}
	sec = closedLoopSection(o)
	if !strings.Contains(sec, "| 50 |") || !strings.Contains(sec, "≤ 0.90 × each |") || strings.Count(sec, "≤ 0.90 × each") != 2 {
		t.Errorf("slowed pods: want the 0.90 target at the two highest rates only:\n%s", sec)
	}
	o.Preset = Presets["quick"]
	if sec := closedLoopSection(o); sec != "" {
		t.Errorf("a preset without closed-loop has a closed loop section:\n%s", sec)
	}
}

// TestWhyNamesTheModel: the report's account of where ours differ from the paper describes the
// model that ran — the paper regime's CPU limits, with each called service's ceiling from its
// request and service time, for the paper preset; the queueing model's one worker and its
// capacity for the queueing preset — and never the other's.
func TestWhyNamesTheModel(t *testing.T) {
	for _, c := range []struct {
		preset    string
		want, not []string
	}{
		{"paper", []string{"paper regime's", "CFS quota", "bookinfo's details: ~91 req/s", "dag's e: ~91 req/s"}, []string{"one worker", "3 caller pods and 2 callee pods"}},
		{"queueing", []string{"Queueing, not the network", "one worker", "~167 req/s"}, []string{"CFS quota"}},
	} {
		p := Presets[c.preset]
		o := &Outcome{Preset: p, Workload: p.workload()}
		var b strings.Builder
		writeWhy(&b, o)
		for _, w := range c.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s: the account lacks %q:\n%s", c.preset, w, b.String())
			}
		}
		for _, w := range c.not {
			if strings.Contains(b.String(), w) {
				t.Errorf("%s: the account says %q, of the other model:\n%s", c.preset, w, b.String())
			}
		}
	}
}

// TestFirstSection: on the synthetic grid proposed has the lowest latencies, so it is first in
// every cell and below lata-only; with its latencies doubled in one cell it is neither, the
// row of lowest P99 (beyond's) is named first, and a setup whose rebalancer made no move says
// its placement is lata-only's.
func TestFirstSection(t *testing.T) {
	o := syntheticOutcome()
	line := func(sec, prefix string) string {
		for l := range strings.Lines(sec) {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		t.Fatalf("no line %q in:\n%s", prefix, sec)
		return ""
	}
	sec := firstSection(o)
	if l := line(sec, "| bookinfo | A | 100 |"); !strings.Contains(l, "| proposed ") || !strings.Contains(l, "| first | **yes** |") ||
		!strings.HasSuffix(strings.TrimSpace(l), "| 2 | **yes** |") {
		t.Errorf("proposed lowest everywhere: %s", l)
	}
	for _, res := range o.Find(Cell{App: "bookinfo", Scenario: "A", Policy: "proposed", RPS: 200}).Results {
		for i := range res.Latency {
			res.Latency[i] *= 2
		}
	}
	o.Setups[0].Moves = 0
	sec = firstSection(o)
	l := line(sec, "| bookinfo | A | 200 |")
	if !strings.Contains(l, "| beyond ") || strings.Count(l, "| no |") != 2 || !strings.Contains(l, "(the same placement)") {
		t.Errorf("proposed doubled at bookinfo/A/200, no move: %s", l)
	}
	if !strings.Contains(l, "× [") {
		t.Errorf("no ratio with an interval: %s", l)
	}
	if got := strings.Count(sec, "\n| "); got != 2*2*3 {
		t.Errorf("%d table rows, want one per cell (12):\n%s", got, sec)
	}
}

// barVerdict: met is "**yes**"; a miss whose interval reaches 1.02 is within the noise, one
// whose interval lies above it, or whose row is censored or has no figure, is "no".
func TestBarVerdict(t *testing.T) {
	for _, tc := range []struct {
		name string
		met  bool
		cs   []change
		want string
	}{
		{"met", true, []change{{Point: 30, Lo: 10, Hi: 50}}, "**yes**"},
		{"interval reaches 1.02", false, []change{{Point: 5, Lo: -14, Hi: 24}}, "no, within the noise"},
		{"interval ends at 1.02", false, []change{{Point: 5, Lo: 2, Hi: 24}}, "no, within the noise"},
		{"interval above", false, []change{{Point: 60, Lo: 9, Hi: 115}}, "no"},
		{"one of two reaches", false, []change{{Point: 60, Lo: 9, Hi: 115}, {Point: 4, Lo: -1, Hi: 9}}, "no, within the noise"},
		{"censored row", false, []change{{Point: 5, Lo: -14, HiOpen: true, XAtLeast: true}}, "no"},
		{"no figure", false, []change{{Why: "no runs"}}, "no"},
		{"nothing to compare", false, nil, "no"},
	} {
		if got := barVerdict(tc.met, tc.cs...); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
