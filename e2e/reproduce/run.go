package reproduce

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
	"github.com/edgeflow/edgeflow/internal/testkit"
)

// Cell is one measured configuration.
type Cell struct {
	App, Scenario, Policy string
	RPS                   float64
}

// Runs are a cell's runs, in order.
type Runs struct {
	Cell
	Results []*loadgen.Result
	// PlanCost is, per run, the network cost of the plan serve had published when the run's
	// slice ended, priced at the configured RTTs (Served.Cost, ms·req/s); NaN where it could
	// not be read. Outcomes saved before it was recorded have none.
	PlanCost []float64
	// Round names, per run, the round it ran in: runs of two rows with the same round took turns
	// within it (the bootstrap pairs them). Nil (the harness does not record it yet, and in
	// outcomes saved before it existed): roundOf derives it from Run's order.
	Round []string
	// Traffic and PlannedRTT are, per run, that plan's Served.Traffic and Served.PlannedRTT
	// (nil where it could not be read, and in outcomes saved before they were recorded).
	Traffic, PlannedRTT []map[[2]string]float64
	// Health is, per run, the health of the slice kept (Health; outcomes saved before it was
	// measured have none), and Attempts how many slices that run took: more than 1 when
	// unhealthy ones were re-run (Preset.Reruns), whose results are not kept.
	Health   []Health
	Attempts []int
	// Capacity is, per run, the capacities (req/s by pod) serve's estimator had in force when
	// the slice ended, for the rows that measure them (lata-q, closed-loop); nil for the others.
	Capacity []map[string]float64
	// Publications is, per run, how many plans serve published while the slice's measured load
	// ran, its warm-up included (edgeflow_xds_publications_total's increase; a row on measured
	// pods' settling before it is not counted since 727e935, and was before), -1 where its
	// metrics could not be read.
	Publications []int `json:",omitempty"`
	// WarmupSeconds is, per run, the warm-up its slice got before measuring (Served.Warmup), and
	// Settled whether it ended by the settle rule (Served.Settled); outcomes saved before they
	// were recorded have none.
	WarmupSeconds []float64 `json:",omitempty"`
	Settled       []bool    `json:",omitempty"`
}

// Setup is what one application × scenario ran on: the measured RTTs, and the placement by
// the kube-scheduler (Before) and after `edgeflow rebalance` (After).
type Setup struct {
	App, Scenario string
	RTT           []PairAccuracy
	Before, After map[string]map[string]int
	Moves         int
	Settled       bool // the rebalancer finished its plan before its timeout (Rebalanced.Settled)
	// CostBefore and CostAfter are the rebalancer's predicted LATA cost (Σ req/s × measured
	// RTT, ms·req/s) of the scheduler's placement and of the one it left; 0 if not read.
	CostBefore, CostAfter float64
	Pending               []string // pods not placed once the rebalancer settled
	MaxRate               float64  // the highest rate at which default-k8s kept P99 < 1 s (FindMax), else 0
	Slowed                []string // the pods Preset.Slow slowed, unseen by Kubernetes and edgeflow
	// PlacedIn is "" where this run placed the pods (the scheduler, then the rebalancer), else
	// the run whose placements it pinned and whose rebalancer's record it copied
	// (REPRODUCE_PLACEMENTS: a later part of a setup run in parts by rate).
	PlacedIn string
}

// Outcome is everything one invocation measured.
type Outcome struct {
	Preset         Preset
	Workload       Workload
	Netem          bool
	Setups         []*Setup
	Cells          []*Runs
	Started, Ended time.Time
	// Commit is the edgeflow commit that ran (git rev-parse; "-dirty" when the work tree had
	// uncommitted changes; "unknown" outside a git checkout).
	Commit string
	Slices int
	// Order is every measured slice, in the order it ran (interleave); Seed the shuffles' seed.
	Order            []Slice
	Seed             uint64
	SliceTime        time.Duration // mean wall time of one slice (serve start + load + stop)
	RebalanceSeconds []float64
	// Parts is every invocation merged into this outcome (MergeOutcomes), nil for one run; then
	// Commit lists the parts' commits, and HarnessDiff is the harness's files that differ
	// between them (the product does not: SameProduct).
	Parts       []Part
	HarnessDiff []string
}

// Find returns the cell's runs, or nil.
func (o *Outcome) Find(c Cell) *Runs {
	for _, r := range o.Cells {
		if r.Cell == c {
			return r
		}
	}
	return nil
}

// progress prints what runs and the time left, estimated from the slices done.
type progress struct {
	w          io.Writer
	start      time.Time
	total      int
	done       int
	sliceTotal time.Duration
}

func (p *progress) slice(c Cell, run, runs int, took time.Duration, res *loadgen.Result) {
	p.done++
	p.sliceTotal += took
	left := time.Duration(float64(p.sliceTotal) / float64(p.done) * float64(max(p.total-p.done, 0)))
	fmt.Fprintf(p.w, "[%d/%d %s elapsed, ~%s left] %s %s %-13s %4g req/s run %d/%d: P50 %.1f P99 %.1f mean %.1f ms, %d errors, send lag ≤ %.1f ms (%.1fs)\n",
		p.done, p.total, time.Since(p.start).Round(time.Second), left.Round(time.Second), c.App, c.Scenario, c.Policy, c.RPS,
		run, runs, ms(res.Latency.Quantile(0.5)), ms(res.Latency.Quantile(0.99)), ms(res.Latency.Mean()), res.Errors, ms(res.MaxSendLag), took.Seconds())
	if res.Errors > 0 {
		fmt.Fprintf(p.w, "  errors%s\n", errorKinds(res))
	}
}

// errorKinds describes a result's errors by kind (": N × message, …"), "" if none.
func errorKinds(res *loadgen.Result) string {
	if res.Errors == 0 {
		return ""
	}
	var parts []string
	for _, k := range sortedKeys(res.ErrorKinds) {
		parts = append(parts, fmt.Sprintf("%d × %s", res.ErrorKinds[k], k))
	}
	return ": " + strings.Join(parts, "; ")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Run runs the preset on a fresh harness and returns what it measured; progress goes to log.
// Scenarios are the outer loop (the first one listed runs first for every app). checkpoint, if
// set, is called with the outcome so far after each application × scenario. placed, if set, is
// an earlier part of the same setups (REPRODUCE_PLACEMENTS; CheckPlacements has passed): each
// setup then runs on its placements, pinned, and the rebalancer does not run (its record is
// copied), so that a setup can be run in parts by rate that merge (MergeOutcomes).
func Run(t testing.TB, ctx context.Context, p Preset, log io.Writer, checkpoint func(*Outcome), placed *Outcome) *Outcome {
	for _, q := range p.Rows() {
		if q.Extra && !p.workload().Metrics {
			t.Fatalf("row %s plans on the pods' telemetry: the preset's workload must export it (Workload.Metrics)", q.Name)
		}
	}
	o := &Outcome{Preset: p, Workload: p.workload(), Started: time.Now(), Commit: commit(), Seed: p.seed()}
	h := NewHarnessWith(t, ctx, p.Scenarios[0], log, p.NodeCPU, p.tcpPenalty())
	o.Netem = h.NetemAvailable()
	pr := &progress{w: log, start: time.Now(), total: len(p.Apps) * len(p.Scenarios) * len(p.Rates) * p.Runs * len(p.Rows())}
	if p.FindMax {
		pr.total += len(p.Apps) * len(p.Scenarios) * p.Runs * len(p.Rows())
	}
	slice := func(a App, sc string, pol Policy, rate float64, run int, place string) {
		if ctx.Err() != nil {
			t.Fatalf("stopped before %s %s %s %g req/s (run %d): %v", a.Name, sc, pol.Name, rate, run, context.Cause(ctx))
		}
		begin := time.Now()
		o.Order = append(o.Order, Slice{App: a.Name, Scenario: sc, Run: run, Placement: place, Policy: pol.Name, RPS: rate, Start: begin})
		var res *loadgen.Result
		var plan Served
		var perr error
		var health Health
		attempts := 0
		for attempts <= p.reruns() {
			attempts++
			res, plan, perr, health = loadOnce(h, a, sc, pol, p, rate)
			fmt.Fprintf(log, "  health: %s\n", health)
			if len(health.Problems) == 0 {
				break
			}
			if attempts <= p.reruns() {
				fmt.Fprintf(log, "  unhealthy slice: re-running it (%d of at most %d re-runs)\n", attempts, p.reruns())
			}
		}
		c := Cell{App: a.Name, Scenario: sc, Policy: pol.Name, RPS: rate}
		r := o.Find(c)
		if r == nil {
			r = &Runs{Cell: c}
			o.Cells = append(o.Cells, r)
		}
		r.Results = append(r.Results, res)
		r.Round = append(r.Round, fmt.Sprintf("%s/%s run %d", a.Name, sc, run)) // every row of a run takes turns in it
		r.Health = append(r.Health, health)
		r.Attempts = append(r.Attempts, attempts)
		pr.slice(c, run, p.Runs, time.Since(begin), res)
		r.Traffic = append(r.Traffic, plan.Traffic)
		r.PlannedRTT = append(r.PlannedRTT, plan.PlannedRTT)
		r.Capacity = append(r.Capacity, plan.Capacity)
		r.Publications = append(r.Publications, plan.Publications)
		r.WarmupSeconds = append(r.WarmupSeconds, plan.Warmup.Seconds())
		r.Settled = append(r.Settled, plan.Settled)
		if !plan.Settled {
			fmt.Fprintf(log, "  warm-up: %.1fs, the loop not settled (measured anyway at %v)\n", plan.Warmup.Seconds(), MaxEstimatorWarmup)
		} else if plan.Warmup != p.Warmup {
			fmt.Fprintf(log, "  warm-up: %.1fs, the loop settled\n", plan.Warmup.Seconds())
		}
		fmt.Fprintf(log, "  publications during the load: %d\n", plan.Publications)
		if plan.Capacity != nil {
			fmt.Fprintf(log, "  capacities estimated (req/s) for %d pods: %s\n", len(plan.Capacity), fmtCapacity(plan.Capacity))
		}
		if len(plan.QueueScale) > 0 {
			fmt.Fprintf(log, "  quota wait scales in force: %s\n", fmtValues(plan.QueueScale, "%s %.2f"))
		}
		if plan.Pooled != nil {
			fmt.Fprintf(log, "  pooled at the end (least-request over all their pods): %s\n", cmp.Or(strings.Join(plan.Pooled, ", "), "none"))
		}
		if perr != nil {
			r.PlanCost = append(r.PlanCost, math.NaN())
			fmt.Fprintf(log, "  plan: %v\n", perr)
		} else {
			r.PlanCost = append(r.PlanCost, plan.Cost)
			fmt.Fprintf(log, "  plan (callee req/s): %s; network cost at the configured RTTs %.0f ms·req/s (%.1f ms a request); planned on RTTs %s\n",
				fmtPlan(plan.CalleeRPS), plan.Cost, plan.Cost/rate, fmtRTT(plan.PlannedRTT, h.rtt))
		}
	}
	for _, sc := range p.Scenarios {
		for _, a := range p.Apps {
			if h.SetScenario(sc) {
				// Prometheus's window (4 scrapes) must forget the old RTTs before serve reads them.
				time.Sleep(6 * time.Second)
			}
			st := &Setup{App: a.Name, Scenario: sc}
			o.Setups = append(o.Setups, st)
			acc, err := h.MeasureRTT(20)
			if err != nil {
				t.Fatal(err)
			}
			st.RTT = acc
			for c, f := range p.Slow {
				h.rt.SlowNext(c, f)
			}
			h.Deploy(a, o.Workload)
			for c := range p.Slow {
				st.Slowed = append(st.Slowed, h.rt.Slowed(c))
			}
			slices.Sort(st.Slowed)
			st.Before = h.Placement(a)
			fmt.Fprintf(log, "%s %s: placed by kube-scheduler: %s\n", a.Name, sc, fmtPlacement(st.Before))
			from := placed.setup(a.Name, sc)
			if from != nil {
				st.Before, st.PlacedIn = from.Before, placed.describeRun()
				h.Pin(a, o.Workload, st.Before)
				fmt.Fprintf(log, "%s %s: pinned to the scheduler's placement of %s: %s\n", a.Name, sc, st.PlacedIn, fmtPlacement(st.Before))
			}
			settle(h, a, p, sc, Policies[0], log)
			rates := slices.Clone(p.Rates)
			if p.FindMax {
				st.MaxRate = findMax(h, a, p, sc, log)
				if st.MaxRate > 0 && !slices.Contains(rates, st.MaxRate) {
					rates = append(rates, st.MaxRate)
				} else {
					pr.total -= p.Runs * len(p.Rows())
				}
			}
			placements := []string{PlacementScheduler}
			if slices.ContainsFunc(p.Rows(), func(q Policy) bool { return q.LARP }) {
				placements = append(placements, PlacementLARP)
				if from != nil {
					st.After, st.Moves, st.Settled, st.CostBefore, st.CostAfter, st.Pending = from.After, from.Moves, from.Settled, from.CostBefore, from.CostAfter, from.Pending
					fmt.Fprintf(log, "%s %s: LARP's placement of %s (edgeflow rebalance made %d moves there, predicted LATA cost %.0f → %.0f ms·req/s): %s\n",
						a.Name, sc, st.PlacedIn, st.Moves, st.CostBefore, st.CostAfter, fmtPlacement(st.After))
				} else {
					larp := p.Rows()[slices.IndexFunc(p.Rows(), func(q Policy) bool { return q.LARP })]
					begin := time.Now()
					// The mission's loop: serve runs while the rebalancer moves pods, so the callers'
					// xDS clients stay connected (without a server for the rebalancer's minutes, their
					// reconnect backoff grows toward grpc's 120 s cap, past the next serve's wait).
					s := h.Serve(a, larp, rates[len(p.Rates)/2])
					rb := h.Rebalance(a, rates[len(p.Rates)/2], p.rebalancePeriod(), p.rebalanceWindow(), 180*time.Second)
					s.stop()
					st.Moves, st.Settled, st.CostBefore, st.CostAfter = rb.Moves, rb.Settled, rb.CostBefore, rb.CostNow
					o.RebalanceSeconds = append(o.RebalanceSeconds, time.Since(begin).Seconds())
					st.After = h.Placement(a)
					st.Pending = h.Pending()
					fmt.Fprintf(log, "%s %s: edgeflow rebalance made %d moves in %.0fs (predicted LATA cost %.0f → %.0f ms·req/s); placement now %s; pending: %v\n",
						a.Name, sc, st.Moves, time.Since(begin).Seconds(), st.CostBefore, st.CostAfter, fmtPlacement(st.After), st.Pending)
				}
			}
			interleave(h, o, a, sc, st, rates, placements, slice)
			h.Undeploy(a)
			o.finish(pr)
			if checkpoint != nil {
				checkpoint(o)
			}
		}
	}
	o.finish(pr)
	return o
}

// Placements a slice runs on (Slice.Placement).
const (
	PlacementScheduler = "scheduler" // the kube-scheduler's (Setup.Before)
	PlacementLARP      = "larp"      // edgeflow rebalance's (Setup.After)
)

// Slice is one measured slice, in the order the run made them (Outcome.Order).
type Slice struct {
	App       string    `json:"app"`
	Scenario  string    `json:"scenario"`
	Run       int       `json:"run"`       // 1-based
	Placement string    `json:"placement"` // PlacementScheduler or PlacementLARP
	Policy    string    `json:"policy"`
	RPS       float64   `json:"rps"`
	Start     time.Time `json:"start"`
}

// interleave runs every row of the preset in every run of one application × scenario, in the
// order schedule gives. With both placements, the pods are pinned (Pin) so that a placement
// comes back as the same processes; a placement just switched to gets the settle load before its
// first slice.
func interleave(h *Harness, o *Outcome, a App, sc string, st *Setup, rates []float64, placements []string,
	slice func(a App, sc string, pol Policy, rate float64, run int, place string)) {
	p := o.Preset
	at := map[string]map[string]map[string]int{PlacementScheduler: st.Before, PlacementLARP: st.After}
	byName := map[string]Policy{}
	for _, pol := range p.Rows() {
		byName[pol.Name] = pol
	}
	current := ""
	for _, s := range schedule(p, a.Name, sc, rates, placements) {
		if len(placements) > 1 && s.Placement != current {
			h.Pin(a, o.Workload, at[s.Placement])
			fmt.Fprintf(h.log, "%s %s run %d: placement %s pinned: %s\n", a.Name, sc, s.Run, s.Placement, fmtPlacement(at[s.Placement]))
			current = s.Placement
			settle(h, a, p, sc, byName[s.Policy], h.log)
		}
		slice(a, sc, byName[s.Policy], s.RPS, s.Run, s.Placement)
	}
}

// schedule is the order of one application × scenario's slices: each run visits each placement
// once, counterbalanced across runs (odd runs the scheduler's first, even runs LARP's: S L | L S |
// S L …, so runs pair up in an ABBA order and the placement switches once a run); within a
// placement, every (rate, row) of it once, in an order shuffled from the preset's seed, the app,
// the scenario, the placement and the run. A row runs on LARP's placement if it is a LARP row, on
// the scheduler's otherwise; a placement without rows is not visited.
func schedule(p Preset, app, sc string, rates []float64, placements []string) []Slice {
	var out []Slice
	for run := 1; run <= p.Runs; run++ {
		order := slices.Clone(placements)
		if run%2 == 0 {
			slices.Reverse(order)
		}
		for _, place := range order {
			var turns []Slice
			for _, pol := range p.Rows() {
				if pol.LARP == (place == PlacementLARP) {
					for _, rate := range rates {
						turns = append(turns, Slice{App: app, Scenario: sc, Run: run, Placement: place, Policy: pol.Name, RPS: rate})
					}
				}
			}
			rng := rand.New(rand.NewPCG(p.seed(), seedOf(app, sc, place, run)))
			rng.Shuffle(len(turns), func(i, j int) { turns[i], turns[j] = turns[j], turns[i] })
			out = append(out, turns...)
		}
	}
	return out
}

// seedOf mixes the names and the run into the second word of a shuffle's seed (FNV-1a).
func seedOf(app, sc, place string, run int) uint64 {
	f := fnv.New64a()
	fmt.Fprintf(f, "%s/%s/%s/%d", app, sc, place, run)
	return f.Sum64()
}

// finish records the end time and the slices' timing so far.
func (o *Outcome) finish(pr *progress) {
	o.Ended = time.Now()
	o.Slices = pr.done
	if pr.done > 0 {
		o.SliceTime = pr.sliceTotal / time.Duration(pr.done)
	}
}

// loadOnce starts serve under pol, sends p's load (warm-up and duration) at rate, reads what
// serve had published (Served; or why it could not be read), and stops serve. A load that fails
// ends the test.
func loadOnce(h *Harness, a App, sc string, pol Policy, p Preset, rate float64) (*loadgen.Result, Served, error, Health) {
	flags, keep := pol.Flags, os.Getenv(ServeLogEnv)
	if keep != "" { // after Serve's own --log-level warn: the last one given wins
		flags = append(slices.Clip(flags), "--log-level", "debug")
	}
	s := h.Serve(a, pol, rate, flags...)
	warmup, settled := p.Warmup, true
	if least := warmupFor(p, pol); least > p.Warmup { // a row on measured pods: until its loop settles
		took, ok, err := h.warmUntilSettled(a, p, rate, s, least-p.Warmup, MaxEstimatorWarmup-p.Warmup)
		if err != nil {
			s.stop()
			h.t.Fatalf("%s %s %s %g req/s: warm-up: %v", a.Name, sc, pol.Name, rate, err)
		}
		warmup, settled = took+p.Warmup, ok
	}
	before := publications(s.metrics)
	probe := h.startHealth(p.Warmup + p.Duration)
	res, err := h.Load(a, p, rate)
	health := probe.end(res)
	plan, perr := planned(s.ui, h.rtt)
	plan.Publications, plan.Warmup, plan.Settled = -1, warmup, settled
	if m, err := metrics(s.metrics); err == nil {
		if before >= 0 {
			plan.Publications = int(m["edgeflow_xds_publications_total"]) - before
		}
		if pol.Extra {
			plan.Capacity, _ = podCapacities(m)
			plan.QueueScale = queueScales(m)
		}
		if pol.LB == "bands" {
			plan.Pooled = pooledServices(m)
		}
	}
	s.stop()
	if keep != "" {
		if werr := appendFile(keep, fmt.Sprintf("### %s %s %s %g req/s\n%s", a.Name, sc, pol.Name, rate, s.text())); werr != nil {
			h.t.Fatalf("%s: %v", ServeLogEnv, werr)
		}
	}
	if err != nil {
		if h.ctx.Err() != nil {
			err = context.Cause(h.ctx) // "terminated signal received", or the run's deadline
		}
		h.t.Fatalf("%s %s %s %g req/s: %v", a.Name, sc, pol.Name, rate, err)
	}
	return res, plan, perr, health
}

// ServeLogEnv names the environment variable that, set to a file's path, runs serve at
// --log-level debug in every measured slice and appends each slice's log to that file, headed
// by the slice (make reproduce: what the latency corrector, the estimator and the breaker did,
// which the report's one-line summaries do not say). Unset, serve logs at warn, into the run's
// temporary folder only.
const ServeLogEnv = "REPRODUCE_SERVE_LOG"

// appendFile appends text to the file at path, creating it.
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// EstimatorWarmup is the least warm-up of a measured slice of a row that plans on measured pods
// (the estimator's flags: lata-q, closed-loop and their controls) when the preset's is shorter;
// beyond it the warm-up lasts until the row's loop settles (settler), at most
// MaxEstimatorWarmup. Such a
// row's serve starts from Prometheus's history, which the slice before it made at another rate
// and under another plan (the rows and rates take turns), and it must learn the pods at this
// rate before its plan is the one it would serve there: capacities (the estimator's windows)
// and the quota's wait scale (estimate.WaitScaler: 3 windows that count, each held while a push
// lands), pushed a half-step at a time. Measured on the paper preset (Bookinfo A, 200 req/s,
// 2 runs, 2026-12-06): after 3 s the scales in force were still those the previous slice's rate
// left (0.13–1.00) and the plans spread 2.3–4.0 ms a request across nodes; after 20 s every
// scale was at 0.05–0.08 and every plan 0.2 ms. A static plan's queues settle within a second
// or two at these rates, so the other rows keep the preset's warm-up.
const EstimatorWarmup = 20 * time.Second

// onMeasuredPods says whether pol's serve plans on measured pods (its flags start with the
// estimator's).
func (pol Policy) onMeasuredPods() bool {
	return len(pol.Flags) >= len(estimatorFlags) && slices.Equal(pol.Flags[:len(estimatorFlags)], estimatorFlags)
}

// hasRowOnMeasuredPods says whether a row of p plans on measured pods.
func (p Preset) hasRowOnMeasuredPods() bool {
	return slices.ContainsFunc(p.Rows(), Policy.onMeasuredPods)
}

// warmupFor is the least warm-up of a measured slice of pol under p: p's, or EstimatorWarmup for
// a row on measured pods (not in the smoke preset, whose slices only prove the loop runs), which
// warms up until its loop settles (loadOnce). A slice without warm-up (settle's) keeps none.
func warmupFor(p Preset, pol Policy) time.Duration {
	if p.Warmup > 0 && !p.Smoke && pol.onMeasuredPods() {
		return max(p.Warmup, EstimatorWarmup)
	}
	return p.Warmup
}

// SettleTime is the load a placement gets, unmeasured, before its first measured slice (unless
// the preset sets its own, Preset.Settle).
const SettleTime = 5 * time.Second

// EstimatorSettle is the least settle time of a run with a row that plans on capacities
// measured from the pods' telemetry (estimatorFlags: lata-q, closed-loop): the estimator's
// MinWindows (3) windows of 10 s and a scrape, so that such a row's serve finds every pod's
// estimate in Prometheus's history (--capacity-history-windows) from its first slice on. With
// 5 s, the closed-loop slice that came first in a run planned without any (lata's shares,
// pooled least-request): P99 594 ms at 300 req/s, against 96 in the same run's other.
const EstimatorSettle = 40 * time.Second

// settleFor is how long settle loads a new placement under p.
func settleFor(p Preset) time.Duration {
	d := p.settleTime()
	if d > 0 && p.hasRowOnMeasuredPods() {
		d = max(d, EstimatorSettle)
	}
	return d
}

// settle runs the preset's settle time of load at the middle rate under pol on a placement
// that just came up (after Deploy, after the rebalancer) and discards it: the first slice on
// new pods would otherwise also measure their channels connecting (the callers' xDS clients,
// which have had no server since the last slice, come back from their reconnect backoff, and
// then open their connections to the new pods).
func settle(h *Harness, a App, p Preset, sc string, pol Policy, log io.Writer) {
	if settleFor(p) == 0 {
		return
	}
	begin := time.Now()
	rate := p.Rates[len(p.Rates)/2]
	short := p
	short.Warmup, short.Duration = 0, settleFor(p)
	res, _, _, _ := loadOnce(h, a, sc, pol, short, rate)
	fmt.Fprintf(log, "%s %s: settled under %s at %g req/s for %v, not measured (P99 %.1f ms, %d errors%s; %.1fs)\n",
		a.Name, sc, pol.Name, rate, short.Duration, ms(res.Latency.Quantile(0.99)), res.Errors, errorKinds(res), time.Since(begin).Seconds())
}

// findMax returns the highest rate at which default-k8s keeps P99 under 1 s without errors, one
// run as long as a measured slice per rate tried (a shorter one let a rate above the services'
// capacity pass: its queues had not yet grown): from the preset's last rate up in steps of
// MaxStep while it holds, or, when the last rate already fails, down from it in steps of
// MaxStep/4 to the rate before it (0 if none held).
func findMax(h *Harness, a App, p Preset, sc string, log io.Writer) float64 {
	holds := func(rate float64) bool {
		res, _, _, _ := loadOnce(h, a, sc, Policies[0], p, rate)
		p99 := res.Latency.Quantile(0.99)
		fmt.Fprintf(log, "%s %s: max-rate search: default-k8s at %g req/s: P99 %.1f ms, %d errors\n", a.Name, sc, rate, ms(p99), res.Errors)
		return p99 < time.Second && res.Errors == 0
	}
	top := p.Rates[len(p.Rates)-1]
	if holds(top) {
		best := top
		for rate := top + p.MaxStep; rate <= 2000 && holds(rate); rate += p.MaxStep {
			best = rate
		}
		return best
	}
	low := 0.0
	if len(p.Rates) > 1 {
		low = p.Rates[len(p.Rates)-2]
	}
	for rate := top - p.MaxStep/4; rate > low; rate -= p.MaxStep / 4 {
		if holds(rate) {
			return rate
		}
	}
	return 0
}

func fmtPlan(plan map[string]float64) string {
	var parts []string
	for _, k := range sortedKeys(plan) {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, plan[k]))
	}
	return strings.Join(parts, ", ")
}

func fmtPlacement(pl map[string]map[string]int) string {
	var out string
	for _, c := range sortedKeys(pl) {
		out += c + "{"
		for i, n := range Nodes {
			if i > 0 {
				out += " "
			}
			out += fmt.Sprintf("%s:%d", n, pl[c][n])
		}
		out += "} "
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// fmtRTT lists the RTT serve planned on for each node pair (the mean of both directions)
// beside the configured one ("n1–n2 8.3/8").
func fmtRTT(planned, configured map[[2]string]float64) string {
	var parts []string
	for i, a := range Nodes {
		for _, b := range Nodes[i+1:] {
			ms := (planned[[2]string{a, b}] + planned[[2]string{b, a}]) / 2
			parts = append(parts, fmt.Sprintf("%s–%s %.1f/%g", a, b, ms, configured[[2]string{a, b}]))
		}
	}
	return strings.Join(parts, ", ") + " ms (planned on/configured)"
}

// commit names the checkout's commit, "-dirty" when its work tree has uncommitted changes, or
// "unknown" when git cannot say.
func commit() string {
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", append([]string{"-C", testkit.RepoRoot()}, args...)...).Output()
		return strings.TrimSpace(string(out)), err
	}
	head, err := git("rev-parse", "--short=12", "HEAD")
	if err != nil || head == "" {
		return "unknown"
	}
	if st, err := git("status", "--porcelain", "--untracked-files=no"); err != nil || st != "" {
		head += "-dirty"
	}
	return head
}

// fmtCapacity lists capacities by pod, sorted by pod.
func fmtCapacity(c map[string]float64) string { return fmtValues(c, "%s %.0f") }

// fmtValues lists m's values by key, sorted, each printed by format (a key and a value).
func fmtValues(m map[string]float64, format string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf(format, k, m[k]))
	}
	return strings.Join(parts, ", ")
}
