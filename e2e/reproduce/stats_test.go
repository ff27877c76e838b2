package reproduce

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
)

// result is a run of ok latencies (ms), timeouts and other errors.
func result(lat []float64, timeouts, errs int) *loadgen.Result {
	d := make([]time.Duration, len(lat))
	for i, v := range lat {
		d[i] = time.Duration(v * float64(time.Millisecond))
	}
	kinds := map[string]int{}
	if timeouts > 0 {
		kinds["timeout"] = timeouts
	}
	if errs > 0 {
		kinds["boom"] = errs
	}
	return &loadgen.Result{Sent: len(lat) + timeouts + errs, OK: len(lat), Errors: timeouts + errs, Timeouts: timeouts, ErrorKinds: kinds,
		Latency: loadgen.NewSamples(d), Elapsed: 5 * time.Second}
}

// ramp is n latencies 1, 2, …, n ms.
func ramp(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(i + 1)
	}
	return out
}

// TestCensoring pins the timeout rule: a timeout is a sample ≥ the timeout in every quantile, so
// P99 is "≥ timeout" exactly when more than 1 % of the samples timed out; the mean is then a
// lower bound; other errors are no sample.
func TestCensoring(t *testing.T) {
	o := &Outcome{Preset: Preset{Timeout: 5 * time.Second}}
	for _, c := range []struct {
		name            string
		ok, tos, errs   int
		wantP99         float64
		wantAt, wantP50 bool
	}{
		{"no timeouts", 10_000, 0, 0, 9900, false, false},
		{"exactly 1 % timed out: P99 is the last ok latency", 9_900, 100, 0, 9900, false, false},
		{"one more: P99 ≥ timeout", 9_899, 101, 0, 5000, true, false},
		{"other errors are no sample", 9_900, 100, 500, 9900, false, false},
		{"most timed out: even P50 ≥ timeout", 4_000, 6_000, 0, 5000, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			lat := ramp(c.ok)
			for i := range lat {
				lat[i] /= 10 // 0.1 … 990 ms
			}
			r := &Runs{Results: []*loadgen.Result{result(lat, c.tos, c.errs)}}
			s := o.stats(r)
			want := c.wantP99
			if !c.wantAt {
				want = float64(rankOf(0.99, c.ok+c.tos)) / 10
			}
			if s.P99 != want || s.AtLeast["p99"] != c.wantAt {
				t.Errorf("P99 %v (at least %v), want %v (%v)", s.P99, s.AtLeast["p99"], want, c.wantAt)
			}
			if s.AtLeast["p50"] != c.wantP50 {
				t.Errorf("P50 at least %v, want %v", s.AtLeast["p50"], c.wantP50)
			}
			if s.Samples != c.ok+c.tos || s.Timeouts != c.tos || s.Errors != c.errs {
				t.Errorf("samples/timeouts/errors %d/%d/%d, want %d/%d/%d", s.Samples, s.Timeouts, s.Errors, c.ok+c.tos, c.tos, c.errs)
			}
			sum := 0.0
			for _, v := range lat {
				sum += v
			}
			wantMean := (sum + 5000*float64(c.tos)) / float64(c.ok+c.tos)
			if math.Abs(s.Mean-wantMean) > ms(Tick) || s.AtLeast["mean"] != (c.tos > 0) {
				t.Errorf("mean %v (at least %v), want %v (%v) within a tick", s.Mean, s.AtLeast["mean"], wantMean, c.tos > 0)
			}
			if s.Collapse() != c.wantAt {
				t.Errorf("collapse %v, want %v (more than 1 %% timeouts)", s.Collapse(), c.wantAt)
			}
		})
	}
	// Pooled over runs: the 1 % is of the pooled samples.
	r := &Runs{Results: []*loadgen.Result{result(ramp(4_950), 50, 0), result(ramp(4_950), 51, 0)}}
	if s := o.stats(r); !s.AtLeast["p99"] || s.RunP99AtLeast[0] || !s.RunP99AtLeast[1] {
		t.Errorf("pooled 101 of 10,001 timed out: P99 at least %v, runs %v; want true, [false true]", s.AtLeast["p99"], s.RunP99AtLeast)
	}
}

// TestTimeoutsOfOldResults: results recorded before loadgen counted timeouts count the errors
// filed as "timeout" or as a gRPC DeadlineExceeded status.
func TestTimeoutsOfOldResults(t *testing.T) {
	res := &loadgen.Result{Errors: 9, ErrorKinds: map[string]int{"timeout": 2, "rpc error: code = DeadlineExceeded desc = context deadline exceeded": 5, "rpc error: code = Unavailable": 2}}
	if got := timeoutsOf(res); got != 7 {
		t.Errorf("timeouts %d, want 7", got)
	}
	res.Timeouts = 3
	if got := timeoutsOf(res); got != 3 {
		t.Errorf("timeouts %d, want Result.Timeouts, 3", got)
	}
}

// TestEncodeTicks: the JSON's latencies decode to what was encoded, and a count that does not
// match is refused.
func TestEncodeTicks(t *testing.T) {
	lat := []int64{0, 0, 1, 17, 300, 300, 5_000_000}
	got, err := decodeTicks(encodeTicks(lat), len(lat))
	if err != nil || len(got) != len(lat) {
		t.Fatalf("decode: %v %v", got, err)
	}
	for i := range lat {
		if got[i] != lat[i] {
			t.Fatalf("decoded %v, want %v", got, lat)
		}
	}
	if _, err := decodeTicks(encodeTicks(lat), len(lat)+1); err == nil {
		t.Error("decoded a run with a count that does not match")
	}
}

// TestInBand pins the agreement rule's edges: the interval, rounded to 0.1 pp, must meet the
// paper's range widened by 10 points, ends included.
func TestInBand(t *testing.T) {
	const lo, hi = -72, -48 // band [-82, -38]
	for _, c := range []struct {
		name string
		cell jsonCell
		want bool
	}{
		{"inside", jsonCell{LoPct: -65, HiPct: -55}, true},
		{"ends on the band's low edge", jsonCell{LoPct: -95, HiPct: -82}, true},
		{"ends 0.1 pp below it", jsonCell{LoPct: -95, HiPct: -82.1}, false},
		{"starts on the band's high edge", jsonCell{LoPct: -38, HiPct: -20}, true},
		{"starts 0.1 pp above it", jsonCell{LoPct: -37.9, HiPct: -20}, false},
		{"covers the whole band", jsonCell{LoPct: -99, HiPct: 10}, true},
		{"unbounded above, starts in it", jsonCell{LoPct: -50, HiPct: -90, HiOpen: true}, true},
		{"no figure", jsonCell{LoPct: -60, HiPct: -50, Why: "both ≥ the timeout"}, false},
	} {
		if got := inBand(c.cell, lo, hi); got != c.want {
			t.Errorf("%s: in band %v, want %v", c.name, got, c.want)
		}
	}
}

// TestJudgeRange: a row agrees only when every cell is in the band; the reason names each cell
// that is not and by how much; the average leaves collapse and censored cells out.
func TestJudgeRange(t *testing.T) {
	cells := func() []jsonCell {
		return []jsonCell{
			{Cell: "dag/B/100", PointPct: -60, LoPct: -65, HiPct: -55},
			{Cell: "dag/B/200", PointPct: -50, LoPct: -52, HiPct: -45},
			{Cell: "dag/B/300", PointPct: -90, LoPct: -100, HiPct: -80, Collapse: true, BaseAtLeast: true},
		}
	}
	cl := jsonClaim{PaperRange: &[2]float64{-72, -48}, Cells: cells()}
	judgeRange(&cl)
	if cl.Verdict != "agrees" || cl.Average == nil || *cl.Average != -55 || cl.Averaged != 2 || cl.CollapseCells != 1 {
		t.Errorf("verdict %q, average %v over %d, %d collapse; want agrees, -55 over 2, 1", cl.Verdict, cl.Average, cl.Averaged, cl.CollapseCells)
	}
	cl = jsonClaim{PaperRange: &[2]float64{-72, -48}, Cells: cells()}
	cl.Cells[0] = jsonCell{Cell: "dag/B/100", PointPct: -10, LoPct: -14.2, HiPct: -6.1}
	judgeRange(&cl)
	if cl.Verdict != "does not agree" || !strings.Contains(cl.Reason, "dag/B/100: -10.0 % [-14.2, -6.1], 23.8 pp above the band's -38.0") {
		t.Errorf("verdict %q: %q; want does not agree, naming dag/B/100 23.8 pp above", cl.Verdict, cl.Reason)
	}
	if cl.Cells[1].Agrees != true || cl.Cells[0].Agrees {
		t.Errorf("cells' agreement %v %v, want false true", cl.Cells[0].Agrees, cl.Cells[1].Agrees)
	}
	cl = jsonClaim{PaperRange: &[2]float64{-25, -25}}
	judgeRange(&cl)
	if cl.Verdict != "not run" {
		t.Errorf("no cell: verdict %q, want not run", cl.Verdict)
	}
}

// scaled is a run's latencies (ms) times f.
func scaled(lat []float64, f float64) []float64 {
	out := make([]float64, len(lat))
	for i, v := range lat {
		out[i] = v * f
	}
	return out
}

// TestBootstrap: paired runs whose latencies are exactly 0.7 × the base's give −30 % and an
// interval of width 0 (the shared drift cancels); drawn apart the same runs give an interval
// around −30 %; and on experiments with a known change of −30 % (x's latencies 0.7 × base's
// distribution, every run with its own drift) the 95 % interval covers it in most of them.
func TestBootstrap(t *testing.T) {
	o := &Outcome{Preset: Preset{Timeout: 5 * time.Second}}
	rng := rand.New(rand.NewPCG(7, 8))
	exp := func(n int, scale float64) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = 1 + rng.ExpFloat64()*scale
		}
		return out
	}
	x, b := &Runs{Cell: Cell{Policy: "x"}}, &Runs{Cell: Cell{Policy: "b"}}
	for i := range 10 {
		lat := exp(300, 40*math.Exp(0.3*rng.NormFloat64()))
		b.Results = append(b.Results, result(lat, 0, 0))
		x.Results = append(x.Results, result(scaled(lat, 0.7), 0, 0))
		x.Round, b.Round = append(x.Round, "r"+string(rune('a'+i))), append(b.Round, "r"+string(rune('a'+i)))
	}
	c := o.compare("paired", x, b, metricP99)
	if !c.Paired || math.Abs(c.Point+30) > 0.1 || c.Hi-c.Lo > 0.2 {
		t.Errorf("paired: %+v, want −30 %% with an interval of width ~0 (ticks round)", c)
	}
	x.Round = nil // apart
	c = o.compare("apart", x, b, metricP99)
	if c.Paired || !(c.Lo < c.Point-1 && c.Hi > c.Point+1 && c.Lo < -30 && c.Hi > -30) {
		t.Errorf("apart: %+v, want an interval around −30 %% of some width", c)
	}
	if again := o.compare("apart", x, b, metricP99); again != c {
		t.Errorf("the same key gave %+v, then %+v: the seed is not fixed", c, again)
	}

	const experiments = 60
	covered, width := 0, 0.0
	for e := range experiments {
		x, b := &Runs{Cell: Cell{Policy: "x"}}, &Runs{Cell: Cell{Policy: "b"}}
		for range 8 {
			b.Results = append(b.Results, result(exp(200, 40*math.Exp(0.2*rng.NormFloat64())), 0, 0))
			x.Results = append(x.Results, result(scaled(exp(200, 40*math.Exp(0.2*rng.NormFloat64())), 0.7), 0, 0))
		}
		c := o.compare(string(rune('A'+e)), x, b, metricMean)
		// The mean of 1 + Exp(40·drift) scaled by 0.7 is 0.7 × the base's: −30 % exactly.
		if c.Lo <= -30 && -30 <= c.Hi {
			covered++
		}
		width += (c.Hi - c.Lo) / experiments
	}
	// Too few: the interval is too narrow (as resampling requests makes it); a width near the
	// whole range would cover anything.
	if covered < experiments*80/100 || width > 40 {
		t.Errorf("the interval covered the true −30 %% in %d of %d experiments (want at least 80 %%), %.1f pp wide on average (want under 40)", covered, experiments, width)
	}
	t.Logf("coverage %d of %d, %.1f pp wide on average", covered, experiments, width)
}

// syntheticOutcome is a small full grid: both applications, both scenarios, 100–300 req/s,
// every policy, 3 runs of 300 latencies each; Localization at 300 req/s has 5 % timeouts and
// proposed is 0.6 × default-k8s's latencies.
func syntheticOutcome() *Outcome {
	rng := rand.New(rand.NewPCG(1, 2))
	p := Presets["full"]
	p.Runs = 3
	o := &Outcome{Preset: p, Workload: DefaultWorkload, Commit: "0123456789ab", Slices: 3 * 7 * 12,
		Started: time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC), Ended: time.Date(2026, 12, 5, 11, 0, 0, 0, time.UTC), SliceTime: 9 * time.Second}
	scale := map[string]float64{"default-k8s": 100, "least-request": 95, "localization": 80, "opttraffic": 75, "lata-only": 70, "proposed": 60, "beyond": 62}
	for _, sc := range p.Scenarios {
		for _, a := range p.Apps {
			o.Setups = append(o.Setups, &Setup{App: a.Name, Scenario: sc, Moves: 2, Settled: true, CostBefore: 4000.123, CostAfter: 1500,
				Before: map[string]map[string]int{"b": {"n1": 1, "n2": 1}}, After: map[string]map[string]int{"b": {"n1": 2}},
				RTT: []PairAccuracy{{Pair: "n1–n2", ConfiguredMS: 8, MedianMS: 8.2, MinMS: 8.1, MaxMS: 9, Pings: 20}}})
			for _, rate := range p.Rates {
				for _, pol := range Policies {
					r := &Runs{Cell: Cell{App: a.Name, Scenario: sc, Policy: pol.Name, RPS: rate}}
					for range p.Runs {
						lat := make([]float64, 300)
						for i := range lat {
							lat[i] = 2 + rng.ExpFloat64()*scale[pol.Name]*rate/200
						}
						tos := 0
						if pol.Name == "localization" && rate == 300 {
							tos = 16
						}
						r.Results = append(r.Results, result(lat, tos, 1))
						r.PlanCost = append(r.PlanCost, 1000*rng.Float64())
						h := Health{CPUIdle: 0.3 * rng.Float64(), ReleaseLagMeanUS: 100 + 100*rng.Float64(), ReleaseLagP99US: 900,
							SendLagMaxMS: 5, PingPair: "n1–n4", PingMedianMS: 24.3, PingMinMS: 24.1, PingWantMS: 24, Pings: 40}
						h.check()
						r.Health, r.Attempts = append(r.Health, h), append(r.Attempts, 1+len(h.Problems))
						r.Round = append(r.Round, fmt.Sprintf("%s/%s run %d", a.Name, sc, len(r.Results)))
						o.Order = append(o.Order, Slice{App: a.Name, Scenario: sc, Run: len(r.Results), Policy: pol.Name, RPS: rate,
							Placement: map[bool]string{false: PlacementScheduler, true: PlacementLARP}[pol.LARP], Start: o.Started.Add(time.Duration(len(o.Order)) * time.Second)})
					}
					r.PlanCost[0] = math.NaN()
					o.Cells = append(o.Cells, r)
				}
			}
		}
	}
	return o
}

// TestRecompute: the report WriteReport writes recomputes clean from its JSON; a number changed
// in the Markdown, a figure changed in the JSON or a run's latencies changed are each caught;
// a schema 1 report is refused as such.
func TestRecompute(t *testing.T) {
	dir := t.TempDir()
	if err := WriteReport(syntheticOutcome(), dir); err != nil {
		t.Fatal(err)
	}
	js, md := filepath.Join(dir, "reproduction.json"), filepath.Join(dir, "reproduction.md")
	if err := Recompute(js, md); err != nil {
		t.Fatalf("the report as written: %v", err)
	}
	fi, _ := os.Stat(js)
	t.Logf("reproduction.json: %d bytes for %d latencies", fi.Size(), 4*3*7*3*300)

	rawJSON, _ := os.ReadFile(js)
	rawMD, _ := os.ReadFile(md)
	var j jsonReport
	if err := json.Unmarshal(rawJSON, &j); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| dag | B | localization | 300 | 3 | 948 ⚑ |", "≥ 5000.0", "**does not agree**", "## Slice health", "CPU idle"} {
		if !strings.Contains(string(rawMD), want) {
			t.Errorf("reproduction.md lacks %q", want)
		}
	}
	tamper := func(name string, file string, edit func([]byte) []byte, wantErr string) {
		t.Run(name, func(t *testing.T) {
			d := t.TempDir()
			for f, b := range map[string][]byte{"reproduction.json": rawJSON, "reproduction.md": rawMD} {
				if f == file {
					b = edit(b)
				}
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := Recompute(filepath.Join(d, "reproduction.json"), filepath.Join(d, "reproduction.md"))
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Errorf("error %v, want one naming %q", err, wantErr)
			}
		})
	}
	p99 := j.Results[0].P99MS
	row := func(b []byte) []byte {
		// the first cell's row in "Every cell": its P99 one tick higher
		old := fmtMS(p99, false, 1)
		i := strings.Index(string(b), "| bookinfo | A | default-k8s | 100 |")
		line := string(b[i : i+strings.IndexByte(string(b[i:]), '\n')])
		bumped := strings.Replace(line, " "+old+" ", " "+fmtMS(p99+0.1, false, 1)+" ", 1)
		if bumped == line {
			t.Fatalf("no %s in %q", old, line)
		}
		return []byte(strings.Replace(string(b), line, bumped, 1))
	}
	tamper("a P99 in the Markdown", "reproduction.md", row, "| bookinfo | A | default-k8s | 100 |")
	tamper("a P99 in the JSON", "reproduction.json", func(b []byte) []byte {
		var m map[string]any
		json.Unmarshal(b, &m)
		m["results"].([]any)[0].(map[string]any)["p99_ms"] = p99 + 0.01
		out, _ := json.Marshal(m)
		return out
	}, "results[0].p99_ms")
	tamper("a verdict in the JSON", "reproduction.json", func(b []byte) []byte {
		var m map[string]any
		json.Unmarshal(b, &m)
		m["claims"].([]any)[0].(map[string]any)["verdict"] = "agrees"
		out, _ := json.Marshal(m)
		return out
	}, "claims[0].verdict")
	tamper("a run's latencies", "reproduction.json", func(b []byte) []byte {
		var m map[string]any
		json.Unmarshal(b, &m)
		run := m["results"].([]any)[0].(map[string]any)["per_run"].([]any)[0].(map[string]any)
		run["latency"] = encodeTicks(make([]int64, int(run["ok"].(float64)))) // every latency 0
		out, _ := json.Marshal(m)
		return out
	}, "claims[0].cells[0].change_pct")

	t.Run("merged from parts", func(t *testing.T) {
		// A report merged from parts of two commits, one setup's placements taken from another
		// run: the parts, the harness's files and the setup's origin come back from the JSON.
		o := syntheticOutcome()
		t0 := o.Started
		o.Commit, o.HarnessDiff = "abc, def", []string{"e2e/reproduce/run.go"}
		o.Parts = []Part{{Name: "x/paper-bookinfo-A.gob.gz", Commit: "abc", Setups: []string{"bookinfo/A"}, Rates: []float64{100, 200, 300}, Started: t0, Ended: t0.Add(time.Hour), Slices: 63},
			{Name: "x/paper-dag-B-300.gob.gz", Commit: "def", Setups: []string{"dag/B"}, Rates: []float64{300}, Started: t0.Add(26 * time.Hour), Ended: t0.Add(27 * time.Hour), Slices: 21}}
		o.Setups[len(o.Setups)-1].PlacedIn = "the run of 2026-12-08 10:00 UTC on def"
		d := t.TempDir()
		if err := WriteReport(o, d); err != nil {
			t.Fatal(err)
		}
		if err := Recompute(filepath.Join(d, "reproduction.json"), filepath.Join(d, "reproduction.md")); err != nil {
			t.Fatalf("a merged report as written: %v", err)
		}
		b, _ := os.ReadFile(filepath.Join(d, "reproduction.md"))
		for _, want := range []string{"of commits `abc`, `def` on", "- **Parts**: the grid ran in 2 parts", "`paper-dag-B-300.gob.gz` (dag/B at 300 req/s; commit `def`",
			"the harness's files that differ: `e2e/reproduce/run.go`", "are those of the run of 2026-12-08 10:00 UTC on def (pinned"} {
			if !strings.Contains(string(b), want) {
				t.Errorf("reproduction.md lacks %q", want)
			}
		}
	})

	old := filepath.Join(t.TempDir(), "old.json")
	os.WriteFile(old, []byte(`{"testbed": {}, "results": [{"app": "dag", "p99_ms": 4946.32}]}`), 0o644)
	if err := Recompute(old, md); !errors.Is(err, ErrNoRunValues) {
		t.Errorf("schema 1 report: %v, want ErrNoRunValues", err)
	}
}
