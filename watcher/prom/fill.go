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

// AggregateLatency maps measured node pairs to pairs of groups (zones) and gives each group
// pair the median of its measured node pairs (the mean of the two middle values for an even
// count), so one slow or lost probe does not move a zone's latency. groupOf names a node's
// group (false: the node is in none, and its pairs are not used). A group's latency to itself
// is the median of its pairs of distinct nodes, else of its nodes' latencies to themselves,
// else it is not measured (FillLatency then lists nothing for it: the optimizer takes 0, as
// for a node to itself). NaN values count as not measured. The result is what FillLatency
// takes over the groups; it is O(len(m) log len(m)) and does not modify m.
func AggregateLatency(m map[Pair]float64, groupOf func(node string) (string, bool)) map[Pair]float64 {
	type values struct{ distinct, self []float64 }
	by := map[Pair]*values{}
	for p, v := range m {
		if math.IsNaN(v) {
			continue
		}
		g, okF := groupOf(p.From)
		h, okT := groupOf(p.To)
		if !okF || !okT {
			continue
		}
		gp := Pair{From: g, To: h}
		vs := by[gp]
		if vs == nil {
			vs = &values{}
			by[gp] = vs
		}
		if p.From == p.To {
			vs.self = append(vs.self, v)
		} else {
			vs.distinct = append(vs.distinct, v)
		}
	}
	out := make(map[Pair]float64, len(by))
	for gp, vs := range by {
		switch {
		case len(vs.distinct) > 0:
			out[gp] = Median(vs.distinct)
		case gp.From == gp.To:
			out[gp] = Median(vs.self)
		}
	}
	return out
}

// Median sorts vs and returns its median, the mean of the middle two for an even count (vs is
// not empty).
func Median(vs []float64) float64 {
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
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
