package optimizer

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// DefaultRebalanceTolerance is the relative cost margin within which PlanRebalance prefers the
// target reachable in the fewest moves (RebalanceOptions.Tolerance 0 means this).
const DefaultRebalanceTolerance = 0.01

// RebalanceOptions tunes PlanRebalance.
type RebalanceOptions struct {
	// Tolerance: among candidate targets whose cost is within Tolerance (relative, e.g. 0.01)
	// of the cheapest, the one reachable in the fewest moves wins. 0 means
	// DefaultRebalanceTolerance; it must be finite and not negative.
	Tolerance float64
	// Budget bounds the wall time of the two searches (the local search from the current
	// placement and LARP from scratch), as PlaceOptions.Budget does (0: no limit). When it
	// cuts either short, Rebalance.Truncated says so and the best found so far is used.
	Budget time.Duration
	// Previous is the target of the plan before (its Rebalance.TargetCounts). When it still
	// fits the model — every service's replica count, every node known, the constraints held
	// — it is one more candidate, preferred over the searches' targets on ties: a controller
	// that carries a plan out a few moves per run keeps heading for the same target, instead
	// of an equally cheap other one whose moves undo those made (live, a fresh target each
	// run sent Bookinfo's pods back to nodes they had just left).
	Previous map[string]map[string]int
	// PreviousTolerance: the previous target is kept while its cost is within this (relative)
	// of the cheapest candidate, so that measurement noise in the latencies does not swap one
	// target for another run after run; a controller passes the gain it acts on. Below
	// Tolerance (and 0) it is Tolerance.
	PreviousTolerance float64
}

// Move relocates one pod.
type Move struct {
	Service string `json:"service"` // the service's Key() as in the Topology (NAME or NAME.NS)
	Pod     string `json:"pod"`     // the pod's PodKey: its name, or POD.NS outside the default namespace
	From    string `json:"from"`    // node names
	To      string `json:"to"`
	// CostAfter is the LATA cost (what Plan(…, LATA) reports) after this move and every move
	// before it in Moves; 0 in Blocked.
	CostAfter float64 `json:"cost_after"`
}

// Rebalance is a plan from the current placement toward a LARP target.
type Rebalance struct {
	// CostBefore is the LATA cost of the current placement (what Plan(m, LATA) gives).
	CostBefore float64 `json:"cost_before"`
	// CostTarget is the LATA cost of the target placement (Target applied).
	CostTarget float64 `json:"cost_target"`
	// QueueingBefore and QueueingTarget are the predicted queueing of the current and the
	// target placement (Placement.Queueing), in ms·req/s.
	QueueingBefore float64 `json:"queueing_before"`
	QueueingTarget float64 `json:"queueing_target"`
	// UtilizationBefore and UtilizationTarget are every node's planned use in the current and
	// the target placement (Placement.Utilization), in node order.
	UtilizationBefore []NodeUse `json:"utilization_before"`
	UtilizationTarget []NodeUse `json:"utilization_target"`
	// Target maps every pod of the model to its node in the target.
	Target map[string]string `json:"target"`
	// Moves lead from the current placement toward Target, in order: each is feasible in the
	// state the moves before it leave (the destination has cpu and memory for the pod and stays
	// within the spread cap), and each is the one of lowest resulting cost among those feasible
	// then. With Blocked empty, the last CostAfter equals CostTarget.
	Moves []Move `json:"moves"`
	// Blocked are the moves toward Target that no order of single feasible moves reaches, e.g.
	// a swap between two full nodes (CostAfter 0). The controller may leave them, or free room
	// by other means and plan again.
	Blocked []Move `json:"blocked,omitempty"`
	// Truncated says the budget (RebalanceOptions.Budget) cut a search short: the target is the
	// best found in time, and the result depends on the machine and its load.
	Truncated bool `json:"truncated,omitempty"`
	// TargetCounts is Target as pods per node of each service (service name → node → pods),
	// what RebalanceOptions.Previous takes in the next plan.
	TargetCounts map[string]map[string]int `json:"-"`
}

// Placement returns the target as a Placement (policy LARP, cost CostTarget), whose Apply
// gives the target topology.
func (r *Rebalance) Placement() *Placement {
	target := make(map[string]string, len(r.Target))
	for pod, node := range r.Target {
		target[pod] = node
	}
	return &Placement{Policy: LARP, Placement: target, Cost: r.CostTarget, Queueing: r.QueueingTarget, Utilization: r.UtilizationTarget}
}

// PlanRebalance plans moves from the current placement of m (every pod's Node, as Compile
// without Unplaced gives it) toward a cheaper placement, for a controller that moves a few pods
// per period. The constraints are Place's: node cpu and memory, and at most
// ceil(replicas/|nodes|) pods of a service per node.
//
// Pods of one service with equal weight are interchangeable: a target is a count of them per
// node, and reaching it takes Σ over (service, weight, node) of max(0, current − target) moves.
// Pods already where the target wants their kind stay; a moved pod leaves a node holding more
// of its kind than the target, for one holding fewer.
//
// Three candidate targets are considered: local search (as LARP's) started from the current
// placement; LARP's placement from scratch (what Place(m, LARP) gives); and the current
// placement itself; a fourth, the previous plan's target, when opt.Previous gives one that
// still fits. Among those whose cost is within opt.Tolerance of the cheapest, the one of
// fewest moves wins (ties: the cheaper, then that order); but the previous target, while
// within opt.PreviousTolerance of the cheapest, wins over any other but the current
// placement. A current placement that breaks a constraint — more pods of a service on a node
// than the spread cap, or requests over a node's allocatable, both of which happen on live
// clusters — is no candidate; the local search then
// starts from it after a repair that moves the offending pods, one at a time, to the feasible
// node where they cost least (if some pod fits nowhere, that candidate is dropped). When no
// candidate is feasible the error wraps ErrInfeasible, as Place's does. A candidate's cost is
// its LATA cost plus, when some pod has a service rate, its queueing (Rebalance.QueueingTarget):
// what LARP minimises.
//
// Moves are ordered greedily: from the current state, the feasible move toward the target of
// lowest resulting LATA cost is applied next (moves are compared by the incremental integer
// costing of Place's search; CostAfter is computed exactly as Plan does, re-solving only the
// call edges of the moved service). Moves that never become feasible are Blocked. A pod with
// no node is an error (wrapping ErrInvalidTopology) that names it.
//
// Cost: one LARP placement, one local search, and per move the trials of the pending moves
// whose services' neighbourhood changed (each re-solves the node-level transports of the
// service's call edges). PlanRebalance is deterministic — the same model gives the same plan
// for any GOMAXPROCS — and safe for concurrent use (m is only read).
func PlanRebalance(m *Model, opt RebalanceOptions) (*Rebalance, error) {
	tol := opt.Tolerance
	if tol == 0 {
		tol = DefaultRebalanceTolerance
	}
	if !(tol >= 0) || math.IsInf(tol, 1) {
		return nil, fmt.Errorf("optimizer: rebalance tolerance %v: want a finite number ≥ 0", opt.Tolerance)
	}
	var cur []int
	for _, sm := range m.Services {
		for _, p := range sm.Pods {
			if p.Node < 0 {
				return nil, fmt.Errorf("%w: pod %q (service %q) has no node: a rebalance starts from placed pods", ErrInvalidTopology, p.Name, sm.Name)
			}
			cur = append(cur, p.Node)
		}
	}
	pp, err := newPlaceProblem(m)
	if err != nil {
		return nil, err
	}
	coster := newPlanCoster(m)
	seq := pp.newMoveSequencer(cur, coster)
	before, err := coster.cost(pp, cur)
	if err != nil {
		return nil, err
	}

	// The candidates, in order of preference on ties: the current placement, the previous
	// target, local search from it, LARP from scratch. The two searches run in parallel; each
	// writes its own slot.
	var fromCurrent, fromScratch []int
	var scratchErr error
	curOK := pp.feasible(cur) == ""
	budget := newLarpBudget(PlaceOptions{Budget: opt.Budget})
	var cutCurrent bool
	var cutScratch *PlacementCut
	parallel(2, func(_, i int) {
		if i == 0 {
			st := pp.newState()
			st.load(cur)
			if curOK || st.repair() {
				left := &stepsLeft{b: budget}
				st.localSearchWithin(larpDefault, left)
				cutCurrent = left.cut
				fromCurrent = st.snapshot()
			}
			return
		}
		fromScratch, cutScratch, scratchErr = pp.larpWithin(larpDefault, budget)
	})
	type candidate struct {
		nodes []int
		moves int
		cost  float64
	}
	var current []int
	if curOK {
		current = cur
	}
	var cands []candidate
	prev := -1
	for k, nodes := range [][]int{current, pp.fromCounts(opt.Previous), fromCurrent, fromScratch} {
		if nodes == nil || pp.feasible(nodes) != "" { // a search from a placement the repair could not mend
			continue
		}
		if k == 1 {
			prev = len(cands)
		}
		nodes = seq.match(nodes)
		c, err := coster.cost(pp, nodes)
		if err != nil {
			return nil, err
		}
		if pp.queued {
			c += m.queueing(pp.cpuUse, nodes)
		}
		cands = append(cands, candidate{nodes: nodes, moves: seq.moves(nodes), cost: c})
	}
	if len(cands) == 0 {
		// Only when LARP found no placement and the current one breaks a constraint that the
		// repair cannot mend: scratchErr wraps ErrInfeasible.
		return nil, fmt.Errorf("%w (the current placement has %s)", scratchErr, pp.feasible(cur))
	}
	best := cands[0].cost
	for _, c := range cands {
		best = min(best, c.cost)
	}
	chosen := -1
	for i, c := range cands {
		if c.cost > best*(1+tol) {
			continue
		}
		if chosen < 0 || c.moves < cands[chosen].moves || c.moves == cands[chosen].moves && c.cost < cands[chosen].cost {
			chosen = i
		}
	}
	// The previous target stays while it is within PreviousTolerance of the cheapest, even
	// against a target of fewer moves (a fresh target each run is what undoes moves), unless
	// the current placement won (nothing left to do).
	if prev >= 0 && cands[chosen].moves > 0 && cands[prev].cost <= best*(1+max(tol, opt.PreviousTolerance)) {
		chosen = prev
	}

	out := &Rebalance{CostBefore: before, Truncated: cutCurrent || cutScratch != nil}
	final, err := seq.order(cands[chosen].nodes, out)
	if err != nil {
		return nil, err
	}
	if out.CostTarget, err = coster.cost(pp, final); err != nil {
		return nil, err
	}
	cpu := m.podCPUs()
	out.QueueingBefore, out.UtilizationBefore = m.queueing(cpu, cur), m.nodeUses(cpu, cur)
	out.QueueingTarget, out.UtilizationTarget = m.queueing(cpu, final), m.nodeUses(cpu, final)
	out.Target = make(map[string]string, len(final))
	out.TargetCounts = make(map[string]map[string]int, len(m.Services))
	for i, u := range final {
		s := pp.pods[i].svc
		out.Target[m.Services[s].Pods[i-pp.svcs[s].first].Name] = m.Nodes[u].Name
		counts := out.TargetCounts[m.Services[s].Name]
		if counts == nil {
			counts = map[string]int{}
			out.TargetCounts[m.Services[s].Name] = counts
		}
		counts[m.Nodes[u].Name]++
	}
	return out, nil
}

// fromCounts is a placement with counts' pods per node of each service (nil counts: none),
// or nil when it does not fit the model: a service's counts do not add up to its pods, name a
// node the model lacks, or the placement breaks a constraint. Pods take the nodes in node
// order; match assigns them to the current pods.
func (pp *placeProblem) fromCounts(counts map[string]map[string]int) []int {
	if counts == nil {
		return nil
	}
	nodes := make([]int, len(pp.pods))
	for s := range pp.m.Services {
		want, i := counts[pp.m.Services[s].Name], pp.svcs[s].first
		for u := range pp.m.Nodes {
			for k := want[pp.m.Nodes[u].Name]; k > 0 && i < len(nodes); k-- {
				nodes[i] = u
				i++
			}
		}
		total := 0
		for _, k := range want {
			total += k
		}
		// Every pod placed, and on the model's nodes only (a node it lacks leaves i short).
		if total != pp.svcs[s].count || i != pp.svcs[s].first+pp.svcs[s].count {
			return nil
		}
	}
	if pp.feasible(nodes) != "" {
		return nil
	}
	return nodes
}

// moveSequencer sequences the moves from the current placement to a target (order: each next
// move the feasible one of lowest resulting cost); it also relabels a target's pods to keep
// them where they are (match) and counts the moves a target takes (moves). It holds what one
// PlanRebalance shares between its steps: the current placement and the pods' classes —
// interchangeable pods: one service, equal weight (the model's, not the integer one, which
// largest remainder may make unequal).
type moveSequencer struct {
	pp    *placeProblem
	cur   []int
	class []int   // per pod
	pods  [][]int // per class, its pods in model order
	svcOf []int   // per class
	// classesOf[s] are the classes of service s; they go dirty when s or a neighbour moves.
	classesOf [][]int
	coster    *planCoster // for each move's CostAfter
}

func (pp *placeProblem) newMoveSequencer(cur []int, coster *planCoster) *moveSequencer {
	seq := &moveSequencer{pp: pp, cur: cur, class: make([]int, len(pp.pods)), classesOf: make([][]int, len(pp.svcs)),
		coster: coster}
	for s, sm := range pp.m.Services {
		first := len(seq.pods)
		for k, p := range sm.Pods {
			c := first
			for c < len(seq.pods) && sm.Pods[seq.pods[c][0]-pp.svcs[s].first].Weight != p.Weight {
				c++
			}
			if c == len(seq.pods) {
				seq.pods = append(seq.pods, nil)
				seq.svcOf = append(seq.svcOf, s)
				seq.classesOf[s] = append(seq.classesOf[s], c)
			}
			i := pp.svcs[s].first + k
			seq.pods[c] = append(seq.pods[c], i)
			seq.class[i] = c
		}
	}
	return seq
}

// moves counts the moves from the current placement to target: Σ over (class, node) of
// max(0, current − target).
func (seq *moveSequencer) moves(target []int) int {
	surplus := make(map[[2]int]int)
	for i := range target {
		surplus[[2]int{seq.class[i], seq.cur[i]}]++
		surplus[[2]int{seq.class[i], target[i]}]--
	}
	k := 0
	for _, x := range surplus {
		k += max(0, x)
	}
	return k
}

// slot is a node with pods of a class to give away (pods) or to take in (need).
type slot struct {
	node int
	pods []int
	need int
}

// diff returns, for class c, the nodes with a surplus of its pods (the pods that leave: those
// beyond the target's count, the later ones in model order) and those with a deficit, both by
// ascending node.
func (seq *moveSequencer) diff(c int, target []int) (src, dst []slot) {
	pods := seq.pods[c]
	from := slices.Clone(pods)
	slices.SortStableFunc(from, func(a, b int) int { return seq.cur[a] - seq.cur[b] })
	to := make([]int, len(pods))
	for k, i := range pods {
		to[k] = target[i]
	}
	slices.Sort(to)
	a, b := 0, 0
	for a < len(from) || b < len(to) {
		u := math.MaxInt
		if a < len(from) {
			u = seq.cur[from[a]]
		}
		if b < len(to) {
			u = min(u, to[b])
		}
		a0, b0 := a, b
		for a < len(from) && seq.cur[from[a]] == u {
			a++
		}
		for b < len(to) && to[b] == u {
			b++
		}
		have, want := a-a0, b-b0
		switch {
		case have > want:
			src = append(src, slot{node: u, pods: from[a0+want : a]})
		case want > have:
			dst = append(dst, slot{node: u, need: want - have})
		}
	}
	return src, dst
}

// match returns target with the pods relabelled so that pods stay where the target keeps
// their class: leaving pods fill the deficit slots in node order.
func (seq *moveSequencer) match(target []int) []int {
	out := slices.Clone(seq.cur)
	for c := range seq.pods {
		src, dst := seq.diff(c, target)
		d := 0
		for _, sl := range src {
			for _, i := range sl.pods {
				for dst[d].need == 0 {
					d++
				}
				out[i] = dst[d].node
				dst[d].need--
			}
		}
	}
	return out
}

// pending is one class's moves still to make, and the cached cost changes of its (source,
// destination) pairs.
type pending struct {
	src, dst []slot
	dirty    bool
	delta    []float64 // [a*len(dst)+b]: cost change of moving src[a]'s next pod to dst[b]
}

// order appends to out.Moves the moves from the current placement to target (a match result)
// in greedy order, and to out.Blocked those that never become feasible; it returns the target
// with every pod's final node (which pod of a class goes where follows the order).
func (seq *moveSequencer) order(target []int, out *Rebalance) ([]int, error) {
	pp := seq.pp
	m, n := pp.m, pp.n
	final := slices.Clone(seq.cur)
	st := pp.newState()
	st.memo = make([]memoEntry, pp.memoSize())
	st.load(seq.cur)
	if err := seq.coster.load(pp, seq.cur); err != nil {
		return nil, err
	}
	work := make([]pending, len(seq.pods))
	for c := range work {
		work[c].src, work[c].dst = seq.diff(c, target)
		work[c].dirty = true
	}
	name := func(i int) (svc, pod string) {
		s := pp.pods[i].svc
		return m.Services[s].Name, m.Services[s].Pods[i-pp.svcs[s].first].Name
	}
	for {
		bestC, bestA, bestB, bestD := -1, 0, 0, math.Inf(1)
		for c := range work {
			w := &work[c]
			if len(w.src) == 0 {
				continue
			}
			s := seq.svcOf[c]
			if w.dirty {
				w.dirty = false
				w.delta = w.delta[:0]
				for _, a := range w.src {
					for _, b := range w.dst {
						w.delta = append(w.delta, st.tryMove(a.pods[0], b.node, math.Inf(1)))
					}
				}
			}
			for a := range w.src {
				for b, sb := range w.dst {
					v := sb.node
					if int(st.count[s*n+v]) >= pp.svcs[s].cap || !st.fitsResources(w.src[a].pods[0], v) {
						continue
					}
					if d := w.delta[a*len(w.dst)+b]; bestC < 0 || d < bestD {
						bestC, bestA, bestB, bestD = c, a, b, d
					}
				}
			}
		}
		if bestC < 0 {
			break
		}
		w := &work[bestC]
		i, u, v := w.src[bestA].pods[0], w.src[bestA].node, w.dst[bestB].node
		s := pp.pods[i].svc
		st.remove(i)
		st.add(i, v)
		st.resolve(pp.svcs[s].edges)
		final[i] = v
		seq.coster.set(pp, i, v)
		if err := seq.coster.solveService(s); err != nil {
			return nil, err
		}
		svc, pod := name(i)
		out.Moves = append(out.Moves, Move{Service: svc, Pod: pod, From: m.Nodes[u].Name, To: m.Nodes[v].Name, CostAfter: seq.coster.total()})
		if w.src[bestA].pods = w.src[bestA].pods[1:]; len(w.src[bestA].pods) == 0 {
			w.src = slices.Delete(w.src, bestA, bestA+1)
		}
		if w.dst[bestB].need--; w.dst[bestB].need == 0 {
			w.dst = slices.Delete(w.dst, bestB, bestB+1)
		}
		for _, c := range seq.classesOf[s] {
			work[c].dirty = true
		}
		for _, e := range pp.svcs[s].edges {
			for _, t := range [2]int{pp.edges[e].from, pp.edges[e].to} {
				for _, c := range seq.classesOf[t] {
					work[c].dirty = true
				}
			}
		}
	}
	for c := range work {
		w := &work[c]
		d := 0
		for _, sa := range w.src {
			for _, i := range sa.pods {
				for w.dst[d].need == 0 {
					d++
				}
				v := w.dst[d].node
				w.dst[d].need--
				final[i] = v
				svc, pod := name(i)
				out.Blocked = append(out.Blocked, Move{Service: svc, Pod: pod, From: m.Nodes[sa.node].Name, To: m.Nodes[v].Name})
			}
		}
	}
	return final, nil
}
