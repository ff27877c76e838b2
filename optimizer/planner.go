package optimizer

import (
	"hash/maphash"
	"math"
)

// DefaultDamping is Planner's default damping threshold: a recompute that moves less than 1 %
// of the traffic is not pushed.
const DefaultDamping = 0.01

// Planner is the stateful side of planning that a server holds: it compiles and solves each new
// topology, and says whether the result is worth a push compared with the last allocation
// pushed (flap damping). It is pure: no clock, no I/O.
//
// Rule: a new allocation is pushed when the membership changed (the nodes, the services with
// their ports and pods — name, node, address, IP, service account — or which calls and ingress
// exist), or when it moves at least Damping of the traffic and the move is worth it; otherwise
// it is suppressed and the last allocation pushed stays. Exactly:
//
//   - moved: Σ over call edges and caller pods of the caller's rps × the total variation
//     distance between its old and new fractions (½ Σ |f_new − f_old|), over the total rps;
//   - worth it: the last allocation pushed, applied to the new topology (its fractions, the new
//     rates and latencies), either costs at least Damping more than the new one (Σ rps ×
//     latency), or puts the callee pods' loads at least Damping of the traffic away from the
//     new allocation's (½ Σ |load_old − load_new| / total rps) — so a new optimum that is only
//     a tie broken the other way (LATA's optimum is often degenerate, and noisy latencies flip
//     it) is not pushed, while a change of rates or weights that unbalances the old fractions
//     is.
//
// Both are measured against the last allocation pushed, not the last one computed, so slow
// drift is pushed once it adds up.
//
// A Planner is not safe for concurrent use.
type Planner struct {
	// Policy and Options as for Compile and Plan.
	Policy  Policy
	Options Options
	// Damping is the least fraction of the traffic a recompute must move to be pushed (0 means
	// DefaultDamping; negative pushes every recompute).
	Damping float64
	// Step is the closed-loop policy's step limit in (0, 1]: the fraction of the way from the
	// allocation in force to a new plan that one push moves (0 means DefaultStep; see
	// closedloop.go). Other policies ignore it.
	Step float64

	last       *Allocation
	membership uint64
	queued     map[string]bool // closed-loop: the services last's model had service rates for
	pooled     map[string]bool // closed-loop: the services last pools (Allocation.Pooled)
	measured   map[string]bool // closed-loop: the services an allocation pushed was ever planned with service rates for
	inc        incremental     // the last recompute (see incremental.go)
	compiler   Compiler        // for topologies handed over uncompiled (Plan)
}

// PlanResult is one recompute of a Planner.
type PlanResult struct {
	Model      *Model
	Allocation *Allocation
	// Push says whether the allocation is worth pushing (see Planner); when false, the last
	// allocation pushed stays in force.
	Push bool
	// Moved is the fraction of the traffic whose route differs from the last allocation pushed
	// (1 when there is none, the membership changed, or damping is off).
	Moved float64
	// MembershipChanged says whether pods, services, nodes or call edges differ from the last
	// push.
	MembershipChanged bool
	// Solved is the number of units re-solved (call edges; under lata-q, callee services);
	// Recompiled says the model came from the previous one (only numbers changed).
	Solved     int
	Recompiled bool
	// Gain and LoadShift compare the last allocation pushed, applied to the new topology, with
	// the new one: the relative latency cost saved, and the fraction of the traffic whose callee
	// pod differs (computed only when Moved reaches the threshold).
	Gain, LoadShift float64

	membership uint64
}

// Plan compiles and solves t, incrementally where it can (see incremental.go: the result is
// what Compile and Plan give). It remembers this recompute for the next one, but not as
// pushed: call Pushed once the result has been published.
func (pl *Planner) Plan(t *Topology) (*PlanResult, error) {
	return pl.PlanCompiled(t, nil)
}

// PlanCompiled is Plan of a topology already compiled at the head of the pipeline (the watcher
// compiles each topology it delivers once, with the consumers' options, and hands the model
// over with it): cm is used when it is t's, compiled with the Planner's options; else (or when
// cm is nil) t is compiled here.
func (pl *Planner) PlanCompiled(t *Topology, cm *Compiled) (*PlanResult, error) {
	policy := pl.Policy
	if policy == "" {
		policy = LATA
	}
	if _, err := ParsePolicy(string(policy)); err != nil {
		return nil, err
	}
	if cm == nil || cm.Model.Topology != t || !sameOptions(cm.Options, pl.Options) {
		pl.compiler.Options = pl.Options
		var err error
		if cm, err = pl.compiler.Compile(t); err != nil {
			return nil, err
		}
	}
	m := cm.Model
	// Incremental only from the topology this Planner solved last (else as a full compile).
	recompiled := pl.inc.top != nil && cm.base.Value() == pl.inc.top
	podsChanged, latencyChanged := cm.podsChanged, cm.latencyChanged
	var prevPlan *previousPlan
	// Per zone the plan is made between zones, in full (it is small): nothing to reuse.
	if prev := pl.inc.model; prev != nil && sameShape(prev, m) && !m.Latency.Zoned() && !prev.Latency.Zoned() {
		change := make([]int, len(m.Calls))
		into := make([][]int, len(m.Services))
		var nodes [][]int // nil: no latency changed, none to compare
		if !recompiled || latencyChanged {
			nodes = serviceNodes(m)
		}
		for k := range m.Calls {
			change[k] = edgeChange(prev, m, k, nodes)
			into[m.Calls[k].To] = append(into[m.Calls[k].To], k)
		}
		prevPlan = &previousPlan{alloc: pl.inc.alloc, queueState: pl.inc.queue,
			keepEdge:   func(k int) bool { return change[k] == edgeSame },
			keepSplits: func(k int) bool { return change[k] == edgeLoad },
			keepService: func(b int) bool {
				if m.Services[b].Ingress != prev.Services[b].Ingress || !samePods(m.Services[b].Pods, prev.Services[b].Pods) {
					return false
				}
				for _, k := range into[b] {
					if change[k] != edgeSame {
						return false
					}
				}
				return true
			}}
	}
	alloc, queue, solved, err := planFrom(m, policy, prevPlan)
	if err != nil {
		return nil, err
	}
	pl.inc.top, pl.inc.model, pl.inc.alloc, pl.inc.queue = t, m, alloc, queue
	// The membership key, kept by part: a recompile changes at most some services' pods.
	if !recompiled {
		pl.inc.head = headKey(t)
		pl.inc.svcKeys = make([]uint64, len(t.Services))
		for i := range t.Services {
			pl.inc.svcKeys[i] = serviceKey(&t.Services[i])
		}
	} else {
		for _, i := range podsChanged {
			pl.inc.svcKeys[i] = serviceKey(&t.Services[i])
		}
	}
	key := pl.inc.key
	if !recompiled || len(podsChanged) > 0 {
		key = combineKey(pl.inc.head, pl.inc.svcKeys)
	}
	pl.inc.key = key
	r := &PlanResult{Model: m, Allocation: alloc, membership: key, Moved: 1, Push: true,
		Solved: solved, Recompiled: recompiled}
	r.MembershipChanged = pl.last == nil || r.membership != pl.membership
	damping := pl.Damping
	if damping == 0 {
		damping = DefaultDamping
	}
	if policy == ClosedLoop {
		if !r.MembershipChanged {
			pl.closedLoopStep(m, r, damping)
		}
		pl.pool(m, r)
		return r, nil
	}
	if r.MembershipChanged {
		return r, nil
	}
	if damping < 0 {
		return r, nil // every recompute is pushed; Moved stays 1 (not measured)
	}
	r.Moved = moved(pl.last, alloc)
	r.Push = r.Moved >= damping
	if r.Push {
		r.Gain, r.LoadShift = reapplied(m, pl.last, alloc)
		r.Push = r.Gain >= damping || r.LoadShift >= damping
	}
	return r, nil
}

// reapplied applies the fractions of old to the new model (same membership) and compares the
// result with alloc: the relative latency cost the new allocation saves, and the fraction of
// the traffic its callee loads differ by.
func reapplied(m *Model, old, alloc *Allocation) (gain, shift float64) {
	node := map[string]int{}
	for _, s := range m.Services {
		for _, p := range s.Pods {
			node[p.Name] = p.Node
		}
	}
	var oldCost, newCost, total, diff float64
	for i := range alloc.Calls {
		nc := &alloc.Calls[i]
		newCost += nc.Cost
		supply := map[string]float64{}
		load := map[string]float64{}
		for _, r := range nc.Routes {
			supply[r.Caller] += r.RPS
			load[r.Callee] += r.RPS
			total += r.RPS
		}
		if oc := old.Call(nc.From, nc.To); oc != nil {
			for _, r := range oc.Routes {
				rps := supply[r.Caller] * r.Fraction
				oldCost += rps * m.Latency.At(node[r.Caller], node[r.Callee])
				load[r.Callee] -= rps
			}
		}
		for _, d := range load {
			diff += math.Abs(d)
		}
	}
	if oldCost > 0 {
		gain = (oldCost - newCost) / oldCost
	}
	if total > 0 {
		shift = diff / 2 / total
	}
	return gain, shift
}

// Pushed records r as the allocation in force (the baseline of the next damping decision).
func (pl *Planner) Pushed(r *PlanResult) {
	pl.last, pl.membership = r.Allocation, r.membership
	if pl.Policy == ClosedLoop && r.Model != nil {
		pl.queued = queuedServices(r.Model)
		if pl.measured == nil {
			pl.measured = map[string]bool{}
		}
		for name := range pl.queued {
			pl.measured[name] = true
		}
		pl.pooled = map[string]bool{}
		for _, name := range r.Allocation.Pooled {
			pl.pooled[name] = true
		}
	}
}

// moved is the fraction of the traffic of b whose route differs from a (same call edges and
// pods: the membership is unchanged).
func moved(a, b *Allocation) float64 {
	var total, diff float64
	for i := range b.Calls {
		nc := &b.Calls[i]
		oc := a.Call(nc.From, nc.To)
		old := map[[2]string]float64{}
		if oc != nil {
			for _, r := range oc.Routes {
				old[[2]string{r.Caller, r.Callee}] = r.Fraction
			}
		}
		supply := map[string]float64{}
		tv := map[string]float64{} // caller → Σ |Δf|
		for _, r := range nc.Routes {
			supply[r.Caller] += r.RPS
			k := [2]string{r.Caller, r.Callee}
			tv[r.Caller] += math.Abs(r.Fraction - old[k])
			delete(old, k)
		}
		for k, f := range old { // routes that disappeared
			tv[k[0]] += f
		}
		for c, s := range supply {
			total += s
			diff += s * tv[c] / 2
		}
	}
	if !(total > 0) {
		return 0
	}
	return diff / total
}

// membershipKey hashes what damping never holds back: the nodes, the services with their ports
// and pods (everything but weight), and the call and ingress edges (without rates).
//
// It is computed here afresh; the Planner keeps it by part (the tests compare the two).
func membershipKey(t *Topology) uint64 {
	svcs := make([]uint64, len(t.Services))
	for i := range t.Services {
		svcs[i] = serviceKey(&t.Services[i])
	}
	return combineKey(headKey(t), svcs)
}

// headKey hashes the nodes, the call edges and the ingress services.
func headKey(t *Topology) uint64 {
	var h maphash.Hash
	h.SetSeed(membershipSeed)
	writeString(&h, t.LatencyGranularity)
	maphash.WriteComparable(&h, len(t.Nodes))
	for _, n := range t.Nodes {
		writeString(&h, n.Name)
		maphash.WriteComparable(&h, n.CPU)
		maphash.WriteComparable(&h, n.Memory)
	}
	maphash.WriteComparable(&h, len(t.Calls))
	for _, c := range t.Calls {
		writeString(&h, CanonicalKey(c.From))
		writeString(&h, CanonicalKey(c.To))
	}
	maphash.WriteComparable(&h, len(t.Ingress))
	for _, in := range t.Ingress {
		writeString(&h, CanonicalKey(in.Service))
	}
	return h.Sum64()
}

// serviceKey hashes a service with its ports and pods (everything but weights).
func serviceKey(s *Service) uint64 {
	var h maphash.Hash
	h.SetSeed(membershipSeed)
	writeString(&h, s.Key())
	maphash.WriteComparable(&h, s.CPU)
	maphash.WriteComparable(&h, s.Memory)
	maphash.WriteComparable(&h, s.Replicas)
	maphash.WriteComparable(&h, len(s.Ports))
	for _, p := range s.Ports {
		writeString(&h, p.Name)
		maphash.WriteComparable(&h, p.Port)
		maphash.WriteComparable(&h, p.TargetPort)
	}
	maphash.WriteComparable(&h, len(s.Pods))
	for _, p := range s.Pods {
		writeString(&h, p.Name)
		writeString(&h, p.Node)
		writeString(&h, p.IP)
		writeString(&h, p.Address)
		writeString(&h, p.ServiceAccount)
	}
	return h.Sum64()
}

func combineKey(head uint64, svcs []uint64) uint64 {
	var h maphash.Hash
	h.SetSeed(membershipSeed)
	maphash.WriteComparable(&h, head)
	for _, k := range svcs {
		maphash.WriteComparable(&h, k)
	}
	return h.Sum64()
}

func writeString(h *maphash.Hash, s string) {
	maphash.WriteComparable(h, len(s))
	h.WriteString(s)
}

// membershipSeed makes membershipKey stable within the process (keys are never stored).
var membershipSeed = maphash.MakeSeed()
