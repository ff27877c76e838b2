package mcf

import "math"

// The network simplex below is a port of LEMON 1.3.1's NetworkSimplex
// (lemon/network_simplex.h, Copyright (C) 2003-2013 Egervary Jeno
// Kombinatorikus Optimalizalasi Kutatocsoport (EGRES), distributed under the
// Boost Software License 1.0), specialised to the implicit complete bipartite
// graph of a balanced transportation problem:
//
//   - nodes are the sources 0..n-1, the sinks n..n+m-1 and an artificial
//     root n+m; the real arc a = i*m+j goes from source i to sink n+j and is
//     uncapacitated, so no arc is ever at an upper bound and an arc's state
//     is implied by its reduced cost (tree arcs have reduced cost 0);
//   - the spanning tree is stored as in LEMON (parent, pred, predDir,
//     thread, revThread, succNum, lastSucc), plus the flow of each node's
//     pred arc, so all workspace is O(n+m) and no per-arc array exists;
//   - the leaving arc is chosen by Cunningham's strongly feasible tree rule,
//     which prevents cycling under the heavy degeneracy of transportation
//     problems;
//   - entering arcs are priced by block search (LEMON's default rule), but
//     in two levels for problems from 64x64 up: first over a candidate list
//     of the k cheapest arcs of every row and every column (k = 4..8, found
//     in one pass over the matrix), and when no candidate has a negative
//     reduced cost, by one full pass that adds every row's most negative
//     arc to the list; a full pass that finds none proves optimality.
//     Smaller and narrow problems use plain block search over the matrix in
//     row-major order, one row segment at a time, without divisions.

// blockFactor scales the block of the pricing rule: blockFactor*sqrt(arcs)
// arcs (LEMON uses 1). 2 measured best on the lemon_tp instances: with 1,
// pivots were 1.2-1.9x as many and the tree work per pivot larger, for
// about the same number of arcs priced.
const blockFactor = 2

// candidateK returns how many cheapest arcs per row and per column the
// candidate list holds for an n x m problem, 0 for no candidate phase.
// Measured against pricing the whole matrix from the start (lemon_tp
// instances, interleaved runs): the candidate phase lost below about 60x60,
// broke even at 64x64 (averaged over 6 seeds) and won from 70x70 on
// (0.6-0.95x at n = 70..200, 0.3-0.4x at n = 1000); 4 arcs were best up to
// about 180x180, 6 to 700x700, 8 above. Narrow problems, whose list would
// be most of the matrix, were 1.5-2x slower with it (1x100000 .. 10x10000).
func candidateK(n, m int) int {
	if forceCandidates {
		return 4
	}
	nm := n * m
	k := 8
	switch {
	case nm < 64*64:
		return 0
	case nm < 180*180:
		k = 4
	case nm < 700*700:
		k = 6
	}
	if n*min(k, m)+m*min(k, n) > nm/4 {
		return 0
	}
	return k
}

// forceCandidates makes every solve use the candidate phase; for tests.
var forceCandidates = false

const (
	dirUp   = 1  // pred arc goes from the node to its parent
	dirDown = -1 // pred arc goes from the parent to the node
)

// simplex is the workspace of one solve. Node arrays have length n+m+1.
type simplex struct {
	n, m, nm int
	cost     []int64 // the problem's cost matrix, not copied
	art      int64   // cost of an artificial root arc into a sink

	// The spanning tree, as in LEMON; node arrays of length n+m+1.
	parent    []int32
	thread    []int32 // preorder successor
	revThread []int32
	succNum   []int32 // subtree size
	lastSucc  []int32 // last node of the subtree in thread order
	predDir   []int8
	pred      []int   // arc joining the node to its parent; nm+u for u's artificial arc
	flow      []int64 // flow on pred[u]
	pi        []int64 // potentials: reduced cost of a = cost[a] + pi[i] - pi[n+j]
	dirty     []int32 // scratch of updateTreeStructure
	out       []int   // scratch: arcs of the solution

	// The cheapest arcs of every row and column (see cheapest), and the
	// candidate list priced before the whole matrix.
	rowTopC, colTopC []int64
	rowTopJ, colTopI []int32
	colCnt           []int32
	colThr           []int64
	kr, kc           int
	cands            []candidate
	candPos          int
	candBlock        int

	blockSize    int
	nextI, nextJ int // where block search resumes (row, column)

	// The current pivot.
	inArc          int
	inSrc, inTgt   int32
	join           int32
	uIn, vIn, uOut int32
	delta          int64

	// Counters of the last solve, for benchmarks and tests.
	pivots      int // all pivots, including the initial ones
	scanned     int // arcs of the matrix priced
	candScanned int // candidate arcs priced
}

// candidate is an arc of the candidate list, with its cost.
type candidate struct {
	i, j int32
	c    int64
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// solve runs the network simplex on a validated, non-empty problem.
func (ns *simplex) solve(p *Transport, maxCost int64) {
	n, m := p.Sources, p.Sinks
	ns.n, ns.m, ns.nm = n, m, n*m
	ns.cost = p.Cost
	N := n + m + 1
	ns.parent = grow(ns.parent, N)
	ns.thread = grow(ns.thread, N)
	ns.revThread = grow(ns.revThread, N)
	ns.succNum = grow(ns.succNum, N)
	ns.lastSucc = grow(ns.lastSucc, N)
	ns.predDir = grow(ns.predDir, N)
	ns.pred = grow(ns.pred, N)
	ns.flow = grow(ns.flow, N)
	ns.pi = grow(ns.pi, N)
	ns.dirty = ns.dirty[:0]
	ns.pivots = 0
	ns.scanned = 0
	ns.candScanned = 0
	// Any tree path has fewer than N real arcs, each cheaper than
	// maxCost+1, so a sink fed by the root is always costlier than any real
	// route; N < 2^28 and maxCost < 2^32 keep every potential below 2^61.
	ns.art = (maxCost + 1) * int64(N)

	root := int32(n + m)
	ns.parent[root] = -1
	ns.pred[root] = -1
	ns.thread[root] = 0
	ns.revThread[0] = root
	ns.succNum[root] = int32(N)
	ns.lastSucc[root] = root - 1
	ns.pi[root] = 0
	ns.flow[root] = 0
	for u := 0; u < n+m; u++ {
		ns.parent[u] = root
		ns.pred[u] = ns.nm + u
		ns.thread[u] = int32(u + 1)
		ns.revThread[u+1] = int32(u)
		ns.succNum[u] = 1
		ns.lastSucc[u] = int32(u)
		if u < n || p.Demand[u-n] == 0 {
			ns.predDir[u] = dirUp
			ns.pi[u] = 0
			if u < n {
				ns.flow[u] = p.Supply[u]
			} else {
				ns.flow[u] = 0
			}
		} else {
			ns.predDir[u] = dirDown
			ns.pi[u] = ns.art
			ns.flow[u] = p.Demand[u-n]
		}
	}

	k := candidateK(n, m)
	ns.cheapest(max(k, 1))
	ns.initialPivots(p)
	if k > 0 {
		ns.buildCandidates()
		base := len(ns.cands)
		for {
			for ns.findEnteringCandidate() {
				ns.pivot()
			}
			if !ns.refreshCandidates(base) {
				return
			}
		}
	}
	ns.blockSize = max(10, blockFactor*isqrt(ns.nm))
	ns.nextI, ns.nextJ = 0, 0
	for ns.findEntering() {
		ns.pivot()
	}
}

// cheapest scans the cost matrix once and keeps, for every row and every
// column, its k cheapest arcs in ascending cost order (ties: lower index
// first): rowTopJ[i*kr+t] and colTopI[j*kc+t], with kr = min(k, m) and
// kc = min(k, n).
func (ns *simplex) cheapest(k int) {
	n, m := ns.n, ns.m
	kr, kc := min(k, m), min(k, n)
	ns.kr, ns.kc = kr, kc
	ns.rowTopC = grow(ns.rowTopC, n*kr)
	ns.rowTopJ = grow(ns.rowTopJ, n*kr)
	ns.colTopC = grow(ns.colTopC, m*kc)
	ns.colTopI = grow(ns.colTopI, m*kc)
	ns.colCnt = grow(ns.colCnt, m)
	ns.colThr = grow(ns.colThr, m)
	if k == 1 {
		ns.cheapest1()
		return
	}
	colTopC, colTopI, colCnt, colThr := ns.colTopC, ns.colTopI, ns.colCnt, ns.colThr
	clear(colCnt)
	for j := range colThr {
		colThr[j] = 1<<63 - 1
	}
	for i := 0; i < n; i++ {
		row := ns.cost[i*m : i*m+m]
		topC := ns.rowTopC[i*kr : i*kr+kr]
		topJ := ns.rowTopJ[i*kr : i*kr+kr]
		thr := int64(1<<63 - 1)
		cnt := 0
		ct := colThr[:len(row)]
		for j, c := range row {
			if c < thr {
				p := cnt
				if cnt < kr {
					cnt++
				} else {
					p = kr - 1
				}
				for ; p > 0 && topC[p-1] > c; p-- {
					topC[p], topJ[p] = topC[p-1], topJ[p-1]
				}
				topC[p], topJ[p] = c, int32(j)
				if cnt == kr {
					thr = topC[kr-1]
				}
			}
			if c < ct[j] {
				base := j * kc
				p := int(colCnt[j])
				if p < kc {
					colCnt[j]++
				} else {
					p = kc - 1
				}
				for ; p > 0 && colTopC[base+p-1] > c; p-- {
					colTopC[base+p], colTopI[base+p] = colTopC[base+p-1], colTopI[base+p-1]
				}
				colTopC[base+p], colTopI[base+p] = c, int32(i)
				if int(colCnt[j]) == kc {
					ct[j] = colTopC[base+kc-1]
				}
			}
		}
	}
}

// cheapest1 is cheapest(1): the minimum of every row and column.
func (ns *simplex) cheapest1() {
	n, m := ns.n, ns.m
	colTopC, colTopI := ns.colTopC, ns.colTopI
	clear(colTopI)
	copy(colTopC, ns.cost[:m])
	for i := 0; i < n; i++ {
		row := ns.cost[i*m : i*m+m]
		cc := colTopC[:len(row)]
		ci := colTopI[:len(row)]
		bj := 0
		for j, c := range row {
			if c < cc[j] {
				cc[j] = c
				ci[j] = int32(i)
			}
			if c < row[bj] {
				bj = j
			}
		}
		ns.rowTopJ[i] = int32(bj)
		ns.rowTopC[i] = row[bj]
	}
}

// buildCandidates lists the k cheapest arcs of every row, then of every
// column (an arc may appear twice).
func (ns *simplex) buildCandidates() {
	n, m, kr, kc := ns.n, ns.m, ns.kr, ns.kc
	// Room for the refreshed arcs too (one per row), so the list is
	// allocated once.
	if need := n*kr + m*kc + n; cap(ns.cands) < need {
		ns.cands = make([]candidate, 0, need)
	}
	c := ns.cands[:0]
	for i := 0; i < n; i++ {
		for t := i * kr; t < i*kr+kr; t++ {
			c = append(c, candidate{int32(i), ns.rowTopJ[t], ns.rowTopC[t]})
		}
	}
	for j := 0; j < m; j++ {
		for t := j * kc; t < j*kc+kc; t++ {
			c = append(c, candidate{ns.colTopI[t], int32(j), ns.colTopC[t]})
		}
	}
	ns.cands = c
	ns.candPos = 0
	ns.candBlock = max(10, blockFactor*isqrt(len(c)))
}

// refreshCandidates prices the whole matrix once and replaces the
// candidates after the first base ones by the most negative arc of every
// row that has one. It reports whether it found any; if not, the solution
// is optimal.
func (ns *simplex) refreshCandidates(base int) bool {
	n, m := ns.n, ns.m
	cost := ns.cost
	piSnk := ns.pi[n : n+m]
	c := ns.cands[:base]
	for i := 0; i < n; i++ {
		pii := ns.pi[i]
		if j, _ := segmentMin(cost[i*m:i*m+m], piSnk, -pii); j >= 0 {
			c = append(c, candidate{int32(i), int32(j), cost[i*m+j]})
		}
	}
	ns.scanned += ns.nm
	found := len(c) > base
	ns.cands = c
	ns.candPos = base
	ns.candBlock = max(10, blockFactor*isqrt(len(c)))
	return found
}

// findEnteringCandidate is block search over the candidate list.
func (ns *simplex) findEnteringCandidate() bool {
	n := ns.n
	pi := ns.pi
	cands := ns.cands
	e := ns.candPos
	var min int64
	best := -1
	cnt := ns.candBlock
	rem := len(cands)
	for rem > 0 {
		l := imin(imin(cnt, rem), len(cands)-e)
		for k, x := range cands[e : e+l] {
			if rc := x.c + pi[x.i] - pi[n+int(x.j)]; rc < min {
				min, best = rc, e+k
			}
		}
		e += l
		if e == len(cands) {
			e = 0
		}
		rem -= l
		cnt -= l
		ns.candScanned += l
		if cnt == 0 {
			if min < 0 {
				break
			}
			cnt = ns.candBlock
		}
	}
	if best < 0 {
		return false
	}
	ns.candPos = e
	x := cands[best]
	ns.inArc = int(x.i)*ns.m + int(x.j)
	ns.inSrc, ns.inTgt = x.i, int32(n)+x.j
	return true
}

func imin(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// initialPivots is LEMON's start heuristic for balanced problems, extended
// to rows: it pivots in, for every sink with positive demand, its cheapest
// incoming arc, then for every source with positive supply its cheapest
// outgoing arc, each only if its reduced cost is still negative; the minima
// come from cheapest's pass over the matrix. Measured on the lemon_tp
// instances before the candidate phase existed (n = 50..1000, seeds 1-3,
// both modes, block search only), adding the rows changed the arcs
// priced by -43%..+10%, fewer in 18 of 24 cases; pivoting in a greedy
// feasible allocation instead raised the pivot count by up to 42%, and
// starting from the artificial tree alone was no better than LEMON's
// columns. Building a strongly feasible tree directly from a greedy
// allocation (positive arcs only, components hung from the root by
// zero-flow arcs, no big-M) saved pivots for n <= 50 but made the tree
// deep, so pivots cost more: 1.3-2x slower for every n >= 20, and no
// faster at n = 2..16 (8 seeds each).
func (ns *simplex) initialPivots(p *Transport) {
	for j := 0; j < ns.m; j++ {
		if p.Demand[j] > 0 {
			ns.tryPivot(int(ns.colTopI[j*ns.kc]), j)
		}
	}
	for i := 0; i < ns.n; i++ {
		if p.Supply[i] > 0 {
			ns.tryPivot(i, int(ns.rowTopJ[i*ns.kr]))
		}
	}
}

// tryPivot pivots arc (i, j) in if its reduced cost is negative.
func (ns *simplex) tryPivot(i, j int) {
	a := i*ns.m + j
	if ns.cost[a]+ns.pi[i]-ns.pi[ns.n+j] >= 0 {
		return
	}
	ns.inArc, ns.inSrc, ns.inTgt = a, int32(i), int32(ns.n+j)
	ns.pivot()
}

// findEntering selects the entering arc by block search: it scans blocks of
// blockSize arcs from the last position, wrapping around, and takes the arc
// of most negative reduced cost in the first block that has one.
func (ns *simplex) findEntering() bool {
	n, m := ns.n, ns.m
	cost := ns.cost
	piSrc := ns.pi[:n]
	piSnk := ns.pi[n : n+m]
	i, j := ns.nextI, ns.nextJ
	var min int64
	bi, bj := -1, -1
	cnt := ns.blockSize
	remaining := ns.nm
	for remaining > 0 {
		end := m
		if end-j > cnt {
			end = j + cnt
		}
		if end-j > remaining {
			end = j + remaining
		}
		pii := piSrc[i]
		if k, t := segmentMin(cost[i*m+j:i*m+end], piSnk[j:end], min-pii); k >= 0 {
			min = t + pii
			bi, bj = i, j+k
		}
		l := end - j
		cnt -= l
		ns.scanned += l
		remaining -= l
		j = end
		if j == m {
			j = 0
			i++
			if i == n {
				i = 0
			}
		}
		if cnt == 0 {
			if min < 0 {
				break
			}
			cnt = ns.blockSize
		}
	}
	if min >= 0 {
		return false
	}
	ns.nextI, ns.nextJ = i, j
	ns.inArc = bi*m + bj
	ns.inSrc, ns.inTgt = int32(bi), int32(n+bj)
	return true
}

// segmentMin returns the first index k with row[k]-pj[k] < t that attains
// the minimum of row[k]-pj[k], and that minimum; or -1 and t if none is
// below t. It is the pricing hot loop: one row segment of the cost matrix
// against the sinks' potentials.
//
// It is unrolled by four: the minimum of each group of four is a
// dependency-free tree, and only a group that beats t (rare once t is
// good) is examined in order, so the first minimal index is kept.
func segmentMin(row, pj []int64, t int64) (int, int64) {
	best := -1
	pj = pj[:len(row)]
	k := 0
	for ; k+4 <= len(row); k += 4 {
		r := row[k : k+4 : k+4]
		p := pj[k : k+4 : k+4]
		d0 := r[0] - p[0]
		d1 := r[1] - p[1]
		d2 := r[2] - p[2]
		d3 := r[3] - p[3]
		if min(min(d0, d1), min(d2, d3)) < t {
			if d0 < t {
				t, best = d0, k
			}
			if d1 < t {
				t, best = d1, k+1
			}
			if d2 < t {
				t, best = d2, k+2
			}
			if d3 < t {
				t, best = d3, k+3
			}
		}
	}
	for ; k < len(row); k++ {
		if d := row[k] - pj[k]; d < t {
			t, best = d, k
		}
	}
	return best, t
}

// pivot brings ns.inArc into the tree.
func (ns *simplex) pivot() {
	ns.pivots++
	ns.findJoinAndLeaving()
	ns.changeFlow()
	ns.updateTreeStructure()
	ns.updatePotential()
}

// findJoinAndLeaving walks the two tree paths from the entering arc's ends
// up to their meeting point, the join node, and on the way applies the
// strongly feasible tree rule for the leaving arc: the entering arc is at
// its lower bound, so flow goes first -> second, up from second to join and
// down from join to first; the blocking arc is the last one met when
// walking the cycle from the join node in that direction. Arcs are
// uncapacitated, so only arcs the cycle traverses backwards (whose flow
// decreases) can block, and one always does: on the first path, arcs that
// point up (first side: earliest minimum from first, so strict <); on the
// second path, arcs that point down (latest minimum towards join, <=).
func (ns *simplex) findJoinAndLeaving() {
	parent, succNum, predDir, flow := ns.parent, ns.succNum, ns.predDir, ns.flow
	const inf = int64(1<<63 - 1)
	first, second := ns.inSrc, ns.inTgt
	d1, d2 := inf, inf
	out1, out2 := int32(-1), int32(-1)
	u, v := first, second
	for u != v {
		if succNum[u] < succNum[v] {
			if predDir[u] == dirUp && flow[u] < d1 {
				d1, out1 = flow[u], u
			}
			u = parent[u]
		} else {
			if predDir[v] == dirDown && flow[v] <= d2 {
				d2, out2 = flow[v], v
			}
			v = parent[v]
		}
	}
	ns.join = u
	if d2 <= d1 {
		ns.uIn, ns.vIn = second, first
		ns.uOut, ns.delta = out2, d2
	} else {
		ns.uIn, ns.vIn = first, second
		ns.uOut, ns.delta = out1, d1
	}
}

// changeFlow pushes delta units around the cycle: along the entering arc,
// up from its head to the join node and down to its tail.
func (ns *simplex) changeFlow() {
	val := ns.delta
	if val > 0 {
		parent, predDir, flow := ns.parent, ns.predDir, ns.flow
		join := ns.join
		for u := ns.inSrc; u != join; u = parent[u] {
			flow[u] -= int64(predDir[u]) * val
		}
		for u := ns.inTgt; u != join; u = parent[u] {
			flow[u] += int64(predDir[u]) * val
		}
	}
}

// updateTreeStructure replaces the leaving arc (pred of uOut) by the
// entering arc (new pred of uIn): the stem from uIn up to uOut is reversed
// and the subtree moves under vIn; thread, revThread, succNum and lastSucc
// are updated as in LEMON, and pred, predDir and flow move with the stem.
func (ns *simplex) updateTreeStructure() {
	uIn, vIn, uOut := ns.uIn, ns.vIn, ns.uOut
	parent, thread, revThread := ns.parent, ns.thread, ns.revThread
	succNum, lastSucc := ns.succNum, ns.lastSucc
	oldRevThread := revThread[uOut]
	oldSuccNum := succNum[uOut]
	oldLastSucc := lastSucc[uOut]
	vOut := parent[uOut]
	var inDir int8 = dirDown
	if uIn == ns.inSrc {
		inDir = dirUp
	}

	if uIn == uOut {
		parent[uIn] = vIn
		ns.pred[uIn] = ns.inArc
		ns.predDir[uIn] = inDir
		ns.flow[uIn] = ns.delta
		if thread[vIn] != uOut {
			after := thread[oldLastSucc]
			thread[oldRevThread] = after
			revThread[after] = oldRevThread
			after = thread[vIn]
			thread[vIn] = uOut
			revThread[uOut] = vIn
			thread[oldLastSucc] = after
			revThread[after] = oldLastSucc
		}
	} else {
		var threadContinue int32
		if oldRevThread == vIn {
			threadContinue = thread[oldLastSucc]
		} else {
			threadContinue = thread[vIn]
		}
		stem := uIn
		parStem := vIn
		last := lastSucc[uIn]
		after := thread[last]
		thread[vIn] = uIn
		dirty := append(ns.dirty[:0], vIn)
		for stem != uOut {
			nextStem := parent[stem]
			thread[last] = nextStem
			dirty = append(dirty, last)
			before := revThread[stem]
			thread[before] = after
			revThread[after] = before
			parent[stem] = parStem
			parStem = stem
			stem = nextStem
			if lastSucc[stem] == lastSucc[parStem] {
				last = revThread[parStem]
			} else {
				last = lastSucc[stem]
			}
			after = thread[last]
		}
		parent[uOut] = parStem
		thread[last] = threadContinue
		revThread[threadContinue] = last
		lastSucc[uOut] = last
		if oldRevThread != vIn {
			thread[oldRevThread] = after
			revThread[after] = oldRevThread
		}
		for _, u := range dirty {
			revThread[thread[u]] = u
		}
		ns.dirty = dirty

		var tmpSc int32
		tmpLs := lastSucc[uOut]
		for u, p := uOut, parent[uOut]; u != uIn; u, p = p, parent[p] {
			ns.pred[u] = ns.pred[p]
			ns.predDir[u] = -ns.predDir[p]
			ns.flow[u] = ns.flow[p]
			tmpSc += succNum[u] - succNum[p]
			succNum[u] = tmpSc
			lastSucc[p] = tmpLs
		}
		ns.pred[uIn] = ns.inArc
		ns.predDir[uIn] = inDir
		ns.flow[uIn] = ns.delta
		succNum[uIn] = oldSuccNum
	}

	join := ns.join
	upLimitOut := int32(-1)
	if lastSucc[join] == vIn {
		upLimitOut = join
	}
	lastSuccOut := lastSucc[uOut]
	for u := vIn; u != -1 && lastSucc[u] == vIn; u = parent[u] {
		lastSucc[u] = lastSuccOut
	}
	if join != oldRevThread && vIn != oldRevThread {
		for u := vOut; u != upLimitOut && lastSucc[u] == oldLastSucc; u = parent[u] {
			lastSucc[u] = oldRevThread
		}
	} else if lastSuccOut != oldLastSucc {
		for u := vOut; u != upLimitOut && lastSucc[u] == oldLastSucc; u = parent[u] {
			lastSucc[u] = lastSuccOut
		}
	}
	for u := vIn; u != join; u = parent[u] {
		succNum[u] += oldSuccNum
	}
	for u := vOut; u != join; u = parent[u] {
		succNum[u] -= oldSuccNum
	}
}

// updatePotential shifts the potentials of the moved subtree (rooted at uIn)
// so that the entering arc's reduced cost becomes 0.
func (ns *simplex) updatePotential() {
	thread, pi := ns.thread, ns.pi
	uIn := ns.uIn
	sigma := pi[ns.vIn] - pi[uIn] - int64(ns.predDir[uIn])*ns.cost[ns.inArc]
	end := thread[ns.lastSucc[uIn]]
	for u := uIn; u != end; u = thread[u] {
		pi[u] += sigma
	}
}

// arcFlow returns the flow of tree arc a = (i, j).
func (ns *simplex) arcFlow(a, i, j int) int64 {
	if ns.pred[i] == a {
		return ns.flow[i]
	}
	return ns.flow[ns.n+j]
}

// isqrt returns floor(sqrt(x)) for x >= 0, exactly: the float square root
// is only a first guess, corrected in integers.
func isqrt(x int) int {
	r := int(math.Sqrt(float64(x)))
	for r > 0 && r > x/r {
		r--
	}
	for (r + 1) <= x/(r+1) {
		r++
	}
	return r
}

// workspaceBytes is the memory the Solver holds between solves.
func (ns *simplex) workspaceBytes() int {
	return 4*(cap(ns.parent)+cap(ns.thread)+cap(ns.revThread)+cap(ns.succNum)+cap(ns.lastSucc)+cap(ns.dirty)+cap(ns.rowTopJ)+cap(ns.colTopI)+cap(ns.colCnt)) + 16*cap(ns.cands) +
		cap(ns.predDir) + 8*(cap(ns.pred)+cap(ns.flow)+cap(ns.pi)+cap(ns.out)+cap(ns.rowTopC)+cap(ns.colTopC)+cap(ns.colThr))
}
