package prom

import (
	"cmp"
	"math"
	"slices"

	"github.com/edgeflow/edgeflow/optimizer"
)

// FillLatency applies the missing-pair rule over nodes and returns the latency list the
// optimizer takes:
//
//   - a measured pair (stale-kept pairs included) is used as is;
//   - a pair measured in one direction only uses that value for both directions;
//   - a pair never measured in either direction gets *defaultMS when defaultMS is non-nil (and
//     not NaN), else the largest latency measured between the given nodes;
//   - a node's latency to itself is listed only when measured (the optimizer's default is 0);
//   - when no pair between the given nodes is measured and defaultMS is nil, every pair, a
//     node to itself included, gets EqualLatencyMS: all paths cost the same, so LATA gives
//     every callee pod its capacity share and nothing else (no missing value reads as 0 ms,
//     which would make the nearest pod look free).
//
// Values are clamped to [0, optimizer.MaxLatencyMS]; NaN entries of m count as not measured,
// and pairs naming a node outside nodes are not used. The result holds every ordered pair of
// distinct nodes, in the order of nodes (from-major), with duplicate node names listed once;
// unmeasured is the number of unordered pairs of distinct nodes measured in neither direction.
// It is O(n²) in len(nodes) and does not modify its arguments.
func FillLatency(nodes []string, m map[Pair]float64, defaultMS *float64) (lat []optimizer.Latency, unmeasured int) {
	index := make(map[string]int, len(nodes))
	names := make([]string, 0, len(nodes))
	for _, n := range nodes {
		if _, dup := index[n]; !dup {
			index[n] = len(names)
			names = append(names, n)
		}
	}
	n := len(names)
	// One pass over m into a dense matrix (NaN: not measured), taking the largest value.
	ms := make([]float64, n*n)
	for i := range ms {
		ms[i] = math.NaN()
	}
	largest, measured := 0.0, 0
	for p, v := range m {
		i, okF := index[p.From]
		j, okT := index[p.To]
		if !okF || !okT || math.IsNaN(v) {
			continue
		}
		v = clampMS(v)
		ms[i*n+j] = v
		measured++
		largest = max(largest, v)
	}
	fallback := largest
	if defaultMS != nil && !math.IsNaN(*defaultMS) {
		fallback = clampMS(*defaultMS)
	} else if measured == 0 {
		fallback = EqualLatencyMS
	}
	equal := defaultMS == nil && measured == 0

	lat = make([]optimizer.Latency, 0, n*n)
	for i, from := range names {
		for j, to := range names {
			v := ms[i*n+j]
			if i == j {
				if equal {
					lat = append(lat, optimizer.Latency{From: from, To: to, MS: EqualLatencyMS})
				} else if !math.IsNaN(v) {
					lat = append(lat, optimizer.Latency{From: from, To: to, MS: v})
				}
				continue
			}
			if math.IsNaN(v) {
				v = ms[j*n+i]
			}
			if math.IsNaN(v) {
				v = fallback
				if i < j {
					unmeasured++
				}
			}
			lat = append(lat, optimizer.Latency{From: from, To: to, MS: v})
		}
	}
	return lat, unmeasured
}

// EqualLatencyMS is every pair's latency, self included, when nothing is measured (FillLatency).
const EqualLatencyMS = 1.0

// clampMS bounds a latency to [0, optimizer.MaxLatencyMS] (NaN is the caller's business).
func clampMS(v float64) float64 {
	return min(max(v, 0), optimizer.MaxLatencyMS)
}

// sortCalls orders call rates by caller, then callee (namespace, then name).
func sortCalls(calls []CallRate) {
	slices.SortFunc(calls, func(a, b CallRate) int {
		return cmp.Or(
			cmp.Compare(a.From.Namespace, b.From.Namespace),
			cmp.Compare(a.From.Name, b.From.Name),
			cmp.Compare(a.To.Namespace, b.To.Namespace),
			cmp.Compare(a.To.Name, b.To.Name),
		)
	})
}
