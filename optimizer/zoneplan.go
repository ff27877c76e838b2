package optimizer

import "fmt"

// Planning when the latency is given per zone (Topology.LatencyGranularity = LatencyPerZone).
//
// Every node of a zone has the same latencies, so the pods of one service in one zone are
// interchangeable to every policy: the plan is made between zones, on the grouped topology
// GroupByLocality's code builds (groupTopology: one node per zone, one pod per service and
// zone of their summed weight, the zone latencies themselves between the groups), and then
// expanded back to the pods, so that everything downstream (the xDS translator, damping)
// sees a per-pod allocation:
//
//   - a caller pod in zone G takes G's split: the fractions of the grouped pod standing for
//     its service in G;
//   - inside a callee zone H, the fraction sent to H is shared by the callee's pods in H in
//     proportion to their capacity weights (evenly where they all weigh 0).
//
// So each caller's fractions sum to what its group's do (1), each callee pod receives its
// capacity share of what its zone receives (so LATA's balance holds pod by pod), and the cost
// is the grouped plan's: a transport between zones, zones² in time and memory per call edge
// however many nodes and pods there are. The solve is never incremental (it is small); under
// lata-q a zone's pods of a service are one queue of their summed service rate, as in
// GroupByLocality, and QueueCost is that queue's.

// ZoneGrouping returns how a model whose latency is per zone groups its nodes: one group per
// zone (Locality is the zone's name, ZoneOf), in the zone order of the latency matrix. It is
// an error for a model whose latency is per node.
func ZoneGrouping(m *Model) (*LocalityGrouping, error) {
	g, _, _ := zoneGrouping(m)
	if g == nil {
		return nil, fmt.Errorf("%w: the latency is per node, not per zone", ErrInvalidTopology)
	}
	return g, nil
}

func zoneGrouping(m *Model) (g *LocalityGrouping, nodeGroup []int, members [][]int) {
	if !m.Latency.Zoned() {
		return nil, nil, nil
	}
	zones := m.Latency.Zones()
	g = &LocalityGrouping{Groups: make([]LocalityGroup, len(zones)), groupOf: make(map[string]int, len(m.Nodes))}
	nodeGroup = make([]int, len(m.Nodes))
	members = make([][]int, len(zones))
	for i, z := range zones {
		g.Groups[i].Locality = z
	}
	for u, n := range m.Nodes {
		z := m.Latency.ZoneOf(u)
		nodeGroup[u] = z
		members[z] = append(members[z], u)
		g.groupOf[n.Name] = z
		g.Groups[z].Nodes = append(g.Groups[z].Nodes, n.Name)
	}
	g.PerNode = true
	for _, grp := range g.Groups {
		if len(grp.Nodes) != 1 {
			g.PerNode = false
		}
	}
	return g, nodeGroup, members
}

// GroupByZone returns the topology m plans on when its latency is per zone (see PlanZones):
// one node per zone, one pod per service and zone. It is an error for a model whose latency
// is per node.
func GroupByZone(m *Model) (*Topology, *LocalityGrouping, error) {
	g, nodeGroup, members := zoneGrouping(m)
	if g == nil {
		return nil, nil, fmt.Errorf("%w: the latency is per node, not per zone", ErrInvalidTopology)
	}
	t, err := groupTopology(m.Topology, m, g, nodeGroup, members, m.Latency.ZoneAt)
	return t, g, err
}

// PlanZones computes policy p's allocation of a model whose latency is per zone: planned
// between zones and expanded to the pods (see above). Plan calls it for such a model.
func PlanZones(m *Model, p Policy) (*Allocation, error) {
	if _, err := ParsePolicy(string(p)); err != nil {
		return nil, err
	}
	grouped, g, err := GroupByZone(m)
	if err != nil {
		return nil, err
	}
	gm, err := Compile(grouped, Options{UtilizationCap: m.UtilizationCap})
	if err != nil {
		return nil, fmt.Errorf("optimizer: the topology grouped by zone: %w", err)
	}
	gm.resolution = m.resolution
	ga, _, _, err := planFrom(gm, p, nil)
	if err != nil {
		return nil, err
	}
	return expandZonePlan(m, gm, g, ga, p)
}

// expandZonePlan turns the allocation ga of the zone-grouped model gm back into one of m's
// pods (see above). m's and gm's services and calls are in the same order.
func expandZonePlan(m, gm *Model, g *LocalityGrouping, ga *Allocation, p Policy) (*Allocation, error) {
	_, nodeGroup, _ := zoneGrouping(m)
	// Per service: each zone's grouped pod (index into gm's pods, -1: none), and each grouped
	// pod's members in m (pod indices, in pod order) with their total weight.
	type zonePods struct {
		of      []int   // zone → grouped pod
		members [][]int // grouped pod → m's pods
		weight  []float64
		byName  map[string]int // grouped pod name → index
	}
	svc := make([]zonePods, len(m.Services))
	for s := range m.Services {
		gpods := gm.Services[s].Pods
		zp := zonePods{of: make([]int, len(g.Groups)), members: make([][]int, len(gpods)),
			weight: make([]float64, len(gpods)), byName: make(map[string]int, len(gpods))}
		for z := range zp.of {
			zp.of[z] = -1
		}
		for i, gp := range gpods {
			zp.of[gp.Node] = i // gm's nodes are the zones, in zone order
			zp.byName[gp.Name] = i
		}
		for i, pod := range m.Services[s].Pods {
			gi := zp.of[nodeGroup[pod.Node]]
			zp.members[gi] = append(zp.members[gi], i)
			zp.weight[gi] += pod.Weight
		}
		svc[s] = zp
	}
	out := &Allocation{Policy: ga.Policy, QueueCost: ga.QueueCost, Saturated: ga.Saturated, ServedAsLATA: ga.ServedAsLATA,
		Calls: make([]CallAllocation, len(m.Calls))}
	for k, e := range m.Calls {
		from, to := &svc[e.From], &svc[e.To]
		gc := &ga.Calls[k]
		rows := make([][]split, len(from.members)) // grouped caller → grouped callee splits
		groupRPS := make([]float64, len(from.members))
		for _, r := range gc.Routes {
			ci, okC := from.byName[r.Caller]
			cj, okD := to.byName[r.Callee]
			if !okC || !okD {
				return nil, fmt.Errorf("optimizer: call %s → %s: the zone plan routes %s → %s, which is no grouped pod", m.Services[e.From].Name, m.Services[e.To].Name, r.Caller, r.Callee)
			}
			rows[ci] = append(rows[ci], split{callee: cj, fraction: r.Fraction})
			groupRPS[ci] += r.RPS
		}
		callers, callees := m.Services[e.From].Pods, m.Services[e.To].Pods
		splits := make([][]split, len(callers))
		var load []float64 // lata-q: each caller pod's share of its zone's planned load
		if p.queued() {
			load = make([]float64, len(callers))
		}
		for i, c := range callers {
			ci := from.of[nodeGroup[c.Node]]
			for _, sp := range rows[ci] {
				for _, q := range to.members[sp.callee] {
					share := 1 / float64(len(to.members[sp.callee]))
					if w := to.weight[sp.callee]; w > 0 {
						share = callees[q].Weight / w
					}
					if f := sp.fraction * share; f > 0 {
						splits[i] = append(splits[i], split{callee: q, fraction: f})
					}
				}
			}
			if load != nil && e.Rate > 0 {
				share := 1 / float64(len(from.members[ci]))
				if w := from.weight[ci]; w > 0 {
					share = c.Weight / w
				}
				load[i] = groupRPS[ci] / e.Rate * share
			}
		}
		out.Calls[k] = buildCallFrom(m, e, splits, load)
		out.Cost += out.Calls[k].Cost
	}
	return out, nil
}
