package optimizer

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// Thin bands: lata-q minimises the mean (Σ rps × latency plus the queues' mean delay), and the
// tail is what edgeflow is for. Where the plan sits near the point at which a caller is
// indifferent between its nearest pods' queue and a farther node's round trip, the mean-optimal
// plan sends a sliver of a caller's calls across the network: the mean cost is flat there, so
// the sliver relieves the near queue by next to nothing, but every request it carries pays the
// round trip, and once those are over 1 % of the requests the P99 is a round trip higher.
// Measured on the testbed (bookinfo/B at 200 req/s, the paper preset, docs/benchmarks/
// paper-experiment.md): plans that sent 1–3 req/s of a caller's 67 to another node had a P99
// of 24–34 ms, the runs whose plans kept every call on its node 17–18 ms, Localization 17–21.
//
// foldThinBands takes such slivers back. A band is a caller pod's callee pods on one node; a
// band farther than the caller's nearest band in use that carries under Model.MinBandShare of
// the caller's calls is folded into the caller's other bands, pro rata. The fold applies to the
// call edges into the services lata-q solved as queues (a service with a service rate, its load
// under the utilisation cap, not saturated nor pooled), and the folded allocation is kept only if it loads no
// such pod over its cap (nor over its load before, where that was over the cap already) and
// raises lata-q's objective (network + queueing, exact) by at most MinBandShare of it;
// otherwise a is returned as it is. The loads downstream follow (a pod sends what it receives
// times the edge's rate), by applyFractions. O(routes + pods).
func foldThinBands(m *Model, a *Allocation) *Allocation {
	share := m.MinBandShare
	if !(share > 0) || a == nil || a.ServedAsLATA {
		return a
	}
	foldable := make([]bool, len(m.Services))
	for b := range m.Services {
		svc := &m.Services[b]
		saturated := slices.ContainsFunc(a.Saturated, func(why string) bool { return strings.Contains(why, fmt.Sprintf("service %q", svc.Name)) })
		foldable[b] = hasCapacity(svc) && svc.Load <= m.UtilizationCap*totalCapacity(svc) && !saturated && !slices.Contains(a.Pooled, svc.Name)
	}
	orig := fractionsOf(m, a)
	frac := slices.Clone(orig) // the folded rows replace orig's in a copy of their edge's map
	cloned := make([]bool, len(m.Calls))
	for k, e := range m.Calls {
		if !foldable[e.To] || orig[k] == nil {
			continue
		}
		node := map[string]int{}
		for _, q := range m.Services[e.To].Pods {
			node[q.Name] = q.Node
		}
		for _, c := range m.Services[e.From].Pods {
			row := orig[k][c.Name]
			if len(row) < 2 {
				continue
			}
			if folded := foldRow(m, c.Node, row, node, share); folded != nil {
				if !cloned[k] {
					frac[k], cloned[k] = maps.Clone(orig[k]), true
				}
				frac[k][c.Name] = folded
			}
		}
	}
	if !slices.Contains(cloned, true) {
		return a
	}
	skip := map[string]bool{} // the pods outside lata-q's objective (as in its QueueCost)
	for b := range m.Services {
		if !foldable[b] {
			for _, q := range m.Services[b].Pods {
				skip[q.Name] = true
			}
		}
	}
	_, before := applyFractions(m, a.Policy, orig, skip)
	folded, after := applyFractions(m, a.Policy, frac, skip)
	if len(after.overloaded) > 0 || math.IsInf(before.total(), 1) || after.total() > before.total()*(1+share) {
		return a
	}
	for b := range m.Services {
		if !foldable[b] {
			continue
		}
		for i, q := range m.Services[b].Pods {
			limit := max(m.UtilizationCap*q.CapacityRPS, before.load[b][i])
			if q.CapacityRPS > 0 && after.load[b][i] > limit*(1+1e-9) {
				return a
			}
		}
	}
	folded.Saturated, folded.Pooled = a.Saturated, a.Pooled
	return folded
}

// foldRow returns one caller pod's row (callee pod → fraction; node gives each callee's node)
// with its thin bands folded, or nil when it has none: the bands farther than the nearest band
// in use with under share of the row, their fractions spread over the rest pro rata.
func foldRow(m *Model, from int, row map[string]float64, node map[string]int, share float64) map[string]float64 {
	band := map[int]float64{}
	var total float64
	for q, x := range row {
		band[node[q]] += x
		total += x
	}
	if !(total > 0) {
		return nil
	}
	nearest := math.Inf(1)
	for v, x := range band {
		if x > 0 {
			nearest = min(nearest, m.Latency.At(from, v))
		}
	}
	thin := map[int]bool{}
	var kept float64
	for v, x := range band {
		if x < share*total && m.Latency.At(from, v) > nearest {
			thin[v] = true
		} else {
			kept += x
		}
	}
	if len(thin) == 0 || !(kept > 0) {
		return nil
	}
	out := make(map[string]float64, len(row))
	for q, x := range row {
		if !thin[node[q]] {
			out[q] = x * total / kept
		}
	}
	return out
}
