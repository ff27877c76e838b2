package mcf

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"

	"github.com/edgeflow/edgeflow/optimizer/mcf/internal/tpgen"
)

// denseInstance builds the lemon_tp.cc instance (seed, maxcost 1000).
func denseInstance(mode string, n int, seed uint64) *Transport {
	c, s, d := tpgen.Dense(n, n, seed, mode == "uniform", 1000)
	return &Transport{Sources: n, Sinks: n, Cost: c, Supply: s, Demand: d}
}

// checkSolution verifies the properties every answer must have: flows
// positive and sorted by (Source, Sink) without duplicates, supplies and
// demands met exactly, at most Sources+Sinks-1 flows, and cost equal to
// sum(cost*amount).
func checkSolution(t testing.TB, p *Transport, flows []Flow, cost int64) {
	t.Helper()
	out := make([]int64, p.Sources)
	in := make([]int64, p.Sinks)
	var total int64
	for k, f := range flows {
		if f.Source < 0 || f.Source >= p.Sources || f.Sink < 0 || f.Sink >= p.Sinks {
			t.Fatalf("flow %d = %+v out of range", k, f)
		}
		if f.Amount <= 0 {
			t.Fatalf("flow %d = %+v not positive", k, f)
		}
		if k > 0 {
			prev := flows[k-1]
			if prev.Source > f.Source || prev.Source == f.Source && prev.Sink >= f.Sink {
				t.Fatalf("flows %d, %d = %+v, %+v not strictly sorted", k-1, k, prev, f)
			}
		}
		out[f.Source] += f.Amount
		in[f.Sink] += f.Amount
		total += p.Cost[f.Source*p.Sinks+f.Sink] * f.Amount
	}
	for i := range out {
		if out[i] != p.Supply[i] {
			t.Fatalf("source %d ships %d, supply %d", i, out[i], p.Supply[i])
		}
	}
	for j := range in {
		if in[j] != p.Demand[j] {
			t.Fatalf("sink %d receives %d, demand %d", j, in[j], p.Demand[j])
		}
	}
	if max := p.Sources + p.Sinks - 1; len(flows) > max && len(flows) > 0 {
		t.Fatalf("%d flows, a basic solution has at most %d", len(flows), max)
	}
	if total != cost {
		t.Fatalf("reported cost %d, sum(cost*amount) = %d", cost, total)
	}
}

// checkNoNegativeCycle is an optimality certificate that uses only the
// returned flows: a feasible flow is optimal iff its residual graph (forward
// arcs i->j at +cost, backward arcs j->i at -cost where the flow is
// positive) has no negative cycle. Bellman-Ford from a virtual source.
func checkNoNegativeCycle(t testing.TB, p *Transport, flows []Flow) {
	t.Helper()
	n, m := p.Sources, p.Sinks
	dist := make([]int64, n+m) // all 0: virtual source to every node
	for round := 0; ; round++ {
		changed := false
		for i := 0; i < n; i++ {
			for j := 0; j < m; j++ {
				if d := dist[i] + p.Cost[i*m+j]; d < dist[n+j] {
					dist[n+j] = d
					changed = true
				}
			}
		}
		for _, f := range flows {
			if d := dist[n+f.Sink] - p.Cost[f.Source*m+f.Sink]; d < dist[f.Source] {
				dist[f.Source] = d
				changed = true
			}
		}
		if !changed {
			return
		}
		if round > n+m {
			t.Fatalf("residual graph has a negative cycle: solution not optimal")
		}
	}
}

// checkTree is the certificate on the solver's final spanning tree: it
// recomputes the potentials from scratch by walking parent pointers
// (independently of the incrementally maintained ones), checks that they
// equal the maintained ones, that every real arc has reduced cost >= 0
// (complementary slackness: tree arcs have 0), that the thread visits every
// node once with consistent subtree sizes, that every node's pred arc
// really joins it to its parent, that flows are conserved, that no
// artificial arc carries flow, and that the tree is strongly feasible
// (every arc pointing away from the root carries positive flow, the
// invariant of Cunningham's anti-cycling rule).
func checkTree(t testing.TB, s *Solver, p *Transport) {
	t.Helper()
	ns := &s.ns
	n, m := p.Sources, p.Sinks
	N := n + m + 1
	root := int32(n + m)
	pi := make([]int64, N)
	done := make([]bool, N)
	done[root] = true
	var resolve func(u int32) int64
	resolve = func(u int32) int64 {
		if done[u] {
			return pi[u]
		}
		par := ns.parent[u]
		a := ns.pred[u]
		var c int64
		var src, tgt int32
		if a >= ns.nm {
			if a-ns.nm != int(u) {
				t.Fatalf("node %d: artificial pred %d belongs to another node", u, a)
			}
			if par != root {
				t.Fatalf("node %d: artificial arc to non-root parent %d", u, par)
			}
			if ns.predDir[u] == dirDown {
				c, src, tgt = ns.art, root, u
			} else {
				c, src, tgt = 0, u, root
			}
		} else {
			c, src, tgt = p.Cost[a], int32(a/m), int32(n+a%m)
		}
		if !(src == u && tgt == par && ns.predDir[u] == dirUp || src == par && tgt == u && ns.predDir[u] == dirDown) {
			t.Fatalf("node %d: pred arc %d (%d->%d) does not join it to parent %d with dir %d", u, a, src, tgt, par, ns.predDir[u])
		}
		pp := resolve(par)
		if ns.predDir[u] == dirDown {
			pi[u] = pp + c
		} else {
			pi[u] = pp - c
		}
		done[u] = true
		return pi[u]
	}
	for u := int32(0); u < root; u++ {
		resolve(u)
		if pi[u] != ns.pi[u] {
			t.Fatalf("node %d: maintained potential %d, recomputed %d", u, ns.pi[u], pi[u])
		}
	}
	for i := 0; i < n; i++ {
		for j := 0; j < m; j++ {
			if rc := p.Cost[i*m+j] + pi[i] - pi[n+j]; rc < 0 {
				t.Fatalf("arc (%d,%d): reduced cost %d < 0: not optimal", i, j, rc)
			}
		}
	}
	// Thread: a preorder from the root visiting every node once; succNum is
	// the subtree size.
	seen := make([]bool, N)
	order := make([]int32, 0, N)
	u := root
	for k := 0; k < N; k++ {
		if seen[u] {
			t.Fatalf("thread revisits node %d", u)
		}
		seen[u] = true
		order = append(order, u)
		if ns.revThread[ns.thread[u]] != u {
			t.Fatalf("revThread[thread[%d]] != %d", u, u)
		}
		u = ns.thread[u]
	}
	if u != root {
		t.Fatalf("thread does not return to root after %d nodes", N)
	}
	pos := make([]int, N)
	for k, v := range order {
		pos[v] = k
	}
	for _, v := range order {
		end := pos[v] + int(ns.succNum[v])
		if end > N || ns.lastSucc[v] != order[end-1] {
			t.Fatalf("node %d: succNum %d / lastSucc %d inconsistent with thread", v, ns.succNum[v], ns.lastSucc[v])
		}
		for k := pos[v] + 1; k < end; k++ {
			w := order[k]
			for w != v && w != -1 && w != root {
				w = ns.parent[w]
			}
			if w != v {
				t.Fatalf("node %d in thread subtree of %d is not its descendant", order[k], v)
			}
		}
	}
	// Flows: conservation at every node and no artificial flow.
	bal := make([]int64, N)
	for v := int32(0); v < root; v++ {
		f := ns.flow[v]
		if f < 0 {
			t.Fatalf("node %d: negative flow %d on pred arc", v, f)
		}
		if ns.predDir[v] == dirDown && f == 0 {
			t.Fatalf("node %d: zero flow on a downward tree arc: tree not strongly feasible", v)
		}
		if ns.pred[v] >= ns.nm && f != 0 {
			t.Fatalf("node %d: artificial arc carries %d", v, f)
		}
		if ns.predDir[v] == dirUp {
			bal[v] += f
			bal[ns.parent[v]] -= f
		} else {
			bal[v] -= f
			bal[ns.parent[v]] += f
		}
	}
	for i := 0; i < n; i++ {
		if bal[i] != p.Supply[i] {
			t.Fatalf("source %d: tree ships %d, supply %d", i, bal[i], p.Supply[i])
		}
	}
	for j := 0; j < m; j++ {
		if -bal[n+j] != p.Demand[j] {
			t.Fatalf("sink %d: tree receives %d, demand %d", j, -bal[n+j], p.Demand[j])
		}
	}
}

// lpOptimum solves p with gonum's dense simplex, an independent oracle:
// variables x_ij >= 0, rows sum_j x_ij = s_i for every source and
// sum_i x_ij = d_j for every sink but the last (which is implied, and
// dropping it gives A full row rank).
func lpOptimum(p *Transport) (float64, error) {
	n, m := p.Sources, p.Sinks
	// Scale costs and amounts to O(1): gonum's tolerances are absolute.
	var cs, bs float64 = 1, 1
	for _, v := range p.Cost {
		cs = math.Max(cs, float64(v))
	}
	for _, v := range p.Supply {
		bs = math.Max(bs, float64(v))
	}
	rows := n + m - 1
	A := mat.NewDense(rows, n*m, nil)
	b := make([]float64, rows)
	c := make([]float64, n*m)
	for i := 0; i < n; i++ {
		for j := 0; j < m; j++ {
			a := i*m + j
			c[a] = float64(p.Cost[a]) / cs
			A.Set(i, a, 1)
			if j < m-1 {
				A.Set(n+j, a, 1)
			}
		}
		b[i] = float64(p.Supply[i]) / bs
	}
	for j := 0; j < m-1; j++ {
		b[n+j] = float64(p.Demand[j]) / bs
	}
	opt, _, err := lp.Simplex(c, A, b, 1e-10, nil)
	return opt * cs * bs, err
}

// randomInstance draws a small balanced instance with the shapes and
// degeneracies that stress a network simplex: 1xk and kx1, zero supplies
// and demands, few distinct costs, all-equal costs, all-zero totals.
func randomInstance(r *rand.Rand) *Transport {
	n, m := 1+r.IntN(7), 1+r.IntN(7)
	switch r.IntN(6) {
	case 0:
		n = 1
	case 1:
		m = 1
	}
	p := &Transport{Sources: n, Sinks: m, Cost: make([]int64, n*m), Supply: make([]int64, n), Demand: make([]int64, m)}
	costRange := []int64{1, 2, 3, 10, 1000, MaxCost}[r.IntN(6)]
	for k := range p.Cost {
		p.Cost[k] = r.Int64N(costRange)
	}
	zeroProb := []int{0, 3, 2}[r.IntN(3)] // 0: never zero
	var total int64
	for i := range p.Supply {
		if zeroProb == 0 || r.IntN(zeroProb) != 0 {
			p.Supply[i] = []int64{1 + r.Int64N(3), 1 + r.Int64N(100), 1 + r.Int64N(1e6)}[r.IntN(3)]
		}
		total += p.Supply[i]
	}
	if r.IntN(20) == 0 {
		clear(p.Supply)
		total = 0
	}
	// Split total among sinks: uniform cut points, sometimes all at once.
	if r.IntN(4) == 0 {
		p.Demand[r.IntN(m)] = total
	} else {
		cuts := make([]int64, m-1)
		for k := range cuts {
			if total > 0 {
				cuts[k] = r.Int64N(total + 1)
			}
		}
		slices.Sort(cuts)
		prev := int64(0)
		for j := 0; j < m-1; j++ {
			p.Demand[j] = cuts[j] - prev
			prev = cuts[j]
		}
		p.Demand[m-1] = total - prev
	}
	return p
}

func TestGoldenLemon(t *testing.T) {
	golden := []struct {
		mode string
		n    int
		cost int64
	}{
		{"rand", 5, 63881}, {"rand", 10, 52198}, {"rand", 20, 90923}, {"rand", 50, 89608},
		{"rand", 200, 113785}, {"rand", 500, 127850}, {"rand", 1000, 140558}, {"rand", 2000, 172110},
		{"uniform", 5, 84950}, {"uniform", 50, 871500}, {"uniform", 200, 3532000},
		{"uniform", 500, 9375000}, {"uniform", 1000, 21480000}, {"uniform", 2000, 54860000},
	}
	s := NewSolver()
	for _, g := range golden {
		t.Run(fmt.Sprintf("%s/n=%d", g.mode, g.n), func(t *testing.T) {
			if g.n >= 1000 && testing.Short() {
				t.Skip("large instance skipped under -short")
			}
			p := denseInstance(g.mode, g.n, 1)
			flows, cost, err := s.Solve(p, nil)
			if err != nil {
				t.Fatal(err)
			}
			if cost != g.cost {
				t.Errorf("cost %d, LEMON's optimum %d", cost, g.cost)
			}
			checkSolution(t, p, flows, cost)
			if g.n <= 500 {
				checkTree(t, s, p)
			}
		})
	}
}

func TestPropertiesAgainstLP(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := NewSolver()
	var flows []Flow
	const instances = 600
	defer func() { forceCandidates = false }()
	for k := 0; k < instances; k++ {
		p := randomInstance(r)
		var cost int64
		var err error
		// Every other instance goes through the candidate phase, which
		// normally starts only at 64x64.
		forceCandidates = k%2 == 0
		flows, cost, err = s.Solve(p, flows)
		if err != nil {
			t.Fatalf("instance %d: %v", k, err)
		}
		checkSolution(t, p, flows, cost)
		checkTree(t, s, p)
		checkNoNegativeCycle(t, p, flows)
		if forceCandidates && s.ns.candScanned == 0 {
			t.Fatalf("instance %d: candidate phase not run", k)
		}
		want, err := lpOptimum(p)
		if err != nil {
			t.Fatalf("instance %d (%dx%d): gonum lp: %v", k, p.Sources, p.Sinks, err)
		}
		if diff := math.Abs(float64(cost) - want); diff > 1e-6*math.Max(1, math.Abs(want)) {
			t.Fatalf("instance %d %+v: cost %d, LP optimum %g", k, *p, cost, want)
		}
	}
}

// TestCertificateLarge checks optimality of bigger random instances, with
// degenerate costs and skewed shapes, against both the tree certificate
// and the residual negative-cycle test.
func TestCertificateLarge(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	s := NewSolver()
	shapes := [][2]int{{1, 3000}, {3000, 1}, {2, 1500}, {1500, 2}, {7, 900}, {900, 7}}
	for k := 0; k < 12+len(shapes); k++ {
		n, m := 20+r.IntN(120), 20+r.IntN(120)
		if k >= 12 {
			n, m = shapes[k-12][0], shapes[k-12][1]
		}
		maxCost := []int64{2, 10, 1000, MaxCost}[k%4]
		p := &Transport{Sources: n, Sinks: m, Cost: make([]int64, n*m), Supply: make([]int64, n), Demand: make([]int64, m)}
		for i := range p.Cost {
			p.Cost[i] = r.Int64N(maxCost)
		}
		var total int64
		for i := range p.Supply {
			if r.IntN(5) > 0 {
				p.Supply[i] = r.Int64N(1000)
			}
			total += p.Supply[i]
		}
		for ; total > 0; total-- {
			p.Demand[r.IntN(m)]++
		}
		for _, force := range []bool{true, false} { // with and, up to 64x64, without the candidate phase
			forceCandidates = force
			flows, cost, err := s.Solve(p, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkSolution(t, p, flows, cost)
			checkTree(t, s, p)
			checkNoNegativeCycle(t, p, flows)
		}
	}
	for _, mode := range []string{"rand", "uniform"} {
		p := denseInstance(mode, 200, 7)
		flows, cost, err := s.Solve(p, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkSolution(t, p, flows, cost)
		checkTree(t, s, p)
		checkNoNegativeCycle(t, p, flows)
	}
}

func TestDeterminism(t *testing.T) {
	insts := []*Transport{denseInstance("rand", 120, 5), denseInstance("uniform", 120, 5)}
	r := rand.New(rand.NewPCG(9, 9))
	for k := 0; k < 20; k++ {
		insts = append(insts, randomInstance(r))
	}
	want := make([][]Flow, len(insts))
	wantCost := make([]int64, len(insts))
	fresh := NewSolver()
	for k, p := range insts {
		var err error
		want[k], wantCost[k], err = fresh.Solve(p, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	// Same input again, on a Solver whose workspace has seen other problems
	// in another order.
	s := NewSolver()
	for k := len(insts) - 1; k >= 0; k-- {
		got, cost, _ := s.Solve(insts[k], nil)
		if cost != wantCost[k] || !slices.Equal(got, want[k]) {
			t.Fatalf("instance %d: second solve differs", k)
		}
	}
	// GOMAXPROCS 1 and 2, solving in parallel goroutines.
	for _, procs := range []int{1, 2} {
		old := runtime.GOMAXPROCS(procs)
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := NewSolver()
				for k, p := range insts {
					got, cost, err := s.Solve(p, nil)
					if err != nil || cost != wantCost[k] || !slices.Equal(got, want[k]) {
						errs <- fmt.Errorf("GOMAXPROCS=%d goroutine %d instance %d differs (err %v)", procs, g, k, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		runtime.GOMAXPROCS(old)
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
}

func TestErrors(t *testing.T) {
	ok := func() *Transport {
		return &Transport{Sources: 2, Sinks: 2, Cost: []int64{1, 2, 3, 4}, Supply: []int64{1, 2}, Demand: []int64{2, 1}}
	}
	with := func(f func(p *Transport)) *Transport { p := ok(); f(p); return p }
	tests := []struct {
		name string
		p    *Transport
		want error
		msg  string // substring naming the offending item
	}{
		{"nil", nil, ErrInvalid, "nil"},
		{"negative sources", with(func(p *Transport) { p.Sources = -1 }), ErrInvalid, "Sources = -1"},
		{"negative sinks", with(func(p *Transport) { p.Sinks = -2 }), ErrInvalid, "Sinks = -2"},
		{"too many nodes", with(func(p *Transport) { p.Sources, p.Sinks = MaxNodes, 1 }), ErrOverflow, "Sources+Sinks"},
		{"short supply", with(func(p *Transport) { p.Supply = p.Supply[:1] }), ErrInvalid, "len(Supply) = 1"},
		{"long demand", with(func(p *Transport) { p.Demand = append(p.Demand, 0) }), ErrInvalid, "len(Demand) = 3"},
		{"short cost", with(func(p *Transport) { p.Cost = p.Cost[:3] }), ErrInvalid, "len(Cost) = 3"},
		{"cost for zero sources", &Transport{Sinks: 1, Cost: []int64{1}, Demand: []int64{0}}, ErrInvalid, "len(Cost) = 1"},
		{"negative supply", with(func(p *Transport) { p.Supply[1] = -1 }), ErrInvalid, "Supply[1] = -1"},
		{"negative demand", with(func(p *Transport) { p.Demand[0] = -3 }), ErrInvalid, "Demand[0] = -3"},
		{"unbalanced", with(func(p *Transport) { p.Demand[1] = 2 }), ErrUnbalanced, "sum(Supply) = 3, sum(Demand) = 4"},
		{"supply total too large", with(func(p *Transport) { p.Supply[1] = MaxTotal }), ErrOverflow, "Supply[1]"},
		{"supply total would wrap", with(func(p *Transport) { p.Supply[0], p.Supply[1] = math.MaxInt64, math.MaxInt64 }), ErrOverflow, "Supply[0]"},
		{"demand total too large", with(func(p *Transport) { p.Demand[1] = MaxTotal }), ErrOverflow, "Demand[1]"},
		{"negative cost", with(func(p *Transport) { p.Cost[3] = -1 }), ErrInvalid, "Cost[3] (source 1, sink 1) = -1"},
		{"cost too large", with(func(p *Transport) { p.Cost[2] = MaxCost }), ErrInvalid, "Cost[2] (source 1, sink 0)"},
		{"min int64 cost", with(func(p *Transport) { p.Cost[1] = math.MinInt64 }), ErrInvalid, "Cost[1]"},
	}
	s := NewSolver()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flows, cost, err := s.Solve(tt.p, make([]Flow, 3))
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "mcf: ") || !strings.Contains(msg, tt.msg) {
				t.Errorf("err = %q, want prefix mcf: and mention of %q", msg, tt.msg)
			}
			if len(flows) != 0 || cost != 0 {
				t.Errorf("got %d flows, cost %d with an error", len(flows), cost)
			}
		})
	}
}

func TestEdgeCases(t *testing.T) {
	tests := []struct {
		name string
		p    *Transport
		want []Flow
		cost int64
	}{
		{"empty", &Transport{}, nil, 0},
		{"no sinks", &Transport{Sources: 2, Supply: []int64{0, 0}}, nil, 0},
		{"no sources", &Transport{Sinks: 3, Demand: []int64{0, 0, 0}}, nil, 0},
		{"zero totals", &Transport{Sources: 2, Sinks: 2, Cost: []int64{5, 1, 2, 3}, Supply: []int64{0, 0}, Demand: []int64{0, 0}}, nil, 0},
		{"1x1", &Transport{Sources: 1, Sinks: 1, Cost: []int64{7}, Supply: []int64{4}, Demand: []int64{4}}, []Flow{{0, 0, 4}}, 28},
		{"max values", &Transport{Sources: 1, Sinks: 2, Cost: []int64{MaxCost - 1, MaxCost - 1}, Supply: []int64{MaxTotal}, Demand: []int64{MaxTotal - 1, 1}},
			[]Flow{{0, 0, MaxTotal - 1}, {0, 1, 1}}, (MaxCost - 1) * MaxTotal},
		{"cross", &Transport{Sources: 2, Sinks: 2, Cost: []int64{10, 1, 1, 10}, Supply: []int64{3, 5}, Demand: []int64{5, 3}},
			[]Flow{{0, 1, 3}, {1, 0, 5}}, 8},
	}
	s := NewSolver()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, cost, err := s.Solve(tt.p, nil)
			if err != nil {
				t.Fatal(err)
			}
			if cost != tt.cost || !slices.Equal(got, tt.want) {
				t.Errorf("got %v cost %d, want %v cost %d", got, cost, tt.want, tt.cost)
			}
			checkSolution(t, tt.p, got, cost)
		})
	}
}

// TestNoAllocs checks that a warmed-up Solver with a large enough dst does
// not allocate.
func TestNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	for _, n := range []int{60, 120} { // without and with the candidate phase
		p := denseInstance("rand", n, 3)
		s := NewSolver()
		dst, _, _ := s.Solve(p, nil)
		allocs := testing.AllocsPerRun(10, func() { dst, _, _ = s.Solve(p, dst) })
		if allocs != 0 {
			t.Errorf("n=%d: %v allocations per warmed-up Solve, want 0", n, allocs)
		}
	}
}

// FuzzSolve decodes bytes into a small instance: it must never panic, and
// a valid instance's answer must satisfy the solution properties and the
// optimality certificates.
func FuzzSolve(f *testing.F) {
	f.Add([]byte{2, 2, 1, 2, 3, 4, 1, 2, 2, 1})
	f.Add([]byte{1, 3, 0, 0, 0, 5, 1, 2, 2})
	f.Add([]byte{3, 1, 9, 9, 9, 0, 0, 4, 4})
	f.Add([]byte{0, 0})
	f.Add([]byte{4, 4, 0xff, 0x80, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int64 {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int64(b)
		}
		n, m := int(next()%9), int(next()%9)
		p := &Transport{Sources: n, Sinks: m, Cost: make([]int64, n*m), Supply: make([]int64, n), Demand: make([]int64, m)}
		for k := range p.Cost {
			c := next()
			switch {
			case c == 0xff:
				c = -1 // invalid
			case c >= 0xf0:
				c = MaxCost - 1 - c
			}
			p.Cost[k] = c
		}
		for i := range p.Supply {
			p.Supply[i] = next() - 2 // may be negative: invalid
		}
		for j := range p.Demand {
			p.Demand[j] = next() - 2
		}
		if len(data) > 0 && data[0]&1 == 1 && n > 0 && m > 0 {
			// Balance the instance so most inputs are valid.
			var s, d int64
			for _, v := range p.Supply {
				s += v
			}
			for _, v := range p.Demand[:m-1] {
				d += v
			}
			p.Demand[m-1] = s - d
		}
		// Odd-length inputs also exercise the candidate phase.
		defer func() { forceCandidates = false }()
		forceCandidates = len(data)%2 == 1
		s := NewSolver()
		flows, cost, err := s.Solve(p, nil)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnbalanced) && !errors.Is(err, ErrOverflow) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		checkSolution(t, p, flows, cost)
		if n > 0 && m > 0 {
			checkTree(t, s, p)
		}
		checkNoNegativeCycle(t, p, flows)
	})
}

func TestIsqrt(t *testing.T) {
	for _, x := range []int{0, 1, 2, 3, 4, 15, 16, 17, 24, 25, 2500, 4_000_000, 1<<40 - 1, 1 << 40} {
		r := isqrt(x)
		if r*r > x || (r+1)*(r+1) <= x {
			t.Errorf("isqrt(%d) = %d", x, r)
		}
	}
}
