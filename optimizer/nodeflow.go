package optimizer

import (
	"cmp"
	"slices"
	"sort"

	"github.com/edgeflow/edgeflow/optimizer/mcf"
)

// Costs depend only on nodes, so the policies that solve a transportation problem (lata,
// lata-q) solve it between nodes, not pods: the callers of a node form one source, the callees
// of a node one sink (or, for lata-q, a few sinks), and memory and time grow with nodes², not
// with pods². The pod-level flows are then derived from the node-level ones by expandFlows.

// podGroups groups the indices 0…len(nodes)-1 by node, nodes in ascending order and members in
// index order; it returns each group's node and members.
func podGroups(nodes []int) (groupNode []int, members [][]int) {
	order := make([]int, len(nodes))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(nodes[a], nodes[b]) })
	for k, i := range order {
		if k == 0 || nodes[i] != nodes[order[k-1]] {
			groupNode = append(groupNode, nodes[i])
			members = append(members, order[k:k]) // grows over order itself: members are order[k:…]
		}
		members[len(members)-1] = append(members[len(members)-1], i)
	}
	return groupNode, members
}

// unitFlow is amount integer units from source piece src to sink piece dst.
type unitFlow struct {
	src, dst int
	amount   int64
}

// expandFlows splits node-level flows into flows between the pieces (pods) of the groups, by
// the north-west corner rule on both sides: the source pieces of group g, in order, are laid
// end to end on a line of length Σ supply; g's flows, by ascending sink group, cut that line
// into consecutive intervals; likewise each sink group's pieces are laid on its own line, cut
// by its incoming flows in ascending source group. A piece-level flow is the overlap of a
// source piece's interval with a sink piece's, once the flow's interval is mapped from one line
// to the other.
//
// So every source piece ships exactly its supply and every sink piece receives exactly its
// demand, the cost is that of the node-level flows (all pieces of a group are on one node),
// and, as each piece splits only where an interval ends, there are at most
// pieces(sources) + pieces(sinks) − 1 flows when the node-level flows form a forest (a basic
// solution, as mcf returns): each source piece spreads over few sink pieces.
//
// flows must be sorted by (Source, Sink) with Source and Sink indexing srcGroups and
// dstGroups, and balance each group: Σ supply of g's pieces = Σ of g's flows, and the same for
// sinks. O(pieces + flows·log pieces + result).
func expandFlows(srcGroups [][]int, supply []int64, dstGroups [][]int, demand []int64, flows []mcf.Flow) []unitFlow {
	// Where each flow starts on its sink group's line, and each sink group's cumulative demands.
	inOffset := make([]int64, len(flows))
	running := make([]int64, len(dstGroups))
	for f, fl := range flows {
		inOffset[f] = running[fl.Sink]
		running[fl.Sink] += fl.Amount
	}
	cum := make([][]int64, len(dstGroups))
	for h, members := range dstGroups {
		c := make([]int64, len(members)+1)
		for k, j := range members {
			c[k+1] = c[k] + demand[j]
		}
		cum[h] = c
	}
	var out []unitFlow
	f := 0
	for g, members := range srcGroups {
		k, used := 0, int64(0) // current source piece, and how much of it is already shipped
		for ; f < len(flows) && flows[f].Source == g; f++ {
			fl := flows[f]
			left, at := fl.Amount, inOffset[f]
			for left > 0 && k < len(members) {
				i := members[k]
				take := min(left, supply[i]-used)
				if take > 0 {
					out = overlapSinks(out, i, at, at+take, dstGroups[fl.Sink], cum[fl.Sink])
					at += take
					left -= take
					used += take
				}
				if used == supply[i] {
					k, used = k+1, 0
				}
			}
		}
	}
	return out
}

// overlapSinks appends the flows from source piece i to the sink pieces whose intervals on the
// sink line (cum) overlap [from, to).
func overlapSinks(out []unitFlow, i int, from, to int64, members []int, cum []int64) []unitFlow {
	k := sort.Search(len(members), func(k int) bool { return cum[k+1] > from })
	for ; k < len(members) && cum[k] < to; k++ {
		if a := min(to, cum[k+1]) - max(from, cum[k]); a > 0 {
			out = append(out, unitFlow{src: i, dst: members[k], amount: a})
		}
	}
	return out
}
