package optimizer

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomTransport loads ev with a random node-level problem over n nodes: sorted, distinct
// source and sink nodes, amounts with equal totals.
func randomTransport(r *rand.Rand, ev *transportEval, n int) {
	pick := func() []int {
		var nodes []int
		for len(nodes) == 0 {
			nodes = nodes[:0]
			for v := 0; v < n; v++ {
				if r.IntN(2) == 0 {
					nodes = append(nodes, v)
				}
			}
		}
		return nodes
	}
	ev.src, ev.dst = pick(), pick()
	a, b := make([]int64, len(ev.src)), make([]int64, len(ev.dst))
	var ta, tb int64
	for i := range a {
		a[i] = 1 + r.Int64N(4)
		ta += a[i]
	}
	for j := range b {
		b[j] = 1 + r.Int64N(4)
		tb += b[j]
	}
	ev.supply, ev.demand = ev.supply[:0], ev.demand[:0]
	for _, x := range a {
		ev.supply = append(ev.supply, x*tb)
	}
	for _, x := range b {
		ev.demand = append(ev.demand, x*ta)
	}
}

// TestTransportDualsAndBounds checks the node-level transport's optimal duals (feasible, and
// their objective equals the optimum) and that both lower bounds hold, including the dual
// bound of a problem changed after the duals were taken.
func TestTransportDualsAndBounds(t *testing.T) {
	const n = 7
	r := rand.New(rand.NewPCG(3, 4))
	lq := make([]int64, n*n)
	lat := &placeLatency{q: lq, w: n}
	ev := newTransportEval()
	var d edgeDual
	for trial := 0; trial < 3000; trial++ {
		for i := range lq {
			lq[i] = r.Int64N(20000)
			if trial%3 == 0 {
				lq[i] = 1000 * r.Int64N(3) // ties: degenerate optima
			}
		}
		randomTransport(r, &ev, n)
		opt := ev.solve(lat)
		if b := ev.bound(lat); b > opt {
			t.Fatalf("trial %d: bound %d above the optimum %d", trial, b, opt)
		}
		ev.duals(lat, &d)
		var obj float64
		for i, u := range d.src {
			obj += d.alpha[i] * float64(ev.supply[i])
			for j, v := range d.dst {
				if d.alpha[i]+d.beta[j] > float64(lq[u*n+v])+1e-9 {
					t.Fatalf("trial %d: dual infeasible at (%d,%d): %v + %v > %d", trial, u, v, d.alpha[i], d.beta[j], lq[u*n+v])
				}
			}
		}
		for j := range d.dst {
			obj += d.beta[j] * float64(ev.demand[j])
		}
		if math.Abs(obj-float64(opt)) > 1e-6*(1+float64(opt)) {
			t.Fatalf("trial %d: dual objective %v, optimum %d", trial, obj, opt)
		}
		// A new problem on the same nodes: the old duals still bound it.
		randomTransport(r, &ev, n)
		opt = ev.solve(lat)
		if b := ev.dualBound(lat, &d); b > float64(opt)*(1+1e-12) {
			t.Fatalf("trial %d: dual bound %v above the optimum %d", trial, b, opt)
		}
	}
}

// TestTransportZoneTable checks that a zones×zones table gives the transport exactly what the
// n×n table holding every node pair's zone latency gives: the same optimum, bounds and duals.
func TestTransportZoneTable(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	zev, nev := newTransportEval(), newTransportEval()
	var zd, nd edgeDual
	for trial := 0; trial < 2000; trial++ {
		n, k := 1+r.IntN(9), 1+r.IntN(4)
		zoned := &placeLatency{q: make([]int64, k*k), w: k, zone: make([]int32, n)}
		for i := range zoned.q {
			zoned.q[i] = r.Int64N(20000)
			if trial%3 == 0 {
				zoned.q[i] = 1000 * r.Int64N(3)
			}
		}
		for u := range zoned.zone {
			zoned.zone[u] = int32(r.IntN(k))
		}
		dense := &placeLatency{q: make([]int64, n*n), w: n}
		for u := 0; u < n; u++ {
			for v := 0; v < n; v++ {
				dense.q[u*n+v] = zoned.q[int(zoned.zone[u])*k+int(zoned.zone[v])]
			}
		}
		randomTransport(r, &nev, n)
		zev.src, zev.dst = nev.src, nev.dst
		zev.supply, zev.demand = nev.supply, nev.demand
		if z, d := zev.solve(zoned), nev.solve(dense); z != d {
			t.Fatalf("trial %d: solve %d per zone, %d per node", trial, z, d)
		}
		if z, d := zev.bound(zoned), nev.bound(dense); z != d {
			t.Fatalf("trial %d: bound %d per zone, %d per node", trial, z, d)
		}
		zev.solve(zoned)
		nev.solve(dense)
		zev.duals(zoned, &zd)
		nev.duals(dense, &nd)
		if !slices.Equal(zd.alpha, nd.alpha) || !slices.Equal(zd.beta, nd.beta) {
			t.Fatalf("trial %d: duals %v %v per zone, %v %v per node", trial, zd.alpha, zd.beta, nd.alpha, nd.beta)
		}
		randomTransport(r, &nev, n)
		zev.src, zev.dst = nev.src, nev.dst
		zev.supply, zev.demand = nev.supply, nev.demand
		if z, d := zev.dualBound(zoned, &zd), nev.dualBound(dense, &nd); z != d {
			t.Fatalf("trial %d: dual bound %v per zone, %v per node", trial, z, d)
		}
	}
}

// TestPriceBoundsMoves checks localSearch's pruning rule: moving a pod of weight w from u to v
// changes the cost by at least w·(price[v] − price[u]).
func TestPriceBoundsMoves(t *testing.T) {
	checked := 0
	for seed := uint64(0); seed < 20; seed++ {
		top := genPlaceTopology(seed, placeGenConfig{nodes: 9, services: 8, replicas: 5, zones: 3, calls: 14, slack: 2})
		m := compileUnplaced(t, top)
		pp, err := newPlaceProblem(m)
		if err != nil {
			t.Fatal(err)
		}
		nodes := pp.k8sSpread()
		if nodes == nil {
			continue
		}
		st := pp.newState()
		st.duals = make([]edgeDual, len(pp.edges))
		st.load(nodes)
		price := make([]float64, pp.n)
		r := rand.New(rand.NewPCG(seed, 9))
		for k := 0; k < 200; k++ {
			p := r.IntN(len(pp.pods))
			s, u, v := pp.pods[p].svc, st.node[p], r.IntN(pp.n)
			if v == u {
				continue
			}
			st.price(s, price)
			bound := float64(pp.pods[p].w) * (price[v] - price[u])
			exact := st.tryMove(p, v, math.Inf(1))
			if bound > exact+1e-9*(1+math.Abs(exact)+st.cost()) {
				t.Fatalf("seed %d: moving pod %d %d→%d: bound %v above the exact change %v", seed, p, u, v, bound, exact)
			}
			checked++
		}
	}
	if checked < 1000 {
		t.Fatalf("only %d moves checked", checked)
	}
}
