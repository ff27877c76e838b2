package reproduce

import (
	"bufio"
	"compress/gzip"
	"encoding/gob"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"
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

// MergeOutcomes makes one outcome of the parts of one grid run separately (make reproduce
// SETUP=APP/SCENARIO, each part its own applications × scenarios): their setups, cells and
// slices in the parts' order, the preset's applications and scenarios the union of theirs. The
// parts must be the same experiment: the same commit, workload, delay and preset but for its
// applications and scenarios; no cell may be in two parts. An error names the part that differs.
func MergeOutcomes(parts []*Outcome, names []string) (*Outcome, error) {
	if len(parts) == 0 {
		return nil, fmt.Errorf("merge: no outcome")
	}
	first := parts[0]
	o := *first
	o.Setups, o.Cells, o.Order, o.RebalanceSeconds = nil, nil, nil, nil
	o.Preset.Apps, o.Preset.Scenarios = nil, nil
	o.Preset.Name = baseName(first.Preset.Name)
	o.Slices, o.SliceTime = 0, 0
	var sliceTotal time.Duration
	seen := map[Cell]string{}
	nameOf := func(i int) string {
		if i < len(names) {
			return names[i]
		}
		return fmt.Sprintf("part %d", i+1)
	}
	for i, p := range parts {
		name := nameOf(i)
		if diff := sameExperiment(first, p); diff != "" {
			return nil, fmt.Errorf("merge: %s is not the same experiment as %s: %s", name, nameOf(0), diff)
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
		for _, r := range p.Cells {
			if other, ok := seen[r.Cell]; ok {
				return nil, fmt.Errorf("merge: cell %s %s %s %g req/s is in both %s and %s", r.App, r.Scenario, r.Policy, r.RPS, other, name)
			}
			seen[r.Cell] = name
		}
		o.Setups = append(o.Setups, p.Setups...)
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
	if o.Slices > 0 {
		o.SliceTime = sliceTotal / time.Duration(o.Slices)
	}
	return &o, nil
}

// baseName is a preset's name without the overrides' suffixes (+apps, +scenarios), which
// differ between the parts of one grid.
func baseName(name string) string {
	for _, s := range []string{"+apps", "+scenarios"} {
		name = strings.ReplaceAll(name, s, "")
	}
	return name
}

// sameExperiment says how b differs from a beyond its applications and scenarios ("" if not).
func sameExperiment(a, b *Outcome) string {
	pa, pb := a.Preset, b.Preset
	pa.Apps, pb.Apps, pa.Scenarios, pb.Scenarios = nil, nil, nil, nil
	pa.Name, pb.Name = baseName(pa.Name), baseName(pb.Name)
	switch {
	case a.Commit != b.Commit:
		return fmt.Sprintf("commit %s, not %s", b.Commit, a.Commit)
	case a.Netem != b.Netem:
		return fmt.Sprintf("netem %v, not %v", b.Netem, a.Netem)
	case !reflect.DeepEqual(a.Workload, b.Workload):
		return fmt.Sprintf("workload %+v, not %+v", b.Workload, a.Workload)
	case !reflect.DeepEqual(pa, pb):
		return fmt.Sprintf("preset %+v, not %+v", pb, pa)
	}
	return ""
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
	return MergeOutcomes(parts, files)
}
