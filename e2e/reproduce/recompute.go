package reproduce

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
)

// ErrNoRunValues is returned by Recompute for a report of schema 1, which kept each cell's
// pooled figures only: without the runs' latencies nothing in it can be recomputed.
var ErrNoRunValues = errors.New("reproduce: schema 1 report: no per-run latencies, its figures cannot be recomputed")

// outcomeOf rebuilds, from a report of this schema, the outcome its figures are computed from:
// every run's latencies at the report's resolution, counts, elapsed time, send lag and plan
// cost, the setups, the preset and the run's record. WriteReport computes the report from
// this outcome, so that the JSON alone reproduces every figure (Recompute).
func outcomeOf(j jsonReport) (*Outcome, error) {
	if j.Schema != Schema {
		if j.Schema == 0 {
			return nil, ErrNoRunValues
		}
		return nil, fmt.Errorf("reproduce: report of schema %d, this code reads %d", j.Schema, Schema)
	}
	o := &Outcome{Preset: j.Run.Config, Workload: j.Run.Workload, Netem: j.Testbed.NetemInKernel, Started: j.Run.Started, Ended: j.Run.Ended,
		Commit: j.Run.Commit, Slices: j.Run.Slices, SliceTime: time.Duration(j.Run.SliceNS), RebalanceSeconds: j.Run.RebalanceSeconds,
		Order: j.Run.Order, Seed: j.Run.Seed, Parts: j.Run.Parts, HarnessDiff: j.Run.HarnessDiff}
	for _, s := range j.Setups {
		o.Setups = append(o.Setups, &Setup{App: s.App, Scenario: s.Scenario, RTT: j.Testbed.RTTAccuracy[s.App+"/"+s.Scenario],
			Before: s.Before, After: s.After, Moves: s.Moves, Settled: s.Settled, CostBefore: s.CostBefore, CostAfter: s.CostAfter,
			Pending: s.Pending, MaxRate: s.MaxRate, PlacedIn: s.PlacedIn})
	}
	for _, r := range j.Results {
		c := &Runs{Cell: Cell{App: r.App, Scenario: r.Scenario, Policy: r.Policy, RPS: r.RPS}}
		for i, s := range r.PerRun {
			ticks, err := decodeTicks(s.Latency, s.OK)
			if err != nil {
				return nil, fmt.Errorf("reproduce: %s %s %s %g req/s run %d: %w", r.App, r.Scenario, r.Policy, r.RPS, i+1, err)
			}
			lat := make(loadgen.Samples, len(ticks))
			for k, t := range ticks {
				lat[k] = time.Duration(t) * Tick
			}
			c.Results = append(c.Results, &loadgen.Result{Sent: s.OK + s.Timeouts + s.Errors, OK: s.OK, Errors: s.Timeouts + s.Errors,
				Timeouts: s.Timeouts, ErrorKinds: s.ErrorKinds, Latency: lat, Elapsed: time.Duration(s.ElapsedNS), MaxSendLag: time.Duration(s.MaxLagNS)})
			cost := math.NaN()
			if s.PlanCost != nil {
				cost = *s.PlanCost
			}
			c.PlanCost = append(c.PlanCost, cost)
			c.Round = append(c.Round, s.Round)
			if s.Health != nil {
				c.Health = append(c.Health, *s.Health)
				c.Attempts = append(c.Attempts, max(s.Attempts, 1))
			}
		}
		o.Cells = append(o.Cells, c)
	}
	return o, nil
}

// quantized is o as its report keeps it (outcomeOf of its JSON): what every figure of the
// report is computed from.
func quantized(o *Outcome) (*Outcome, error) {
	j := o.jsonInputs()
	b, err := json.Marshal(j)
	if err != nil {
		return nil, err
	}
	var back jsonReport
	if err := json.Unmarshal(b, &back); err != nil {
		return nil, err
	}
	return outcomeOf(back)
}

// plotNames are the CDF plots writePlots draws for o: one per setup with a sample at the middle
// rate.
func plotNames(o *Outcome) []string {
	var names []string
	for _, st := range o.Setups {
		if slices.ContainsFunc(Policies, func(p Policy) bool {
			r := o.Find(Cell{App: st.App, Scenario: st.Scenario, Policy: p.Name, RPS: o.middle()})
			return r != nil && slices.ContainsFunc(r.Results, func(res *loadgen.Result) bool { return len(res.Latency) > 0 })
		}) {
			names = append(names, fmt.Sprintf("reproduction-%s-%s.png", st.App, st.Scenario))
		}
	}
	return names
}

// Recompute reads a report (reproduction.json and reproduction.md as WriteReport wrote them),
// recomputes every figure of both from the JSON's per-run latencies and counts, and returns an
// error listing each figure that differs (the JSON's by path, the Markdown's by line), or
// ErrNoRunValues for a schema 1 report. It recomputes with this package's code: it checks that
// the report is what its JSON gives under the rules the JSON's "method" records, and refuses a
// report written under other rules (another seed, tolerance or resolution).
func Recompute(jsonPath, mdPath string) error {
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		return err
	}
	var j jsonReport
	if err := json.Unmarshal(raw, &j); err != nil {
		return fmt.Errorf("%s: %w", jsonPath, err)
	}
	o, err := outcomeOf(j)
	if err != nil {
		return fmt.Errorf("%s: %w", jsonPath, err)
	}
	if m := methodOf(o); !reflect.DeepEqual(m, j.Method) {
		return fmt.Errorf("%s: written under other rules (method %+v), this code computes by %+v: recompute it with the commit that wrote it", jsonPath, j.Method, m)
	}
	again := o.jsonReport()
	var problems []string
	b, err := json.Marshal(again)
	if err != nil {
		return err
	}
	var want, got any
	if err := json.Unmarshal(b, &want); err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		return err
	}
	diffJSON("", got, want, &problems)
	md, err := os.ReadFile(mdPath)
	if err != nil {
		return err
	}
	gotLines, wantLines := strings.Split(string(md), "\n"), strings.Split(markdown(o, again, plotNames(o)), "\n")
	for i := range max(len(gotLines), len(wantLines)) {
		g, w := "", ""
		if i < len(gotLines) {
			g = gotLines[i]
		}
		if i < len(wantLines) {
			w = wantLines[i]
		}
		if g != w {
			problems = append(problems, fmt.Sprintf("%s line %d:\n    has        %s\n    recomputed %s", mdPath, i+1, g, w))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	shown := problems[:min(len(problems), 20)]
	return fmt.Errorf("reproduce: %d figures differ from what the JSON gives:\n  %s%s", len(problems), strings.Join(shown, "\n  "),
		map[bool]string{true: fmt.Sprintf("\n  … and %d more", len(problems)-len(shown)), false: ""}[len(problems) > len(shown)])
}

// diffJSON appends to out every path where got (the report's JSON) differs from want (the
// recomputed), as decoded by encoding/json.
func diffJSON(path string, got, want any, out *[]string) {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			*out = append(*out, fmt.Sprintf("%s: has %v, recomputed an object", path, got))
			return
		}
		keys := map[string]bool{}
		for k := range w {
			keys[k] = true
		}
		for k := range g {
			keys[k] = true
		}
		for _, k := range sortedKeys(keys) {
			diffJSON(path+"."+k, g[k], w[k], out)
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			*out = append(*out, fmt.Sprintf("%s: has %d elements, recomputed %d", path, len(g), len(w)))
			return
		}
		for i := range w {
			diffJSON(fmt.Sprintf("%s[%d]", path, i), g[i], w[i], out)
		}
	default:
		if !reflect.DeepEqual(got, want) {
			*out = append(*out, fmt.Sprintf("%s: has %v, recomputed %v", path, got, want))
		}
	}
}
