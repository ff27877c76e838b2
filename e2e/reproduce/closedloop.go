package reproduce

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// closedLoopRows are the rows of the closed loop's comparison (issue 37), in the table's order;
// the last is the one compared.
var closedLoopRows = []string{"least-request", "lata-only", "lata-q", "closed-loop"}

// closedLoopTarget is what issue 37 asks of closed-loop's P99 against the better of lata-only
// and least-request, run by run (the median of the paired runs' ratios): at most 1.02 × it on
// homogeneous pods at every rate; with pods slower than their peers (Preset.Slow), at most
// 0.90 × each at the two highest rates.
func closedLoopTarget(o *Outcome, rate float64) (limit float64, against string) {
	if len(o.Preset.Slow) == 0 {
		return 1.02, "min"
	}
	rates := o.Preset.Rates
	if len(rates) >= 2 && rate < rates[len(rates)-2] {
		return 0, ""
	}
	return 0.90, "each"
}

// closedLoopSection is the report's comparison of closed-loop with least-request, lata-only and
// lata-q, setup by setup and rate by rate: each row's median over the runs of a run's P99 (with
// the lowest and highest), and closed-loop's P99 over the better of lata-only and least-request
// in the same run, the median over the runs and its range, against the target. "" when
// closed-loop did not run.
func closedLoopSection(o *Outcome) string {
	if !slices.ContainsFunc(o.Preset.Rows(), func(p Policy) bool { return p.Name == "closed-loop" }) {
		return ""
	}
	var b strings.Builder
	b.WriteString("| app | scenario | req/s |")
	for _, name := range closedLoopRows {
		b.WriteString(" " + name + " |")
	}
	b.WriteString(" closed-loop ÷ least-request | ÷ lata-only | ÷ the better, per run | target |\n|---|---|---|" +
		strings.Repeat("---|", len(closedLoopRows)+4) + "\n")
	for _, st := range o.Setups {
		for _, rate := range o.cellsOf(st.App, st.Scenario) {
			fmt.Fprintf(&b, "| %s | %s | %g |", st.App, st.Scenario, rate)
			p99 := map[string][]float64{}
			for _, name := range closedLoopRows {
				r := o.Find(Cell{App: st.App, Scenario: st.Scenario, Policy: name, RPS: rate})
				if r == nil {
					b.WriteString(" not run |")
					continue
				}
				p99[name] = o.stats(r).RunP99
				sp := spread(p99[name])
				fmt.Fprintf(&b, " %.1f (%.0f–%.0f) |", medianOf(p99[name]), sp[0], sp[1])
			}
			cl, lr, la := p99["closed-loop"], p99["least-request"], p99["lata-only"]
			ratio := func(base func(i int) float64) string {
				var v []float64
				for i := range cl {
					if i < len(lr) && i < len(la) {
						v = append(v, cl[i]/base(i))
					}
				}
				if len(v) == 0 {
					return " — |"
				}
				sp := spread(v)
				return fmt.Sprintf(" %.2f (%.2f–%.2f) |", medianOf(v), sp[0], sp[1])
			}
			b.WriteString(ratio(func(i int) float64 { return lr[i] }))
			b.WriteString(ratio(func(i int) float64 { return la[i] }))
			b.WriteString(ratio(func(i int) float64 { return min(lr[i], la[i]) }))
			switch limit, against := closedLoopTarget(o, rate); against {
			case "min":
				fmt.Fprintf(&b, " ≤ %.2f × the better |\n", limit)
			case "each":
				fmt.Fprintf(&b, " ≤ %.2f × each |\n", limit)
			default:
				b.WriteString(" — |\n")
			}
		}
	}
	b.WriteString("\nP99 in ms: the median over the runs of a run's P99 (the lowest and highest in brackets). " +
		"The ratios pair closed-loop's run with the other rows' run of the same round (every row takes turns in a round); " +
		"the median of the rounds' ratios, their range in brackets.\n")
	return b.String()
}

// fmtSlow names the slowed pods of every setup and their factors.
func fmtSlow(o *Outcome) string {
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(o.Preset.Slow)) {
		parts = append(parts, fmt.Sprintf("one pod of %s %g× slower", c, o.Preset.Slow[c]))
	}
	for _, st := range o.Setups {
		if len(st.Slowed) > 0 {
			parts = append(parts, fmt.Sprintf("%s/%s: %s", st.App, st.Scenario, strings.Join(st.Slowed, ", ")))
		}
	}
	return strings.Join(parts, "; ")
}
