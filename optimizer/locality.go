package optimizer

import (
	"cmp"
	"slices"
	"strings"
)

// A mesh that balances by locality (Istio's DestinationRule localityLbSetting.distribute) can
// steer traffic between localities, not between pods: every caller sidecar in one locality
// gets the same weights, and inside a callee locality the endpoints share its weight evenly
// (by endpoint weight). Planning per pod there would promise routes the mesh cannot make.
// GroupByLocality turns a topology into the one the mesh can express, so the plan of the
// grouped topology is exactly what the sidecars will do.

// LocalityGroup is one locality of a grouping: the nodes whose pods the mesh cannot tell apart.
type LocalityGroup struct {
	// Locality is "region/zone/subzone" as a DestinationRule names it (the coarsest of its
	// nodes' localities; see GroupByLocality).
	Locality string `json:"locality" yaml:"locality"`
	// Nodes are the group's nodes, in the topology's order.
	Nodes []string `json:"nodes" yaml:"nodes"`
}

// LocalityGrouping says how GroupByLocality grouped a topology's nodes.
type LocalityGrouping struct {
	// Groups are the localities, sorted by name.
	Groups []LocalityGroup `json:"groups" yaml:"groups"`
	// Unlocated are the nodes without a locality (sorted): the mesh cannot address them, so
	// their pods are left out of the grouped topology.
	Unlocated []string `json:"unlocated,omitempty" yaml:"unlocated,omitempty"`
	// PerNode says every located node is its own locality: the grouped plan is the per-node
	// plan.
	PerNode bool `json:"per_node" yaml:"per_node"`

	groupOf map[string]int // node → index into Groups
}

// Granularity is "node" when every located node is its own locality, else "locality".
func (g *LocalityGrouping) Granularity() string {
	if g.PerNode {
		return "node"
	}
	return "locality"
}

// GroupOf returns the locality of the named node ("" if it has none).
func (g *LocalityGrouping) GroupOf(node string) string {
	if i, ok := g.groupOf[node]; ok {
		return g.Groups[i].Locality
	}
	return ""
}

// GroupedPodName is the name of the pod that stands for a service's pods in one locality in a
// grouped topology: "POD-KEY-OF-SERVICE@LOCALITY" (the service's Key, then '@', then the
// locality).
func GroupedPodName(serviceKey, locality string) string { return serviceKey + "@" + locality }

// SplitLocality splits "region/zone/subzone" into its parts (missing parts are "").
func SplitLocality(l string) (region, zone, subzone string) {
	parts := strings.SplitN(l, "/", 3)
	parts = append(parts, "", "")
	return parts[0], parts[1], parts[2]
}

// localityCovers says whether a rule naming locality rule applies to a proxy or endpoint in
// locality l, as Istio matches them (pilot/pkg/networking/util.LocalityMatch: an empty zone or
// subzone in the rule matches any).
func localityCovers(rule, l string) bool {
	rr, rz, rs := SplitLocality(rule)
	lr, lz, ls := SplitLocality(l)
	return rr == lr && (rz == "" || rz == lz) && (rs == "" || rs == ls)
}

// validLocality says whether l is a locality a DestinationRule may name: Istio's validation
// (validateLocalities) refuses an empty region, and an empty zone before a subzone.
func validLocality(l string) bool {
	r, z, s := SplitLocality(l)
	return r != "" && !strings.Contains(l, "*") && !(z == "" && s != "") && strings.Count(l, "/") <= 2
}

// GroupByLocality returns the topology the mesh can express and how its nodes were grouped:
//
//   - Nodes with the same locality form one node of the grouped topology, named after the
//     locality. Where one locality covers another as Istio matches them ("r/z" covers
//     "r/z/s": a rule naming "r/z" applies to both), they are merged under the coarser one,
//     so no two groups overlap and a rule naming a group applies to exactly its nodes. Nodes
//     without a valid locality (empty, or an empty zone before a subzone, which Istio's
//     validation refuses) are left out, with their pods, and listed in Unlocated.
//   - The latency from group G to group H is the mean of L(u, v) over u ∈ G, v ∈ H weighted by
//     the traffic the pods of u send and the pods of v receive: load(u) · load(v), where a
//     node's load is Σ ℓ_p over its pods (the pod loads of LATA's step 2). Where no traffic
//     reaches a group, its nodes weigh by their pods' capacity weights, and equally where they
//     hold none. Inside one group (G to G) likewise, L(u, u) included.
//   - Each service's pods in one group become one pod named GroupedPodName(service key,
//     locality), of weight the sum of theirs (and capacity_rps the sum, when given), on that
//     group's node. Calls, ingress, ports and selectors are kept.
//
// t must be valid for opts (Compile); the result is too, unless every pod of a service is on
// unlocated nodes, which is an error naming the service.
func GroupByLocality(t *Topology, opts Options) (*Topology, *LocalityGrouping, error) {
	m, err := Compile(t, opts)
	if err != nil {
		return nil, nil, err
	}
	g := groupNodes(t.Nodes)
	if len(g.Groups) == 0 {
		return nil, nil, invalidf("no node has a locality (region/zone/subzone): the mesh cannot steer traffic between nodes")
	}

	// Node loads: Σ ℓ_p over the node's pods, and Σ w_p as the fallback.
	load := make([]float64, len(t.Nodes))
	weight := make([]float64, len(t.Nodes))
	for _, s := range m.Services {
		w := s.TotalWeight()
		for _, p := range s.Pods {
			load[p.Node] += s.Load * p.Weight / w
			weight[p.Node] += p.Weight
		}
	}
	nodeGroup := make([]int, len(t.Nodes))
	members := make([][]int, len(g.Groups)) // node indices per group
	for u, n := range t.Nodes {
		nodeGroup[u] = -1
		if gi, ok := g.groupOf[n.Name]; ok {
			nodeGroup[u] = gi
			members[gi] = append(members[gi], u)
		}
	}
	// Each group's node weights: loads, else capacity weights, else 1 each.
	nodeWeight := make([]float64, len(t.Nodes))
	for _, us := range members {
		for _, pick := range [][]float64{load, weight, nil} {
			var sum float64
			for _, u := range us {
				if pick == nil {
					nodeWeight[u] = 1
				} else {
					nodeWeight[u] = pick[u]
				}
				sum += nodeWeight[u]
			}
			if sum > 0 {
				break
			}
		}
	}
	out, err := groupTopology(t, m, g, nodeGroup, members, func(gi, hi int) float64 {
		var num, den float64
		for _, u := range members[gi] {
			for _, v := range members[hi] {
				w := nodeWeight[u] * nodeWeight[v]
				num += w * m.Latency.At(u, v)
				den += w
			}
		}
		return num / den
	})
	if err != nil {
		return nil, nil, err
	}
	// Valid by construction (t compiled; every service keeps a pod of positive weight; the
	// latencies are means of valid ones): the caller's Compile is the only one.
	return out, g, nil
}

// groupTopology is the grouping both GroupByLocality and the zone plan (PlanZones) use: the
// topology t (compiled: m) seen at the granularity of g's groups.
//
//   - Each group is one node, named after its Locality, with its nodes' cpu and memory summed;
//     nodeGroup[u] is node u's group (-1: none, its pods are left out), members the nodes of
//     each group.
//   - The latency from group gi to group hi is latency(gi, hi), for every ordered pair.
//   - Each service's pods in one group become one pod named GroupedPodName(service key,
//     locality), of weight the sum of theirs (and capacity_rps the sum, when given), on that
//     group's node; a service's grouped pods are in group order. Calls, ingress, ports and
//     selectors are kept.
//
// It fails, naming the service, only when every pod of a service is on nodes of no group.
// O(pods + groups²).
func groupTopology(t *Topology, m *Model, g *LocalityGrouping, nodeGroup []int, members [][]int, latency func(gi, hi int) float64) (*Topology, error) {
	out := &Topology{Calls: t.Calls, Ingress: t.Ingress}
	for gi, grp := range g.Groups {
		var cpu, mem int64
		for _, u := range members[gi] {
			cpu += t.Nodes[u].CPU
			mem += t.Nodes[u].Memory
		}
		out.Nodes = append(out.Nodes, Node{Name: grp.Locality, CPU: cpu, Memory: mem, Locality: grp.Locality})
	}
	out.Latency = make([]Latency, 0, len(g.Groups)*len(g.Groups))
	for gi := range g.Groups {
		for hi := range g.Groups {
			out.Latency = append(out.Latency, Latency{From: g.Groups[gi].Locality, To: g.Groups[hi].Locality, MS: latency(gi, hi)})
		}
	}
	byGroup := make([]int, len(g.Groups)) // group → index+1 into order, per service
	for si, s := range t.Services {
		gs := s
		gs.Pods = nil
		clear(byGroup)
		var order []int
		var pods []Pod
		// The model's pods, not the file's: a service given by replicas lists none in the
		// file (Place's placed model keeps the unplaced file).
		for pi, ref := range m.Services[si].Pods {
			if ref.Node < 0 {
				continue
			}
			gi := nodeGroup[ref.Node]
			if gi < 0 {
				continue
			}
			if byGroup[gi] == 0 {
				gp := Pod{Name: GroupedPodName(s.Key(), g.Groups[gi].Locality), Node: g.Groups[gi].Locality, Weight: new(float64)}
				if pi < len(s.Pods) && s.Pods[pi].CapacityRPS != nil || s.CapacityRPS != nil {
					gp.CapacityRPS = new(float64)
				}
				pods = append(pods, gp)
				order = append(order, gi)
				byGroup[gi] = len(pods)
			}
			gp := &pods[byGroup[gi]-1]
			*gp.Weight += ref.Weight
			if gp.CapacityRPS != nil {
				*gp.CapacityRPS += ref.CapacityRPS
			}
		}
		if len(order) == 0 {
			return nil, invalidf("service %q: every pod is on a node without a locality (%s)", s.Key(), strings.Join(g.Unlocated, ", "))
		}
		// In group order.
		idx := make([]int, len(order))
		for i := range idx {
			idx[i] = i
		}
		slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(order[a], order[b]) })
		for _, i := range idx {
			gs.Pods = append(gs.Pods, pods[i])
		}
		// Each grouped pod carries its own rate (the sum of its pods' μ, the service's rate
		// times their weights included); the service's would be scaled by the weight again.
		gs.CapacityRPS = nil
		out.Services = append(out.Services, gs)
	}
	return out, nil
}

// groupNodes groups nodes by locality, merging overlapping localities under the coarser one.
func groupNodes(nodes []Node) *LocalityGrouping {
	g := &LocalityGrouping{groupOf: map[string]int{}}
	// Distinct localities, coarsest first (fewest parts, then by name), each mapped to the
	// first coarser one that covers it.
	var locs []string
	for _, n := range nodes {
		if !validLocality(n.Locality) {
			g.Unlocated = append(g.Unlocated, n.Name)
			continue
		}
		locs = append(locs, canonicalLocality(n.Locality))
	}
	slices.SortFunc(locs, func(a, b string) int {
		return cmp.Or(cmp.Compare(strings.Count(a, "/"), strings.Count(b, "/")), cmp.Compare(a, b))
	})
	locs = slices.Compact(locs)
	root := map[string]string{}
	var roots []string
	for _, l := range locs {
		root[l] = l
		for _, r := range roots {
			if localityCovers(r, l) {
				root[l] = r
				break
			}
		}
		if root[l] == l {
			roots = append(roots, l)
		}
	}
	slices.Sort(roots)
	index := map[string]int{}
	for i, r := range roots {
		index[r] = i
		g.Groups = append(g.Groups, LocalityGroup{Locality: r})
	}
	for _, n := range nodes {
		if !validLocality(n.Locality) {
			continue
		}
		gi := index[root[canonicalLocality(n.Locality)]]
		g.groupOf[n.Name] = gi
		g.Groups[gi].Nodes = append(g.Groups[gi].Nodes, n.Name)
	}
	g.PerNode = true
	for _, grp := range g.Groups {
		if len(grp.Nodes) != 1 {
			g.PerNode = false
		}
	}
	slices.Sort(g.Unlocated)
	return g
}

// canonicalLocality drops trailing empty parts: "r/z/" is "r/z".
func canonicalLocality(l string) string { return strings.TrimRight(l, "/") }
