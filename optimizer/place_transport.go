package optimizer

import (
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
	dist           []int64   // scratch of duals
	dstAt          []int     // scratch of dualBound
	alpha          []float64 // scratch of dualBound
	flows          []mcf.Flow
	rows, cols     []int // scratch of index: the zones of src and dst
}

func newTransportEval() transportEval { return transportEval{solver: mcf.NewSolver()} }

// index returns the rows of lat.q that hold ev's sources and the columns that hold its sinks:
// ev.src and ev.dst themselves when lat is per node, their zones when it is per zone.
func (ev *transportEval) index(lat *placeLatency) (rows, cols []int) {
	if lat.zone == nil {
		return ev.src, ev.dst
	}
	ev.rows, ev.cols = lat.zonesOf(ev.src, ev.rows[:0]), lat.zonesOf(ev.dst, ev.cols[:0])
	return ev.rows, ev.cols
}

// solve returns the minimum of Σ L_q(u,v)·f_uv (lat.q) over the transport from
// ev.src/supply to ev.dst/demand. One source or one sink has a single feasible flow, summed
// directly.
func (ev *transportEval) solve(lat *placeLatency) int64 {
	lq, n := lat.q, lat.w
	src, dst := ev.index(lat)
	switch {
	case len(src) == 0 || len(dst) == 0:
		return 0
	case len(src) == 1:
		row := lq[src[0]*n:]
		var c int64
		for j, v := range dst {
			c += row[v] * ev.demand[j]
		}
		return c
	case len(dst) == 1:
		v := dst[0]
		var c int64
		for i, u := range src {
			c += lq[u*n+v] * ev.supply[i]
		}
		return c
	}
	ev.cost = ev.cost[:0]
	for _, u := range src {
		row := lq[u*n:]
		for _, v := range dst {
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
func (ev *transportEval) bound(lat *placeLatency) int64 {
	if len(ev.src) <= 1 || len(ev.dst) <= 1 {
		return ev.solve(lat) // exact and as cheap
	}
	lq, n := lat.q, lat.w
	src, dst := ev.index(lat)
	k := len(ev.dst)
	ev.cost = ev.cost[:0]
	for _, u := range src {
		row := lq[u*n:]
		for _, v := range dst {
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

// edgeDual is an optimal dual solution of an edge's transportation problem: potentials α of
// its source nodes and β of its sink nodes (ascending node order) with α_i + β_j ≤ c_ij for
// all pairs, equal on the arcs that carry flow. It prices the edge's change under a step (see
// dualBound).
type edgeDual struct {
	src, dst    []int
	alpha, beta []float64
}

// duals stores in d optimal duals of the problem solve has just solved: shortest-path distances
// in the residual network of its optimal flow (Bellman–Ford from a virtual root; an optimal
// flow leaves no negative cycle), so α_i = −dist(i) and β_j = dist(j).
func (ev *transportEval) duals(lat *placeLatency, d *edgeDual) {
	d.src = append(d.src[:0], ev.src...)
	d.dst = append(d.dst[:0], ev.dst...)
	d.alpha, d.beta = d.alpha[:0], d.beta[:0]
	ns, nd := len(ev.src), len(ev.dst)
	switch {
	case ns == 0 || nd == 0:
		return
	case ns == 1: // every arc carries flow
		lq, n := lat.q, lat.w
		src, dst := ev.index(lat)
		d.alpha = append(d.alpha, 0)
		for _, v := range dst {
			d.beta = append(d.beta, float64(lq[src[0]*n+v]))
		}
		return
	case nd == 1:
		lq, n := lat.q, lat.w
		src, dst := ev.index(lat)
		for _, u := range src {
			d.alpha = append(d.alpha, float64(lq[u*n+dst[0]]))
		}
		d.beta = append(d.beta, 0)
		return
	}
	// ev.cost holds the problem's cost matrix and ev.flows its optimal flows.
	dist := ev.dist[:0]
	for k := 0; k < ns+nd; k++ {
		dist = append(dist, 0)
	}
	ev.dist = dist
	for round := 0; round <= ns+nd; round++ {
		changed := false
		for i := 0; i < ns; i++ {
			row := ev.cost[i*nd : i*nd+nd]
			for j, c := range row {
				if x := dist[i] + c; x < dist[ns+j] {
					dist[ns+j], changed = x, true
				}
			}
		}
		for _, f := range ev.flows {
			if x := dist[ns+f.Sink] - ev.cost[f.Source*nd+f.Sink]; x < dist[f.Source] {
				dist[f.Source], changed = x, true
			}
		}
		if !changed {
			break
		}
	}
	for i := 0; i < ns; i++ {
		d.alpha = append(d.alpha, float64(-dist[i]))
	}
	for j := 0; j < nd; j++ {
		d.beta = append(d.beta, float64(dist[ns+j]))
	}
}

// dualBound returns a lower bound of solve's result for the problem now in ev, from the
// optimal duals d of the same edge under the placement before a step: d extended to a
// feasible dual of the new problem (a new source gets the largest α its constraints with the
// kept sinks allow; a new sink the largest β its constraints with all sources allow). By weak
// duality its objective bounds the new optimum; for a small step it is nearly exact. O(sources
// × sinks); float64, as potentials times amounts may exceed int64, with a margin for rounding.
func (ev *transportEval) dualBound(lat *placeLatency, d *edgeDual) float64 {
	if len(ev.src) == 0 || len(ev.dst) == 0 {
		return 0
	}
	lq, n := lat.q, lat.w
	rows, cols := ev.index(lat)
	// Where each new sink is among the old ones (-1 if new); both lists ascend.
	ev.dstAt = ev.dstAt[:0]
	k := 0
	for _, v := range ev.dst {
		for k < len(d.dst) && d.dst[k] < v {
			k++
		}
		if k < len(d.dst) && d.dst[k] == v {
			ev.dstAt = append(ev.dstAt, k)
		} else {
			ev.dstAt = append(ev.dstAt, -1)
		}
	}
	ev.alpha = ev.alpha[:0]
	var lb, abs float64 // abs: Σ |terms|, for the rounding margin
	k = 0
	for i, u := range ev.src {
		for k < len(d.src) && d.src[k] < u {
			k++
		}
		a := math.Inf(1)
		if k < len(d.src) && d.src[k] == u {
			a = d.alpha[k]
		} else {
			row := lq[rows[i]*n:]
			kept := false
			for j, v := range cols {
				if at := ev.dstAt[j]; at >= 0 {
					a = min(a, float64(row[v])-d.beta[at])
					kept = true
				}
			}
			if !kept {
				for _, v := range cols {
					a = min(a, float64(row[v]))
				}
			}
		}
		ev.alpha = append(ev.alpha, a)
		lb += a * float64(ev.supply[i])
		abs += math.Abs(a * float64(ev.supply[i]))
	}
	for j, v := range cols {
		b := math.Inf(1)
		if at := ev.dstAt[j]; at >= 0 {
			b = d.beta[at]
		} else {
			for i, u := range rows {
				b = min(b, float64(lq[u*n+v])-ev.alpha[i])
			}
		}
		lb += b * float64(ev.demand[j])
		abs += math.Abs(b * float64(ev.demand[j]))
	}
	// Float rounding of the sums is far below 1e-9 of their magnitude; never below 0 (costs
	// are non-negative).
	return max(0, lb-1e-9*abs)
}
