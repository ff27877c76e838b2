// Package mcf solves dense, balanced transportation problems exactly: the
// min-cost-flow kernel behind LATA's per-call-edge traffic weights. The
// solver is a primal network simplex (a port of LEMON's, specialised to the
// complete bipartite graph), pure Go with no dependencies, integer-exact and
// deterministic. It returns basic (spanning-tree) solutions, which use at
// most Sources+Sinks-1 routes, so each caller spreads over few callees.
package mcf

import (
	"errors"
	"fmt"
	"slices"
)

// Limits of the input, chosen so that every sum and product the solver forms
// fits an int64 (total cost < 2^62, potentials < 2^61).
const (
	// MaxCost is the exclusive upper bound of a unit cost: 0 <= cost < MaxCost.
	MaxCost = 1 << 32
	// MaxTotal is the largest allowed sum(Supply) (= sum(Demand)).
	MaxTotal = 1 << 30
	// MaxNodes is the largest allowed Sources+Sinks.
	MaxNodes = 1<<28 - 1
)

// Sentinel errors; every error returned by Solve wraps exactly one of them.
var (
	// ErrInvalid reports malformed input: a nil problem, negative sizes,
	// slice lengths that do not match the sizes, a negative supply or demand,
	// or a cost outside [0, MaxCost).
	ErrInvalid = errors.New("mcf: invalid problem")
	// ErrUnbalanced reports sum(Supply) != sum(Demand).
	ErrUnbalanced = errors.New("mcf: unbalanced problem")
	// ErrOverflow reports a problem beyond the documented limits (MaxTotal,
	// MaxNodes), for which exact int64 arithmetic is not guaranteed.
	ErrOverflow = errors.New("mcf: problem too large")
)

// Transport is a balanced, dense transportation problem: every source can
// ship to every sink.
//
// Limits: 0 <= Cost[k] < MaxCost (2^32), Supply[i] >= 0, Demand[j] >= 0,
// sum(Supply) == sum(Demand) <= MaxTotal (2^30), Sources+Sinks <= MaxNodes.
// Zero sources or sinks with zero totals is a valid, empty problem.
type Transport struct {
	Sources, Sinks int
	// Cost is row-major, len Sources*Sinks; Cost[i*Sinks+j] is the unit
	// cost of shipping from source i to sink j.
	Cost []int64
	// Supply has len Sources; Supply[i] >= 0 is what source i ships.
	Supply []int64
	// Demand has len Sinks; Demand[j] >= 0 is what sink j receives.
	Demand []int64
}

// Flow is one positive shipment of a solution: Amount > 0 units from source
// Source to sink Sink.
type Flow struct {
	Source, Sink int
	Amount       int64
}

// Solver holds reusable workspace for Solve, so repeated solves of problems
// of similar size do not allocate. The zero value is ready to use.
//
// A Solver is not safe for concurrent use; use one per goroutine.
type Solver struct {
	ns simplex
}

// NewSolver returns a Solver with empty workspace; it grows on first use.
func NewSolver() *Solver { return &Solver{} }

// Solve returns an optimal basic solution of p: the positive flows, sorted
// by (Source, Sink) and appended to dst[:0], and the total cost
// sum(Cost[i*Sinks+j] * Amount).
//
// The solution is integral and a vertex of the transportation polytope (the
// flows form a forest), so it has at most Sources+Sinks-1 flows: each caller
// uses few routes. Degenerate problems have many optimal vertices; which one
// is returned is unspecified but deterministic: the same input yields the
// same output bit for bit, whatever the platform, GOMAXPROCS or history of
// the Solver.
//
// Solve does not modify p. It returns an error wrapping ErrInvalid,
// ErrUnbalanced or ErrOverflow, naming the offending index, if p breaks the
// limits documented on Transport; it never panics on bad input.
//
// Complexity: Solve reads p.Cost in place and keeps only O(Sources+Sinks)
// workspace in the Solver (at most about 300 bytes per source or sink);
// after a first call of similar size it allocates nothing beyond growing
// dst. Its time is that of a network simplex, for which no polynomial bound
// is claimed; on the lemon_tp instances it makes about 2 pivots per node
// and, from 64x64 up, prices the whole matrix 2-4 times (a 2000x2000
// instance takes 40-80 ms on one core).
func (s *Solver) Solve(p *Transport, dst []Flow) ([]Flow, int64, error) {
	dst = dst[:0]
	maxCost, err := validate(p)
	if err != nil {
		return dst, 0, err
	}
	if p.Sources == 0 || p.Sinks == 0 {
		return dst, 0, nil
	}
	ns := &s.ns
	ns.solve(p, maxCost)
	return ns.appendFlows(dst, p)
}

func validate(p *Transport) (maxCost int64, err error) {
	if p == nil {
		return 0, fmt.Errorf("%w: nil problem", ErrInvalid)
	}
	n, m := p.Sources, p.Sinks
	if n < 0 {
		return 0, fmt.Errorf("%w: Sources = %d is negative", ErrInvalid, n)
	}
	if m < 0 {
		return 0, fmt.Errorf("%w: Sinks = %d is negative", ErrInvalid, m)
	}
	if n > MaxNodes || m > MaxNodes-n {
		return 0, fmt.Errorf("%w: Sources+Sinks = %d+%d exceeds %d", ErrOverflow, n, m, MaxNodes)
	}
	if len(p.Supply) != n {
		return 0, fmt.Errorf("%w: len(Supply) = %d, want Sources = %d", ErrInvalid, len(p.Supply), n)
	}
	if len(p.Demand) != m {
		return 0, fmt.Errorf("%w: len(Demand) = %d, want Sinks = %d", ErrInvalid, len(p.Demand), m)
	}
	if n != 0 && m > len(p.Cost)/n || len(p.Cost) != n*m {
		return 0, fmt.Errorf("%w: len(Cost) = %d, want Sources*Sinks = %d*%d", ErrInvalid, len(p.Cost), n, m)
	}
	var supply, demand int64
	for i, v := range p.Supply {
		if v < 0 {
			return 0, fmt.Errorf("%w: Supply[%d] = %d is negative", ErrInvalid, i, v)
		}
		if v > MaxTotal-supply {
			return 0, fmt.Errorf("%w: sum(Supply) exceeds %d at Supply[%d]", ErrOverflow, MaxTotal, i)
		}
		supply += v
	}
	for j, v := range p.Demand {
		if v < 0 {
			return 0, fmt.Errorf("%w: Demand[%d] = %d is negative", ErrInvalid, j, v)
		}
		if v > MaxTotal-demand {
			return 0, fmt.Errorf("%w: sum(Demand) exceeds %d at Demand[%d]", ErrOverflow, MaxTotal, j)
		}
		demand += v
	}
	if supply != demand {
		return 0, fmt.Errorf("%w: sum(Supply) = %d, sum(Demand) = %d", ErrUnbalanced, supply, demand)
	}
	// One pass over the costs: range check and maximum. The combined test
	// catches both negative values and values >= MaxCost.
	var bad uint64
	for _, c := range p.Cost {
		bad |= uint64(c)
		if c > maxCost {
			maxCost = c
		}
	}
	if bad >= MaxCost {
		for k, c := range p.Cost {
			if c < 0 || c >= MaxCost {
				return 0, fmt.Errorf("%w: Cost[%d] (source %d, sink %d) = %d outside [0, 2^32)", ErrInvalid, k, k/m, k%m, c)
			}
		}
	}
	return maxCost, nil
}

// appendFlows appends the positive tree flows in (Source, Sink) order.
func (ns *simplex) appendFlows(dst []Flow, p *Transport) ([]Flow, int64, error) {
	if cap(ns.out) < ns.n+ns.m {
		ns.out = make([]int, 0, ns.n+ns.m)
	}
	arcs := ns.out[:0]
	for u := 0; u < ns.n+ns.m; u++ {
		if a := ns.pred[u]; a < ns.nm && ns.flow[u] > 0 {
			arcs = append(arcs, a)
		}
	}
	slices.Sort(arcs)
	ns.out = arcs
	dst = slices.Grow(dst, len(arcs))
	var total int64
	for _, a := range arcs {
		i, j := a/p.Sinks, a%p.Sinks
		// The flow of arc a sits at the tree node whose pred it is: the
		// sink n+j if the arc points down to it, else source i.
		f := ns.arcFlow(a, i, j)
		total += p.Cost[a] * f
		dst = append(dst, Flow{Source: i, Sink: j, Amount: f})
	}
	return dst, total, nil
}
