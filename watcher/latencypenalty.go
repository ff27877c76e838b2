package watcher

import (
	"cmp"
	"slices"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/estimate"
)

// WithLatencyPenalty returns a copy of t in which the latency from each pair's From node to its
// To node is t's (its entry, the reverse entry, or defaultMS for a pair without either, as
// optimizer.Compile reads them) plus the pair's penalty in ms (estimate.LatencyCorrector),
// capped at optimizer.MaxLatencyMS. The reverse direction keeps t's value: a corrected pair's
// reverse entry is written out, since "one direction given means both" would otherwise carry
// the penalty over. Pairs with a penalty that is not positive, same-node pairs, pairs naming a
// node t lacks and pairs without any latency in t are left as they are; so is a topology whose
// latencies are per zone (the correction is per node). For a loop that corrects the plan's
// latencies (the closed loop), as WithCapacity its capacities. O(latency entries + pairs).
func WithLatencyPenalty(t *optimizer.Topology, defaultMS *float64, penalty map[estimate.NodePair]float64) *optimizer.Topology {
	c := t.Clone()
	if len(penalty) == 0 || (c.LatencyGranularity != "" && c.LatencyGranularity != optimizer.LatencyPerNode) {
		return c
	}
	nodes := make(map[string]bool, len(c.Nodes))
	for _, n := range c.Nodes {
		nodes[n.Name] = true
	}
	index := make(map[estimate.NodePair]int, len(c.Latency))
	for i, l := range c.Latency {
		index[estimate.NodePair{From: l.From, To: l.To}] = i
	}
	pairs := make([]estimate.NodePair, 0, len(penalty))
	for p, ms := range penalty {
		if ms > 0 && p.From != p.To && nodes[p.From] && nodes[p.To] {
			pairs = append(pairs, p)
		}
	}
	slices.SortFunc(pairs, func(a, b estimate.NodePair) int { return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To)) })
	for _, p := range pairs {
		rev := estimate.NodePair{From: p.To, To: p.From}
		i, hasFwd := index[p]
		j, hasRev := index[rev]
		var base float64
		switch {
		case hasFwd:
			base = c.Latency[i].MS
		case hasRev:
			base = c.Latency[j].MS
		case defaultMS != nil:
			base = *defaultMS
		default:
			continue // no latency: the topology is invalid as it stands; Compile says why
		}
		if !hasRev {
			index[rev] = len(c.Latency)
			c.Latency = append(c.Latency, optimizer.Latency{From: rev.From, To: rev.To, MS: base})
		}
		ms := min(base+penalty[p], optimizer.MaxLatencyMS)
		if hasFwd {
			c.Latency[i].MS = ms
			continue
		}
		index[p] = len(c.Latency)
		c.Latency = append(c.Latency, optimizer.Latency{From: p.From, To: p.To, MS: ms})
	}
	return c
}
