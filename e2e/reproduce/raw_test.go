package reproduce

import (
	"os"
	"path/filepath"
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
	o, err := MergeOutcomes(parts, []string{"bookinfo-A", "bookinfo-B", "dag-B"})
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
	if _, err := MergeOutcomes([]*Outcome{parts[0], other}, []string{"bookinfo-A", "dag-A"}); err == nil || !strings.Contains(err.Error(), "dag-A") || !strings.Contains(err.Error(), "commit def") {
		t.Errorf("parts of two commits: %v, want an error naming dag-A and its commit", err)
	}
	other = part(t, DAG, "A", t0)
	other.Preset.Runs = 3
	if _, err := MergeOutcomes([]*Outcome{parts[0], other}, nil); err == nil || !strings.Contains(err.Error(), "part 2") {
		t.Errorf("parts of two presets: %v, want an error naming part 2", err)
	}
	if _, err := MergeOutcomes([]*Outcome{parts[0], part(t, Bookinfo, "A", t0)}, []string{"x", "y"}); err == nil || !strings.Contains(err.Error(), "in both x and y") {
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
