package demo

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// The experiment: every row (an allocation policy and how the callers balance within it) on its
// own stack, the measured time cut into rounds in which the rows take turns, and the paired
// statistics that rounds allow.

// LeastRequest is the row of the least-request baseline: round-robin's allocation with every
// caller's gRPC client balancing LEAST_REQUEST over all pods of the callee.
const LeastRequest = "least-request"

// Row is one row of the experiment.
type Row struct {
	Name   string
	Policy optimizer.Policy
	LB     xds.LBPolicy
}

// RowNames are the rows by default, in order: every optimizer policy, least-request right
// after round-robin (the two baselines side by side).
func RowNames() []string {
	var out []string
	for _, p := range optimizer.Policies() {
		out = append(out, string(p))
		if p == optimizer.RoundRobin {
			out = append(out, LeastRequest)
		}
	}
	if !slices.Contains(out, LeastRequest) {
		out = append(out, LeastRequest)
	}
	return out
}

// ParseRow returns the named row: an optimizer policy (closed-loop balancing least-request inside
// the plan's latency bands), or least-request.
func ParseRow(name string) (Row, error) {
	if name == LeastRequest {
		return Row{Name: LeastRequest, Policy: optimizer.RoundRobin, LB: xds.LBLeastRequest}, nil
	}
	p, err := optimizer.ParsePolicy(name)
	if err != nil {
		return Row{}, err
	}
	if p == optimizer.ClosedLoop { // the plan between latency bands, least-request inside one
		return Row{Name: string(p), Policy: p, LB: xds.LBBands}, nil
	}
	return Row{Name: string(p), Policy: p, LB: xds.LBRoundRobin}, nil
}

// WithServiceRates gives lata-q the pods' real service rate when the topology gives none: a
// demo pod works on `workers` requests at once, each taking serviceTime on average, so it
// serves workers / serviceTime requests per second (times its weight).
func WithServiceRates(t *optimizer.Topology, workers int, serviceTime time.Duration) *optimizer.Topology {
	for _, s := range t.Services {
		if s.CapacityRPS != nil {
			return t
		}
		for _, p := range s.Pods {
			if p.CapacityRPS != nil {
				return t
			}
		}
	}
	if serviceTime <= 0 {
		return t // no queueing: lata-q is lata
	}
	c := t.Clone()
	mu := float64(workers) / serviceTime.Seconds()
	for i := range c.Services {
		c.Services[i].CapacityRPS = &mu
	}
	return c
}

// Experiment is one rate's worth of rows.
type Experiment struct {
	Scenario Scenario       // Load.Rate is the rate
	Rows     []Row          // in order
	Slice    loadgen.Config // one round's load of one row (Rate: the rate)
	Rounds   int
	// Started, when set, is told how long the stacks took to start; Progress after each
	// row's slice of each round.
	Started  func(stacks int, took time.Duration)
	Progress func(round, row int, res *loadgen.Result)
}

// Result is what an experiment measured: per row, its outcome over every round, and its
// result in each round.
type Result struct {
	Outcomes []*Outcome
	Rounds   [][]*loadgen.Result
}

// Run runs the experiment. Every row gets its own stack (xDS server + cluster), all started up
// front and idle while not under load. The measured time is cut into rounds, and each round
// gives every row one slice of load in turn, so a stall of this shared machine (other
// processes, a GC) is as likely to hit one row as another instead of spoiling one row's whole
// run. The stacks are closed before it returns.
func Run(ctx context.Context, e Experiment) (_ *Result, err error) {
	start := time.Now()
	stacks := make([]*Stack, 0, len(e.Rows))
	defer func() {
		for i, s := range stacks {
			if cerr := s.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("demo: %s: %w", e.Rows[i].Name, cerr)
			}
		}
	}()
	interrupted := func(what string, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("demo interrupted while %s: %w", what, ctx.Err())
		}
		return fmt.Errorf("demo: %s: %w", what, err)
	}
	for _, row := range e.Rows {
		sc := e.Scenario
		sc.LBPolicy = row.LB
		s, err := StartStack(ctx, sc, row.Policy)
		if err != nil {
			return nil, interrupted("starting "+row.Name, err)
		}
		stacks = append(stacks, s)
	}
	if e.Started != nil {
		e.Started(len(stacks), time.Since(start))
	}
	results := make([][]*loadgen.Result, len(stacks))
	for r := 0; r < e.Rounds; r++ {
		for i, s := range stacks {
			res, err := s.Load(ctx, e.Slice)
			if err != nil {
				return nil, interrupted("loading "+e.Rows[i].Name, err)
			}
			results[i] = append(results[i], res)
			if e.Progress != nil {
				e.Progress(r, i, res)
			}
		}
	}
	out := &Result{Outcomes: make([]*Outcome, len(stacks)), Rounds: results}
	for i, s := range stacks {
		out.Outcomes[i] = s.Outcome(loadgen.Merge(results[i]...))
	}
	return out, nil
}

// BaselineRow is the index of the round-robin row (round-robin allocation, round-robin
// balancing), or -1.
func BaselineRow(rows []Row) int {
	for i, r := range rows {
		if r.Policy == optimizer.RoundRobin && r.LB == xds.LBRoundRobin {
			return i
		}
	}
	return -1
}

// RoundsBelow returns, per row, in how many rounds its P99 was below the base row's in the same
// round ("" for the base row itself, or when base is -1). Rows in one round run back to back,
// so this paired count is robust to a machine stall that spoils one slice.
func (r *Result) RoundsBelow(base int) []string {
	out := make([]string, len(r.Rounds))
	if base < 0 {
		return out
	}
	for i := range r.Rounds {
		if i == base {
			continue
		}
		below := 0
		for k := range r.Rounds[i] {
			if r.Rounds[i][k].Latency.Quantile(0.99) < r.Rounds[base][k].Latency.Quantile(0.99) {
				below++
			}
		}
		out[i] = fmt.Sprintf("%d/%d", below, len(r.Rounds[i]))
	}
	return out
}

// Paired compares row i with row j round by round: the P99 of each over the whole run, and in
// how many rounds row i's P99 was at or below row j's.
type Paired struct {
	P99, OtherP99 time.Duration
	AtOrBelow     int
	Rounds        int
}

// Pair returns row i against row j.
func (r *Result) Pair(i, j int) Paired {
	p := Paired{P99: r.Outcomes[i].Load.Latency.Quantile(0.99), OtherP99: r.Outcomes[j].Load.Latency.Quantile(0.99), Rounds: len(r.Rounds[i])}
	for k := range r.Rounds[i] {
		if r.Rounds[i][k].Latency.Quantile(0.99) <= r.Rounds[j][k].Latency.Quantile(0.99) {
			p.AtOrBelow++
		}
	}
	return p
}
