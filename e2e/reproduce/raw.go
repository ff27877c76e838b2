package reproduce

import (
	"bufio"
	"compress/gzip"
	"encoding/gob"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

// SaveOutcome writes everything a run measured, every latency included, to path (gob, gzipped
// when path ends in ".gz": the form a part of the grid is committed in, docs/reproduction-paper),
// so that the report can be written again from it (RenderReport) without running the experiment
// again. It writes a temporary file beside path and renames it, so path is never half-written.
func SaveOutcome(o *Outcome, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, a no-op
	var w io.Writer = f
	var z *gzip.Writer
	if strings.HasSuffix(path, ".gz") {
		z, _ = gzip.NewWriterLevel(f, gzip.BestCompression)
		w = z
	}
	if err := gob.NewEncoder(w).Encode(o); err != nil {
		f.Close()
		return fmt.Errorf("save outcome: %w", err)
	}
	if z != nil {
		if err := z.Close(); err != nil {
			f.Close()
			return fmt.Errorf("save outcome: %w", err)
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// LoadOutcome reads what SaveOutcome wrote, gzipped or not (it looks at the first bytes, not at
// the name).
func LoadOutcome(path string) (*Outcome, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := bufio.NewReader(f)
	var r io.Reader = b
	if magic, _ := b.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		z, err := gzip.NewReader(b)
		if err != nil {
			return nil, fmt.Errorf("%s: not a saved outcome: %w", path, err)
		}
		defer z.Close()
		r = z
	}
	var o Outcome
	if err := gob.NewDecoder(r).Decode(&o); err != nil {
		return nil, fmt.Errorf("%s: not a saved outcome: %w", path, err)
	}
	return &o, nil
}

// Part is one invocation of make reproduce merged into an outcome (MergeOutcomes), as its
// report names it.
type Part struct {
	Name    string    `json:"name"`   // the file it was read from
	Commit  string    `json:"commit"` // the edgeflow commit it ran
	Setups  []string  `json:"setups"` // APP/SCENARIO
	Rates   []float64 `json:"rates"`
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended"`
	Slices  int       `json:"slices"`
}

// MergeOutcomes makes one outcome of the parts of one grid run separately: each part its own
// applications × scenarios (make reproduce SETUP=APP/SCENARIO), or its own rates of one
// (REPRODUCE_RATES, on the placements of the setup's first part: REPRODUCE_PLACEMENTS). The
// merged outcome has every setup once, every cell and slice in the parts' order, and the
// preset's applications, scenarios and rates the union of theirs; Parts records each part.
//
// The parts must be the same experiment: the same workload, delay and preset but for its
// applications, scenarios and rates; no cell in two parts; a setup in several parts on the same
// placements (both of them). And the same edgeflow: parts of different commits merge only where
// sameProduct(a, b) finds that the commits differ in the harness and the documents alone; it
// returns the harness's files that differ, which the outcome keeps (HarnessDiff) and the report
// lists. A nil sameProduct refuses any two commits. An error names the part that differs.
func MergeOutcomes(parts []*Outcome, names []string, sameProduct func(a, b string) ([]string, error)) (*Outcome, error) {
	if len(parts) == 0 {
		return nil, fmt.Errorf("merge: no outcome")
	}
	first := parts[0]
	o := *first
	o.Setups, o.Cells, o.Order, o.RebalanceSeconds, o.Parts, o.HarnessDiff = nil, nil, nil, nil, nil, nil
	o.Preset.Apps, o.Preset.Scenarios, o.Preset.Rates = nil, nil, nil
	o.Preset.Name = baseName(first.Preset.Name)
	o.Slices, o.SliceTime = 0, 0
	var sliceTotal time.Duration
	seen := map[Cell]string{}
	setupIn := map[string]string{} // APP/SCENARIO → the part whose setup the outcome keeps
	var commits []string
	diff := map[string]bool{}
	nameOf := func(i int) string {
		if i < len(names) {
			return names[i]
		}
		return fmt.Sprintf("part %d", i+1)
	}
	for i, p := range parts {
		name := nameOf(i)
		if d := sameExperiment(first, p); d != "" {
			return nil, fmt.Errorf("merge: %s is not the same experiment as %s: %s", name, nameOf(0), d)
		}
		if !slices.Contains(commits, p.Commit) {
			for _, c := range commits {
				if sameProduct == nil {
					return nil, fmt.Errorf("merge: %s is not the same experiment as %s: commit %s, not %s", name, nameOf(0), p.Commit, c)
				}
				files, err := sameProduct(c, p.Commit)
				if err != nil {
					return nil, fmt.Errorf("merge: %s is not the same experiment as %s: %w", name, nameOf(0), err)
				}
				for _, f := range files {
					diff[f] = true
				}
			}
			commits = append(commits, p.Commit)
		}
		for _, a := range p.Preset.Apps {
			if !slices.ContainsFunc(o.Preset.Apps, func(b App) bool { return b.Name == a.Name }) {
				o.Preset.Apps = append(o.Preset.Apps, a)
			}
		}
		for _, sc := range p.Preset.Scenarios {
			if !slices.Contains(o.Preset.Scenarios, sc) {
				o.Preset.Scenarios = append(o.Preset.Scenarios, sc)
			}
		}
		for _, r := range p.Preset.Rates {
			if !slices.Contains(o.Preset.Rates, r) {
				o.Preset.Rates = append(o.Preset.Rates, r)
			}
		}
		for _, r := range p.Cells {
			if other, ok := seen[r.Cell]; ok {
				return nil, fmt.Errorf("merge: cell %s %s %s %g req/s is in both %s and %s", r.App, r.Scenario, r.Policy, r.RPS, other, name)
			}
			seen[r.Cell] = name
		}
		part := Part{Name: name, Commit: p.Commit, Rates: p.Preset.Rates, Started: p.Started, Ended: p.Ended, Slices: p.Slices}
		for _, st := range p.Setups {
			key := st.App + "/" + st.Scenario
			part.Setups = append(part.Setups, key)
			k := slices.IndexFunc(o.Setups, func(s *Setup) bool { return s.App == st.App && s.Scenario == st.Scenario })
			if k < 0 {
				o.Setups = append(o.Setups, st)
				setupIn[key] = name
				continue
			}
			if !reflect.DeepEqual(o.Setups[k].Before, st.Before) || !reflect.DeepEqual(o.Setups[k].After, st.After) {
				return nil, fmt.Errorf("merge: %s ran in %s and %s on other placements (the later part of a setup takes the first's: REPRODUCE_PLACEMENTS)", key, setupIn[key], name)
			}
			if o.Setups[k].PlacedIn != "" && st.PlacedIn == "" { // keep the part that placed the pods: its rebalancer's record
				o.Setups[k] = st
				setupIn[key] = name
			}
		}
		o.Parts = append(o.Parts, part)
		o.Cells = append(o.Cells, p.Cells...)
		o.Order = append(o.Order, p.Order...)
		o.RebalanceSeconds = append(o.RebalanceSeconds, p.RebalanceSeconds...)
		o.Slices += p.Slices
		sliceTotal += p.SliceTime * time.Duration(p.Slices)
		if p.Started.Before(o.Started) {
			o.Started = p.Started
		}
		if p.Ended.After(o.Ended) {
			o.Ended = p.Ended
		}
	}
	slices.Sort(o.Preset.Rates)
	o.Commit = strings.Join(commits, ", ")
	o.HarnessDiff = slices.Sorted(maps.Keys(diff))
	if o.Slices > 0 {
		o.SliceTime = sliceTotal / time.Duration(o.Slices)
	}
	return &o, nil
}

// baseName is a preset's name without the overrides' suffixes (+apps, +scenarios, +rates),
// which differ between the parts of one grid.
func baseName(name string) string {
	for _, s := range []string{"+apps", "+scenarios", "+rates"} {
		name = strings.ReplaceAll(name, s, "")
	}
	return name
}

// sameExperiment says how b differs from a beyond its applications, scenarios, rates and
// commit ("" if not).
func sameExperiment(a, b *Outcome) string {
	pa, pb := a.Preset, b.Preset
	pa.Apps, pb.Apps, pa.Scenarios, pb.Scenarios, pa.Rates, pb.Rates = nil, nil, nil, nil, nil, nil
	pa.Name, pb.Name = baseName(pa.Name), baseName(pb.Name)
	switch {
	case a.Netem != b.Netem:
		return fmt.Sprintf("netem %v, not %v", b.Netem, a.Netem)
	case !reflect.DeepEqual(a.Workload, b.Workload):
		return fmt.Sprintf("workload %+v, not %+v", b.Workload, a.Workload)
	case !reflect.DeepEqual(pa, pb):
		return fmt.Sprintf("preset %+v, not %+v", pb, pa)
	}
	return ""
}

// SameProduct is MergeOutcomes' test of two commits in this repository (git diff --name-only):
// they ran the same edgeflow when every file that differs between them is a document (under
// docs/, or a .md file) or the harness's (under e2e/reproduce/), and neither is a dirty or
// unknown work tree. It returns the harness's files that differ; an error names a file of the
// product that differs.
func SameProduct(a, b string) ([]string, error) { return sameProductIn(testkit.RepoRoot(), a, b) }

// sameProductIn is SameProduct in the git repository at dir.
func sameProductIn(dir, a, b string) ([]string, error) {
	for _, c := range []string{a, b} {
		if c == "" || c == "unknown" || strings.HasSuffix(c, "-dirty") {
			return nil, fmt.Errorf("commit %q: not one commit, so not comparable", c)
		}
	}
	out, err := exec.Command("git", "-C", dir, "diff", "--name-only", a, b).Output()
	if err != nil {
		var stderr []byte
		if e, ok := err.(*exec.ExitError); ok {
			stderr = e.Stderr
		}
		return nil, fmt.Errorf("git diff %s %s: %w: %s", a, b, err, strings.TrimSpace(string(stderr)))
	}
	var harness []string
	for _, f := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(f, "docs/") || strings.HasSuffix(f, ".md"):
		case strings.HasPrefix(f, "e2e/reproduce/"):
			harness = append(harness, f)
		default:
			return nil, fmt.Errorf("commits %s and %s differ in %s, not only in the harness (e2e/reproduce/) and the documents", a, b, f)
		}
	}
	return harness, nil
}

// LoadOutcomes reads the outcomes at paths (a comma-separated list; each may be a glob) and
// merges them (MergeOutcomes) when there are several.
func LoadOutcomes(paths string) (*Outcome, error) {
	var files []string
	for _, p := range strings.Split(paths, ",") {
		m, err := filepath.Glob(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("%s: no such outcome", p)
		}
		files = append(files, m...)
	}
	var parts []*Outcome
	for _, f := range files {
		o, err := LoadOutcome(f)
		if err != nil {
			return nil, err
		}
		parts = append(parts, o)
	}
	if len(parts) == 1 {
		return parts[0], nil
	}
	return MergeOutcomes(parts, files, SameProduct)
}

// PlacementsEnv names the outcome (a saved part, as LoadOutcomes reads it) whose placements a
// run takes (Run's placed): make reproduce SETUP=APP/SCENARIO REPRODUCE_RATES=… run as a later
// part of a setup whose first part placed its pods.
const PlacementsEnv = "REPRODUCE_PLACEMENTS"

// setup is o's setup of app × scenario sc, or nil (also for a nil o).
func (o *Outcome) setup(app, sc string) *Setup {
	if o == nil {
		return nil
	}
	for _, st := range o.Setups {
		if st.App == app && st.Scenario == sc {
			return st
		}
	}
	return nil
}

// describeRun names the run o is, for Setup.PlacedIn: when it started and its commit.
func (o *Outcome) describeRun() string {
	return fmt.Sprintf("the run of %s on %s", o.Started.UTC().Format("2006-01-02 15:04 MST"), o.Commit)
}

// CheckPlacements says why placed cannot give p's run its placements (nil if it can): every
// application × scenario p runs must be in it, placed by that run itself, with LARP's placement
// where p has LARP rows, and of the same workload and preset but for the rates (the pods' count
// and CPU decide where they fit).
func CheckPlacements(placed *Outcome, p Preset) error {
	run := "the run of " + placed.Started.UTC().Format(time.DateTime)
	if d := sameExperiment(placed, &Outcome{Preset: p, Workload: p.workload(), Netem: placed.Netem}); d != "" {
		return fmt.Errorf("%s: %s is another experiment: %s (only the rates may differ)", PlacementsEnv, run, d)
	}
	larp := slices.ContainsFunc(p.Rows(), func(q Policy) bool { return q.LARP })
	for _, sc := range p.Scenarios {
		for _, a := range p.Apps {
			st := placed.setup(a.Name, sc)
			switch {
			case st == nil:
				return fmt.Errorf("%s: %s/%s is not in %s", PlacementsEnv, a.Name, sc, run)
			case st.PlacedIn != "":
				return fmt.Errorf("%s: %s took %s/%s's placements from %s: give that one", PlacementsEnv, run, a.Name, sc, st.PlacedIn)
			case len(st.Before) == 0 || larp && len(st.After) == 0:
				return fmt.Errorf("%s: %s has no placement of %s/%s for every row", PlacementsEnv, run, a.Name, sc)
			}
		}
	}
	return nil
}
