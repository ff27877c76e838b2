package reproduce

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
)

// part is a saved outcome of one application × scenario of the full grid, as make reproduce
// SETUP=APP/SCENARIO leaves it.
func part(t *testing.T, app App, sc string, start time.Time) *Outcome {
	t.Helper()
	p, err := Override(Presets["full"], func(k string) string {
		return map[string]string{"REPRODUCE_APPS": app.Name, "REPRODUCE_SCENARIOS": sc}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	o := &Outcome{Preset: p, Workload: DefaultWorkload, Commit: "abc", Started: start, Ended: start.Add(time.Hour),
		Slices: 2, SliceTime: 10 * time.Second, Setups: []*Setup{{App: app.Name, Scenario: sc}}}
	for _, pol := range []string{"default-k8s", "proposed"} {
		o.Cells = append(o.Cells, &Runs{Cell: Cell{App: app.Name, Scenario: sc, Policy: pol, RPS: 100},
			Results: []*loadgen.Result{{Sent: 1, OK: 1, Latency: loadgen.NewSamples([]time.Duration{time.Millisecond})}}})
		o.Order = append(o.Order, Slice{App: app.Name, Scenario: sc, Run: 1, Policy: pol, RPS: 100})
	}
	return o
}

// The parts of a grid run apart merge into one outcome: every setup, cell and slice, the
// preset's applications and scenarios the union, the run's span and slice time over all; parts
// of another experiment, or with a cell twice, are refused by name. LoadOutcomes merges saved
// parts given as a glob.
func TestMergeOutcomes(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	parts := []*Outcome{part(t, Bookinfo, "A", t0), part(t, Bookinfo, "B", t0.Add(2*time.Hour)), part(t, DAG, "B", t0.Add(-time.Hour))}
	parts[2].SliceTime = 40 * time.Second
	o, err := MergeOutcomes(parts, []string{"bookinfo-A", "bookinfo-B", "dag-B"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Setups) != 3 || len(o.Cells) != 6 || len(o.Order) != 6 || o.Slices != 6 {
		t.Errorf("merged %d setups, %d cells, %d slices in order, %d slices; want 3, 6, 6, 6", len(o.Setups), len(o.Cells), len(o.Order), o.Slices)
	}
	if got := strings.Join(appNames(o.Preset.Apps), ",") + " " + strings.Join(o.Preset.Scenarios, ","); got != "bookinfo,dag A,B" {
		t.Errorf("preset's apps and scenarios %q, want bookinfo,dag A,B", got)
	}
	if o.Preset.Name != "full" {
		t.Errorf("preset name %q, want full", o.Preset.Name)
	}
	if !o.Started.Equal(t0.Add(-time.Hour)) || !o.Ended.Equal(t0.Add(3*time.Hour)) {
		t.Errorf("span %v – %v, want the earliest start and the latest end", o.Started, o.Ended)
	}
	if o.SliceTime != 20*time.Second {
		t.Errorf("slice time %v, want 20s (the mean over all slices)", o.SliceTime)
	}
	if parts[0].Preset.Apps == nil || len(parts[0].Cells) != 2 {
		t.Error("merging changed a part")
	}

	other := part(t, DAG, "A", t0)
	other.Commit = "def"
	if _, err := MergeOutcomes([]*Outcome{parts[0], other}, []string{"bookinfo-A", "dag-A"}, nil); err == nil || !strings.Contains(err.Error(), "dag-A") || !strings.Contains(err.Error(), "commit def") {
		t.Errorf("parts of two commits: %v, want an error naming dag-A and its commit", err)
	}
	other = part(t, DAG, "A", t0)
	other.Preset.Runs = 3
	if _, err := MergeOutcomes([]*Outcome{parts[0], other}, nil, nil); err == nil || !strings.Contains(err.Error(), "part 2") {
		t.Errorf("parts of two presets: %v, want an error naming part 2", err)
	}
	if _, err := MergeOutcomes([]*Outcome{parts[0], part(t, Bookinfo, "A", t0)}, []string{"x", "y"}, nil); err == nil || !strings.Contains(err.Error(), "in both x and y") {
		t.Errorf("a cell in two parts: %v, want an error naming both", err)
	}

	// One part gzipped (as committed under docs/reproduction-paper), two not: the glob takes both.
	dir := t.TempDir()
	for i, name := range []string{"bookinfo-A.gob", "bookinfo-B.gob", "dag-B.gob.gz"} {
		if err := SaveOutcome(parts[i], filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "dag-B.gob.gz")); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("dag-B.gob.gz is not gzip (%v)", err)
	}
	loaded, err := LoadOutcomes(filepath.Join(dir, "*.gob*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(loaded.Cells) != 6 {
		t.Errorf("LoadOutcomes of the glob: %d cells, want 6", len(loaded.Cells))
	}
	if _, err := LoadOutcomes(filepath.Join(dir, "nothing-*.gob")); err == nil {
		t.Error("LoadOutcomes of a glob matching nothing: no error")
	}
}

// ratePart is a saved outcome of bookinfo/A of the paper preset at the rates given, as make
// reproduce SETUP=bookinfo/A REPRODUCE_RATES=… leaves it, on placements pl (both the same).
func ratePart(t *testing.T, commit string, start time.Time, pl map[string]map[string]int, rates ...float64) *Outcome {
	t.Helper()
	rs := make([]string, len(rates))
	for i, r := range rates {
		rs[i] = fmt.Sprintf("%g", r)
	}
	p, err := Override(Presets["paper"], func(k string) string {
		return map[string]string{"REPRODUCE_APPS": "bookinfo", "REPRODUCE_SCENARIOS": "A", "REPRODUCE_RATES": strings.Join(rs, ",")}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	o := &Outcome{Preset: p, Workload: p.workload(), Commit: commit, Started: start, Ended: start.Add(time.Hour), Slices: len(rates),
		SliceTime: 10 * time.Second, Setups: []*Setup{{App: "bookinfo", Scenario: "A", Before: pl, After: pl, Moves: 2}}, RebalanceSeconds: []float64{90}}
	for _, r := range rates {
		o.Cells = append(o.Cells, &Runs{Cell: Cell{App: "bookinfo", Scenario: "A", Policy: "proposed", RPS: r},
			Results: []*loadgen.Result{{Sent: 1, OK: 1, Latency: loadgen.NewSamples([]time.Duration{time.Millisecond})}}})
	}
	return o
}

// A setup run in parts by rate merges into one setup (the one of the part that placed its
// pods, with its rebalancer's record), the rates the union; parts of it on other placements are
// refused by name. Parts of two commits merge only where sameProduct allows, and the outcome
// keeps the harness's files that differ; the report names the parts.
func TestMergeOutcomesByRate(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 19, 0, 0, 0, time.UTC)
	pl := map[string]map[string]int{"ratings": {"n1": 2, "n2": 1}}
	first := ratePart(t, "abc", t0, pl, 100, 200)
	later := ratePart(t, "abc", t0.Add(24*time.Hour), pl, 300)
	later.Setups[0].PlacedIn, later.Setups[0].Moves, later.RebalanceSeconds = first.describeRun(), 2, nil
	o, err := MergeOutcomes([]*Outcome{later, first}, []string{"later", "first"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Setups) != 1 || o.Setups[0].PlacedIn != "" || len(o.Cells) != 3 || !slices.Equal(o.Preset.Rates, []float64{100, 200, 300}) {
		t.Errorf("merged %d setups (placed in %q), %d cells, rates %v; want 1 setup placed by its own run, 3 cells, rates 100–300",
			len(o.Setups), o.Setups[0].PlacedIn, len(o.Cells), o.Preset.Rates)
	}
	if o.middle() != 200 || !slices.Equal(o.RebalanceSeconds, []float64{90}) || o.Commit != "abc" || len(o.Parts) != 2 || o.HarnessDiff != nil {
		t.Errorf("middle rate %g, rebalancer %v, commit %q, %d parts, harness diff %v; want 200, [90] (one run), abc, 2, none",
			o.middle(), o.RebalanceSeconds, o.Commit, len(o.Parts), o.HarnessDiff)
	}
	if got := describeParts(o); !strings.Contains(got, "`later` (bookinfo/A at 300 req/s; commit `abc`") ||
		!strings.Contains(got, "bookinfo/A ran in parts by rate") || strings.Contains(got, "harness's files") {
		t.Errorf("the report's parts: %q", got)
	}

	moved := ratePart(t, "abc", t0.Add(24*time.Hour), map[string]map[string]int{"ratings": {"n1": 1, "n2": 2}}, 300)
	if _, err := MergeOutcomes([]*Outcome{first, moved}, []string{"first", "moved"}, nil); err == nil ||
		!strings.Contains(err.Error(), "bookinfo/A ran in first and moved on other placements") {
		t.Errorf("a setup's parts on two placements: %v, want an error naming both", err)
	}

	other := ratePart(t, "def", t0.Add(24*time.Hour), pl, 300)
	if _, err := MergeOutcomes([]*Outcome{first, other}, []string{"first", "other"}, nil); err == nil || !strings.Contains(err.Error(), "commit def, not abc") {
		t.Errorf("two commits, no sameProduct: %v, want the commits named", err)
	}
	asked := ""
	same := func(a, b string) ([]string, error) {
		asked = a + ".." + b
		return []string{"e2e/reproduce/run.go"}, nil
	}
	o, err = MergeOutcomes([]*Outcome{first, other}, []string{"first", "other"}, same)
	if err != nil || asked != "abc..def" || o.Commit != "abc, def" || !slices.Equal(o.HarnessDiff, []string{"e2e/reproduce/run.go"}) {
		t.Fatalf("two commits of one product: %v (asked %q, commit %q, harness diff %v)", err, asked, o.Commit, o.HarnessDiff)
	}
	if got := describeParts(o); !strings.Contains(got, "the harness's files that differ: `e2e/reproduce/run.go`") {
		t.Errorf("the report's parts: %q", got)
	}
	if md := markdown(o, o.jsonReport(), nil); !strings.Contains(md, "of commits `abc`, `def` on") {
		t.Errorf("the report's header does not name both commits:\n%s", md[:min(len(md), 400)])
	}
	differ := func(a, b string) ([]string, error) {
		return nil, fmt.Errorf("commits %s and %s differ in xds/server.go", a, b)
	}
	if _, err := MergeOutcomes([]*Outcome{first, other}, []string{"first", "other"}, differ); err == nil || !strings.Contains(err.Error(), "other") || !strings.Contains(err.Error(), "xds/server.go") {
		t.Errorf("two commits of two products: %v, want an error naming the part and the file", err)
	}
}

// SameProduct, on a real git repository: commits that differ in documents and the harness are
// one product (the harness's files returned); a file of the product, or a dirty or unknown
// commit, makes them two.
func TestSameProduct(t *testing.T) {
	dir := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	write := func(name, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	commit := func(msg string) string {
		git("add", "-A")
		git("commit", "-q", "-m", msg)
		return git("rev-parse", "--short=12", "HEAD")
	}
	git("init", "-q")
	write("xds/server.go", "package xds\n")
	write("e2e/reproduce/run.go", "package reproduce\n")
	write("docs/a.md", "a\n")
	base := commit("base")
	write("e2e/reproduce/run.go", "package reproduce // parts by rate\n")
	write("docs/a.md", "b\n")
	write("README.md", "r\n")
	harness := commit("harness and docs")
	write("xds/server.go", "package xds // changed\n")
	product := commit("product")

	files, err := sameProductIn(dir, base, harness)
	if err != nil || !slices.Equal(files, []string{"e2e/reproduce/run.go"}) {
		t.Errorf("harness and docs: %v, %v; want the harness's file and no error", files, err)
	}
	if _, err := sameProductIn(dir, harness, product); err == nil || !strings.Contains(err.Error(), "xds/server.go") {
		t.Errorf("a product file: %v, want an error naming it", err)
	}
	for _, c := range []string{base + "-dirty", "unknown", ""} {
		if _, err := sameProductIn(dir, c, harness); err == nil {
			t.Errorf("commit %q: no error", c)
		}
	}
	if _, err := sameProductIn(dir, "0123456789ab", harness); err == nil {
		t.Error("a commit not in the repository: no error")
	}
}

// CheckPlacements takes an earlier part of the same setups and preset (the rates apart) placed
// by its own run, and names what is wrong with any other.
func TestCheckPlacements(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 19, 0, 0, 0, time.UTC)
	pl := map[string]map[string]int{"ratings": {"n1": 2, "n2": 1}}
	placed := ratePart(t, "abc", t0, pl, 100, 200)
	p := ratePart(t, "abc", t0, pl, 300).Preset
	if err := CheckPlacements(placed, p); err != nil {
		t.Errorf("a part of the same setup at other rates: %v", err)
	}
	dag, err := Override(p, func(k string) string { return map[string]string{"REPRODUCE_APPS": "dag"}[k] })
	if err != nil {
		t.Fatal(err)
	}
	runs := p
	runs.Runs = 3
	taken := ratePart(t, "abc", t0, pl, 100, 200)
	taken.Setups[0].PlacedIn = "the run of yesterday"
	noLARP := ratePart(t, "abc", t0, pl, 100, 200)
	noLARP.Setups[0].After = nil
	for _, tc := range []struct {
		name   string
		placed *Outcome
		p      Preset
		want   string
	}{
		{"another app", placed, dag, "dag/A is not in the run"},
		{"another preset", placed, runs, "only the rates may differ"},
		{"placements taken", taken, p, "took bookinfo/A's placements from the run of yesterday"},
		{"no LARP placement", noLARP, p, "no placement of bookinfo/A"},
	} {
		if err := CheckPlacements(tc.placed, tc.p); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), PlacementsEnv) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}
