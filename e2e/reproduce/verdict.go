package reproduce

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// The paper's claims, judged cell by cell.
//
// A relative claim has the paper's range [lo, hi] (in %; a single figure is the range [x, x])
// and a figure per measured cell: the change with its bootstrap interval [l, h] (bootstrap.go),
// both rounded to 0.1 percentage points before judging, as the report prints them. A cell is
// in the band when its interval meets [lo − TolerancePP, hi + TolerancePP], ends included:
// l ≤ hi + 10 and h ≥ lo − 10. A row agrees only when it has at least one cell and every cell
// has a figure and is in the band; otherwise it does not agree, and the reason names each cell
// outside the band and by how many points its interval misses it, and each cell without a
// figure. The average of the cells' changes is reported beside the verdict, never as it, over
// the cells that have a figure, are not censored and are not collapse cells (Stats.Collapse of
// either row).
//
// A direction claim (the paper gives a direction, no figure) agrees when every cell's interval
// lies wholly on the paper's side of 0; a rank claim when every cell has the rank; the collapse
// claim when every setup's lowest rate does not collapse and its highest does.

// TolerancePP is how far (percentage points) a cell's interval may lie from the paper's range
// and still agree.
const TolerancePP = 10

type jsonClaim struct {
	ID    string `json:"id"`
	Claim string `json:"claim"`
	Paper string `json:"paper"`
	// PaperRange is the range judged against (relative claims), in %.
	PaperRange *[2]float64 `json:"paper_range_pct,omitempty"`
	Rule       string      `json:"rule"`
	Cells      []jsonCell  `json:"cells"`
	// Average is the mean of the cells' changes over Averaged cells (with a figure, not
	// censored, not collapse); CollapseCells were left out as collapse cells.
	Average       *float64 `json:"average_pct,omitempty"`
	Averaged      int      `json:"averaged_cells"`
	CollapseCells int      `json:"collapse_cells"`
	Verdict       string   `json:"verdict"` // "agrees", "does not agree" or "not run"
	Reason        string   `json:"reason,omitempty"`
}

// jsonCell is one cell of a claim. Relative claims fill the change; the others Value.
type jsonCell struct {
	Cell        string  `json:"cell"` // app/scenario/rate (app/rate for A → B)
	X           string  `json:"x,omitempty"`
	Base        string  `json:"base,omitempty"`
	Metric      string  `json:"metric,omitempty"`
	PointPct    float64 `json:"change_pct"`
	LoPct       float64 `json:"lo_pct"`
	HiPct       float64 `json:"hi_pct"`
	HiOpen      bool    `json:"hi_unbounded,omitempty"`
	XAtLeast    bool    `json:"x_at_least,omitempty"`
	BaseAtLeast bool    `json:"base_at_least,omitempty"`
	Paired      bool    `json:"paired,omitempty"`
	Collapse    bool    `json:"collapse,omitempty"`
	Why         string  `json:"no_figure,omitempty"`
	Value       string  `json:"value,omitempty"`
	Agrees      bool    `json:"agrees"`
}

// r1 rounds to 0.1 (the precision claims are judged and printed at).
func r1(x float64) float64 { return math.Round(x*10) / 10 }

// cellOf is a change as a claim's cell, rounded as judged.
func cellOf(name, x, base string, m metric, c change) jsonCell {
	return jsonCell{Cell: name, X: x, Base: base, Metric: m.name, PointPct: r1(c.Point), LoPct: r1(c.Lo), HiPct: r1(c.Hi),
		HiOpen: c.HiOpen, XAtLeast: c.XAtLeast, BaseAtLeast: c.BaseAtLeast, Paired: c.Paired, Collapse: c.Collapse, Why: c.Why}
}

// inBand says whether cell c's interval meets [lo − TolerancePP, hi + TolerancePP].
func inBand(c jsonCell, lo, hi float64) bool {
	h := c.HiPct
	if c.HiOpen {
		h = math.Inf(1)
	}
	return c.Why == "" && c.LoPct <= hi+TolerancePP && h >= lo-TolerancePP
}

// judgeRange fills cl's cells' Agrees, its average and its verdict against cl.PaperRange.
func judgeRange(cl *jsonClaim) {
	lo, hi := cl.PaperRange[0], cl.PaperRange[1]
	var reasons []string
	var sum float64
	for i := range cl.Cells {
		c := &cl.Cells[i]
		c.Agrees = inBand(*c, lo, hi)
		switch {
		case c.Why != "":
			reasons = append(reasons, fmt.Sprintf("%s: no figure (%s)", c.Cell, c.Why))
		case !c.Agrees && c.LoPct > hi+TolerancePP:
			reasons = append(reasons, fmt.Sprintf("%s: %s, %.1f pp above the band's %+.1f", c.Cell, fmtChange(*c), r1(c.LoPct-hi-TolerancePP), hi+TolerancePP))
		case !c.Agrees:
			reasons = append(reasons, fmt.Sprintf("%s: %s, %.1f pp below the band's %+.1f", c.Cell, fmtChange(*c), r1(lo-TolerancePP-c.HiPct), lo-TolerancePP))
		}
		if c.Why == "" && c.Collapse {
			cl.CollapseCells++
		}
		if c.Why == "" && !c.Collapse && !c.XAtLeast && !c.BaseAtLeast {
			sum += c.PointPct
			cl.Averaged++
		}
	}
	if cl.Averaged > 0 {
		a := r1(sum / float64(cl.Averaged))
		cl.Average = &a
	}
	verdict(cl, reasons)
}

// verdict sets cl's verdict from the reasons its cells gave against it.
func verdict(cl *jsonClaim, reasons []string) {
	switch {
	case len(cl.Cells) == 0:
		cl.Verdict = "not run"
	case len(reasons) == 0:
		cl.Verdict = "agrees"
	default:
		cl.Verdict, cl.Reason = "does not agree", strings.Join(reasons, "; ")
	}
}

// fmtChange prints a cell's change and interval: "−10.0 % [−14.2, −6.1]", with ≤ or ≥ when a
// side is censored and ∞ for an unbounded end.
func fmtChange(c jsonCell) string {
	if c.Why != "" {
		return "– (" + c.Why + ")"
	}
	hi := fmt.Sprintf("%+.1f", c.HiPct)
	if c.HiOpen {
		hi = "∞"
	}
	return fmt.Sprintf("%s%+.1f %% [%+.1f, %s]", censored(c.BaseAtLeast, c.XAtLeast), c.PointPct, c.LoPct, hi)
}

// censored is the mark of a change whose base's figure (≤: the change is at most this) or x's
// (≥) is a lower bound, "" when neither is.
func censored(baseAtLeast, xAtLeast bool) string {
	switch {
	case baseAtLeast:
		return "≤ "
	case xAtLeast:
		return "≥ "
	}
	return ""
}

// cellsOf lists the rates measured for app/scenario ("" = any), in order.
func (o *Outcome) cellsOf(app, sc string) []float64 {
	var rates []float64
	for _, c := range o.Cells {
		if (app == "" || c.App == app) && (sc == "" || c.Scenario == sc) && !slices.Contains(rates, c.RPS) {
			rates = append(rates, c.RPS)
		}
	}
	slices.Sort(rates)
	return rates
}

// relCells compares x with each base at every measured cell of app/scenario ("" = any).
func (o *Outcome) relCells(app, sc, x string, bases []string, m metric) []jsonCell {
	var out []jsonCell
	for _, st := range o.Setups {
		if (app != "" && st.App != app) || (sc != "" && st.Scenario != sc) {
			continue
		}
		for _, rate := range o.cellsOf(st.App, st.Scenario) {
			for _, base := range bases {
				rx := o.Find(Cell{App: st.App, Scenario: st.Scenario, Policy: x, RPS: rate})
				rb := o.Find(Cell{App: st.App, Scenario: st.Scenario, Policy: base, RPS: rate})
				if rx == nil || rb == nil {
					continue
				}
				name := fmt.Sprintf("%s/%s/%g", st.App, st.Scenario, rate)
				out = append(out, cellOf(name, x, base, m, o.compare(name+" "+x+" vs "+base+" "+m.name, rx, rb, m)))
			}
		}
	}
	return out
}

// claims judges the paper's claims on o, cell by cell.
func (o *Outcome) claims() []jsonClaim {
	rangeClaim := func(id, claim, paper string, lo, hi float64, cells []jsonCell) jsonClaim {
		cl := jsonClaim{ID: id, Claim: claim, Paper: paper, PaperRange: &[2]float64{lo, hi}, Cells: cells,
			Rule: fmt.Sprintf("every cell's %.0f %% interval meets [%+g, %+g] %%", 100*Confidence, lo-TolerancePP, hi+TolerancePP)}
		judgeRange(&cl)
		return cl
	}
	var out []jsonClaim
	out = append(out, rangeClaim("proposed-vs-baselines", "proposed vs the three baselines, P99", "−32 % on average, up to −81 %", -81, -32,
		o.relCells("", "", "proposed", []string{"default-k8s", "localization", "opttraffic"}, metricP99)))
	out = append(out, rangeClaim("bookinfo-B-vs-opttraffic", "Bookinfo, scenario B, proposed vs OptTraffic, P99", "−25 % on average", -25, -25,
		o.relCells("bookinfo", "B", "proposed", []string{"opttraffic"}, metricP99)))
	for _, c := range []struct {
		base, paper string
		lo, hi      float64
	}{{"localization", "−48…−72 %", -72, -48}, {"opttraffic", "−43…−46 %", -46, -43}, {"default-k8s", "−67…−81 %", -81, -67}} {
		out = append(out, rangeClaim("dag-B-vs-"+c.base, "DAG, scenario B, proposed vs "+c.base+", P99", c.paper, c.lo, c.hi,
			o.relCells("dag", "B", "proposed", []string{c.base}, metricP99)))
	}
	out = append(out, o.lataSecond())
	// DAG B, bottom 65 %: OptTraffic's P65 below proposed's.
	dir := jsonClaim{ID: "dag-B-p65", Claim: "DAG B, bottom 65 % of requests", Paper: "OptTraffic faster than proposed there (proposed wins tail and mean)",
		Rule: "every cell's interval of OptTraffic's P65 against proposed's lies below 0", Cells: o.relCells("dag", "B", "opttraffic", []string{"proposed"}, metricP65)}
	var reasons []string
	for i := range dir.Cells {
		c := &dir.Cells[i]
		c.Agrees = c.Why == "" && !c.HiOpen && c.HiPct < 0
		if !c.Agrees {
			reasons = append(reasons, fmt.Sprintf("%s: %s", c.Cell, fmtChange(*c)))
		}
	}
	verdict(&dir, reasons)
	out = append(out, dir)
	out = append(out, o.localizationCollapse())
	ab := func(m metric) []jsonCell {
		var cells []jsonCell
		for _, app := range []string{"bookinfo", "dag"} {
			for _, rate := range o.cellsOf(app, "") {
				a := o.Find(Cell{App: app, Scenario: "A", Policy: "default-k8s", RPS: rate})
				z := o.Find(Cell{App: app, Scenario: "B", Policy: "default-k8s", RPS: rate})
				if a == nil || z == nil {
					continue
				}
				name := fmt.Sprintf("%s/%g", app, rate)
				cells = append(cells, cellOf(name, "default-k8s B", "default-k8s A", m, o.compare(name+" default-k8s B vs A "+m.name, z, a, m)))
			}
		}
		return cells
	}
	out = append(out, rangeClaim("default-A-to-B-mean", "default K8s, latency doubled (A → B), mean", "+33…44 %", 33, 44, ab(metricMean)))
	out = append(out, rangeClaim("default-A-to-B-p99", "default K8s, latency doubled (A → B), P99", "+57…97 %", 57, 97, ab(metricP99)))
	out = append(out, rangeClaim("opttraffic-vs-default-mean", "OptTraffic vs default, mean", "−35 %", -35, -35,
		o.relCells("", "", "opttraffic", []string{"default-k8s"}, metricMean)))
	out = append(out, rangeClaim("opttraffic-vs-default-p99", "OptTraffic vs default, P99", "only −6 %", -6, -6,
		o.relCells("", "", "opttraffic", []string{"default-k8s"}, metricP99)))
	return out
}

// lataSecond is the claim that LATA alone on the default placement is second best of all
// policies, by pooled P99, cell by cell (no interval: a rank).
func (o *Outcome) lataSecond() jsonClaim {
	cl := jsonClaim{ID: "lata-second", Claim: "LATA alone on default placement", Paper: "second best of all policies (P99)",
		Rule: "lata-only has the second lowest pooled P99 in every cell (a rank; no interval)"}
	var reasons []string
	for _, st := range o.Setups {
		for _, rate := range o.cellsOf(st.App, st.Scenario) {
			type pv struct {
				name string
				v    float64
			}
			var list []pv
			for _, p := range Policies {
				if r := o.Find(Cell{App: st.App, Scenario: st.Scenario, Policy: p.Name, RPS: rate}); r != nil {
					list = append(list, pv{p.Name, o.stats(r).P99})
				}
			}
			slices.SortStableFunc(list, func(a, b pv) int { return cmpFloat(a.v, b.v) })
			for i, x := range list {
				if x.name == "lata-only" {
					c := jsonCell{Cell: fmt.Sprintf("%s/%s/%g", st.App, st.Scenario, rate), Value: fmt.Sprintf("%d of %d", i+1, len(list)), Agrees: i == 1}
					if !c.Agrees {
						reasons = append(reasons, c.Cell+": "+c.Value)
					}
					cl.Cells = append(cl.Cells, c)
				}
			}
		}
	}
	verdict(&cl, reasons)
	return cl
}

// localizationCollapse is the claim that Localization collapses from 100 to 300 req/s: per
// setup, its cell at the paper's 100 req/s (else the lowest rate) is no collapse cell and its
// cell at 300 (else the highest) is one.
func (o *Outcome) localizationCollapse() jsonClaim {
	cl := jsonClaim{ID: "localization-collapse", Claim: "Localization, 100 → 300 RPS", Paper: "mean 11 → 4,890 ms; P99 22 → 12,250 ms (collapse)",
		Rule: fmt.Sprintf("in every setup the low rate is no collapse cell and the high rate is one (P99 ≥ %v or > %g %% timeouts); absolute times differ (other hardware, simulated service time)",
			CollapseP99, 100*CollapseTimeouts)}
	var reasons []string
	for _, st := range o.Setups {
		rates := o.cellsOf(st.App, st.Scenario)
		if len(rates) < 2 {
			continue
		}
		lo, hi := rates[0], rates[len(rates)-1]
		if slices.Contains(rates, 100) && slices.Contains(rates, 300) {
			lo, hi = 100, 300
		}
		a := o.Find(Cell{App: st.App, Scenario: st.Scenario, Policy: "localization", RPS: lo})
		z := o.Find(Cell{App: st.App, Scenario: st.Scenario, Policy: "localization", RPS: hi})
		if a == nil || z == nil {
			continue
		}
		sa, sz := o.stats(a), o.stats(z)
		c := jsonCell{Cell: fmt.Sprintf("%s/%s %g→%g", st.App, st.Scenario, lo, hi),
			Value: fmt.Sprintf("mean %s → %s ms, P99 %s → %s ms, timeouts %d → %d", fmtMS(sa.Mean, sa.AtLeast["mean"], 0), fmtMS(sz.Mean, sz.AtLeast["mean"], 0),
				fmtMS(sa.P99, sa.AtLeast["p99"], 0), fmtMS(sz.P99, sz.AtLeast["p99"], 0), sa.Timeouts, sz.Timeouts),
			Agrees: !sa.Collapse() && sz.Collapse()}
		if !c.Agrees {
			reasons = append(reasons, c.Cell+": "+c.Value)
		}
		cl.Cells = append(cl.Cells, c)
	}
	verdict(&cl, reasons)
	return cl
}

// fmtMS prints a latency with prec decimals, "≥ " before a lower bound.
func fmtMS(v float64, atLeast bool, prec int) string {
	s := fmt.Sprintf("%.*f", prec, v)
	if atLeast {
		return "≥ " + s
	}
	return s
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// methodOf records the rules the figures were computed by.
func methodOf(o *Outcome) jsonMethod {
	return jsonMethod{ResolutionMS: ms(Tick), Encoding: "base64(deflate(uvarint of each sorted latency, in 10 µs ticks, minus the one before; the first minus 0)))",
		TimeoutMS: ms(o.Preset.Timeout), Quantiles: "nearest rank over the samples pooled over the runs; a timeout is a sample ≥ timeout_ms, and a quantile whose rank falls among them is reported as ≥ timeout_ms",
		MinPooledSamples: MinPooled, CollapseP99MS: ms(CollapseP99), CollapseTimeoutShare: CollapseTimeouts,
		BootstrapSeed: BootstrapSeed, BootstrapResamples: BootstrapResamples, Confidence: Confidence,
		Resampling:  "percentile bootstrap over runs (paired by round where both rows' runs took turns in the same rounds, else apart); PCG(seed, FNV-64a of the comparison's key)",
		TolerancePP: TolerancePP,
		Agreement:   "a row agrees when it has a cell and every cell's interval (rounded to 0.1 pp) meets the paper's range widened by the tolerance, ends included"}
}

// writeClaims writes the verdicts, then every claim's cells (docs/reproduction.md).
func writeClaims(b *strings.Builder, j jsonReport) {
	fmt.Fprintf(b, "Each relative claim is judged cell by cell: our figure is the change of the pooled P99 (or P65, or mean) against "+
		"the baseline's in one cell, with a %.0f %% percentile-bootstrap interval over runs (%d resamples, seed %d; runs paired by round "+
		"where both rows took turns in the same rounds, drawn apart otherwise — runs, not requests, because a slice's requests queue "+
		"behind one another and the machine's load drifts between slices; with 5 runs the intervals are too narrow more often than "+
		"they should be). A row **agrees** only when every cell's interval, rounded to 0.1 points, meets the paper's range widened by "+
		"±%d points, ends included. A collapse cell is one where either row's pooled P99 is ≥ %g ms or more than %g %% of its "+
		"requests timed out: its latency measures how long the queue grew, not the routing, so it is listed but enters no average. "+
		"The average is beside the verdict, never the verdict. ≤/≥ mark a figure bounded by the timeout.\n\n",
		100*j.Method.Confidence, j.Method.BootstrapResamples, j.Method.BootstrapSeed, int(j.Method.TolerancePP), j.Method.CollapseP99MS, 100*j.Method.CollapseTimeoutShare)
	b.WriteString("| claim (paper) | paper | judged by | verdict | average beside (cells; collapse cells left out) |\n|---|---|---|---|---|\n")
	for _, cl := range j.Claims {
		avg := "–"
		if cl.Average != nil {
			avg = fmt.Sprintf("%+.1f %% (%d; %d left out)", *cl.Average, cl.Averaged, cl.CollapseCells)
		}
		v := "**" + cl.Verdict + "**"
		if cl.Reason != "" {
			v += ": " + cl.Reason
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", cl.Claim, cl.Paper, cl.Rule, v, avg)
	}
	b.WriteString("\n### Every claim's cells\n\n| claim | cell | x vs base | ours | runs | collapse | agrees |\n|---|---|---|---|---|---|---|\n")
	for _, cl := range j.Claims {
		for _, c := range cl.Cells {
			ours, runs, vs := c.Value, "–", "–"
			if c.Value == "" {
				ours = fmtChange(c)
				runs = map[bool]string{true: "paired", false: "apart"}[c.Paired]
				vs = c.X + " vs " + c.Base + ", " + c.Metric
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s |\n", cl.ID, c.Cell, vs, ours, runs,
				map[bool]string{true: "yes", false: ""}[c.Collapse], map[bool]string{true: "yes", false: "no"}[c.Agrees])
		}
	}
}
