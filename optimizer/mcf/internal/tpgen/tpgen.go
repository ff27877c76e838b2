// Package tpgen builds the dense transportation instances of the LEMON
// harness lemon_tp.cc bit for bit, so Go tests and benchmarks can compare
// costs and times with LEMON on exactly the same problem.
package tpgen

// SplitMix64 is the generator of lemon_tp.cc: state += 0x9E3779B97F4A7C15,
// then two xor-shift-multiply rounds and a final xor-shift.
type SplitMix64 struct{ State uint64 }

// Next returns the next 64-bit draw.
func (s *SplitMix64) Next() uint64 {
	s.State += 0x9E3779B97F4A7C15
	z := s.State
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// Dense returns the n x m instance of lemon_tp.cc for seed, mode ("rand" or
// "uniform") and maxCost, in the draw order documented there: costs
// row-major as 1 + next()%maxCost; then for rand supply[i] = 1 + next()%100,
// weights w[j] = 1 + next()%100, demand[j] = floor(S*w[j]/W) plus one for
// j = 0..R-1 where R is the remainder; for uniform supply[i] = 10*m and
// demand[j] = 10*n without draws.
func Dense(n, m int, seed uint64, uniform bool, maxCost int64) (cost, supply, demand []int64) {
	g := SplitMix64{State: seed}
	cost = make([]int64, n*m)
	for k := range cost {
		cost[k] = 1 + int64(g.Next()%uint64(maxCost))
	}
	supply = make([]int64, n)
	demand = make([]int64, m)
	if uniform {
		for i := range supply {
			supply[i] = 10 * int64(m)
		}
		for j := range demand {
			demand[j] = 10 * int64(n)
		}
		return cost, supply, demand
	}
	var s, w, d int64
	for i := range supply {
		supply[i] = 1 + int64(g.Next()%100)
		s += supply[i]
	}
	ws := make([]int64, m)
	for j := range ws {
		ws[j] = 1 + int64(g.Next()%100)
		w += ws[j]
	}
	for j := range demand {
		demand[j] = s * ws[j] / w
		d += demand[j]
	}
	for r := int64(0); r < s-d; r++ {
		demand[r%int64(m)]++
	}
	return cost, supply, demand
}
