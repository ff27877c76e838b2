package optimizer

import (
	"fmt"

	"github.com/edgeflow/edgeflow/optimizer/mcf"
)

// transportEval solves node-level transportation problems (the cost of one call edge under a
// placement) with reusable buffers. Not safe for concurrent use.
type transportEval struct {
	solver         *mcf.Solver
	src, dst       []int   // node indices of the sources and sinks
	supply, demand []int64 // their amounts (equal totals, ≤ mcf.MaxTotal)
	cost           []int64
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
