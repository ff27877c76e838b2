package optimizer

import (
	"sync/atomic"
	"fmt"
	"math"

	"github.com/edgeflow/edgeflow/optimizer/mcf"
)

// transportEval solves node-level transportation problems (the cost of one call edge under a
// placement) with reusable buffers. Not safe for concurrent use.
type transportEval struct {
	solver         *mcf.Solver
	src, dst       []int   // node indices of the sources and sinks
	supply, demand []int64 // their amounts (equal totals, ≤ mcf.MaxTotal)
	cost           []int64
	colMin, rowMin []int64
	flows          []mcf.Flow
}

func newTransportEval() transportEval { return transportEval{solver: mcf.NewSolver()} }

// solve returns the minimum of Σ lq[u·n+v]·f_uv over the transport from ev.src/supply to
// ev.dst/demand. One source or one sink has a single feasible flow, summed directly.
func (ev *transportEval) solve(lq []int64, n int) int64 {
	switch {
	case len(ev.src) == 0 || len(ev.dst) == 0:
		return 0
	case len(ev.src) == 1:
		row := lq[ev.src[0]*n:]
		var c int64
		for j, v := range ev.dst {
			c += row[v] * ev.demand[j]
		}
		return c
	case len(ev.dst) == 1:
		v := ev.dst[0]
		var c int64
		for i, u := range ev.src {
			c += lq[u*n+v] * ev.supply[i]
		}
		return c
	}
	dbgSolves.Add(1)
	ev.cost = ev.cost[:0]
	for _, u := range ev.src {
		row := lq[u*n:]
		for _, v := range ev.dst {
			ev.cost = append(ev.cost, row[v])
		}
	}
	p := mcf.Transport{Sources: len(ev.src), Sinks: len(ev.dst), Cost: ev.cost, Supply: ev.supply, Demand: ev.demand}
	flows, c, err := ev.solver.Solve(&p, ev.flows)
	if err != nil {
		// Supplies and demands are built with equal totals ≤ 2^30 and costs < 2^32 (latency ≤
		// MaxLatencyMS in 1 µs units), so this is a bug, not bad input.
		panic(fmt.Sprintf("optimizer: node-level transport: %v", err))
	}
	ev.flows = flows
	return c
}

// bound returns a lower bound of solve's result in O(sources × sinks), without solving: the
// objective of a feasible dual solution, α_i = min_j c_ij and β_j = min_i (c_ij − α_i), or
// the same with the roles of sources and sinks exchanged, whichever is larger. Each dominates
// "every source ships to its cheapest sink" (resp. "every sink is fed by its cheapest source").
func (ev *transportEval) bound(lq []int64, n int) int64 {
	if len(ev.src) <= 1 || len(ev.dst) <= 1 {
		return ev.solve(lq, n) // exact and as cheap
	}
	k := len(ev.dst)
	ev.cost = ev.cost[:0]
	for _, u := range ev.src {
		row := lq[u*n:]
		for _, v := range ev.dst {
			ev.cost = append(ev.cost, row[v])
		}
	}
	c := ev.cost
	ev.colMin = ev.colMin[:0]
	for range ev.dst {
		ev.colMin = append(ev.colMin, math.MaxInt64)
	}
	ev.rowMin = ev.rowMin[:0]
	var rows int64 // Σ supply_i α_i with α_i = row minimum
	for i := range ev.src {
		row := c[i*k : i*k+k]
		best := int64(math.MaxInt64)
		for j, x := range row {
			best = min(best, x)
			ev.colMin[j] = min(ev.colMin[j], x)
		}
		ev.rowMin = append(ev.rowMin, best)
		rows += best * ev.supply[i]
	}
	var cols int64 // Σ demand_j β_j with β_j = column minimum
	for j, x := range ev.colMin {
		cols += x * ev.demand[j]
	}
	// Complete each side's potentials with the other side's reduced minima.
	for j := range ev.dst {
		best := int64(math.MaxInt64)
		for i := range ev.src {
			best = min(best, c[i*k+j]-ev.rowMin[i])
		}
		rows += best * ev.demand[j]
	}
	for i := range ev.src {
		row := c[i*k : i*k+k]
		best := int64(math.MaxInt64)
		for j, x := range row {
			best = min(best, x-ev.colMin[j])
		}
		cols += best * ev.supply[i]
	}
	return max(rows, cols)
}

var dbgSolves atomic.Int64
