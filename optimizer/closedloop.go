package optimizer

import (
	"math"
	"slices"
)

// The closed-loop policy: lata-q on measured capacities, planned with two guards that keep a
// loop on measurements stable (docs/architecture.md, "The closed loop").
//
//   - Step limit: a recompute moves the routes in force only a fraction Step of the way to the
//     new plan (per caller pod, f = f_old + Step·(f_new − f_old)), so a plan made on one window
//     of noisy measurements never swings the traffic at once, and successive steps shrink as
//     the plan converges. The full step is taken when the membership changed, when there is no
//     allocation in force, or when the allocation in force or the partial step would load a pod
//     to its service rate or beyond.
//   - Damping on lata-q's own objective (Σ rps × latency + Σ 1000·ℓ/(μ−ℓ), queueing
//     included): a step is pushed only when it moves at least Damping of the traffic and saves
//     at least Damping of that objective against the allocation in force applied to the new
//     topology (its fractions, the new rates, latencies and capacities), or when the allocation
//     in force overloads a pod.
//   - Fallback: a callee service that the allocation in force was planned with service rates
//     for and the new topology gives none (the model-error breaker tripped it: lata-q's model
//     does not describe it, watcher/estimate.Breaker) takes the new plan's routes, lata's, at
//     once, and the step is pushed: the breaker's verdict is not the objective's to weigh (by
//     lata-q's objective, which then has no queueing term for the service, lata's balanced
//     routes cost more than the localised ones in force).
//
//   - Pooling near saturation: a callee service whose load reaches lata-q's utilisation cap
//     of its measured capacity (Λ ≥ cap·Σμ: lata-q saturated, no plan keeps its pods under the
//     cap) is pooled (Allocation.Pooled): its callers balance least-request over all its pods
//     instead of the plan's bands. A plan of mean flows cannot follow queues that near
//     saturation swing faster than a plan is made, and pooled least-request sends each request
//     to a short queue wherever it is (the pooling gain: at ρ = 0.9 on three one-worker pods,
//     M/M/1 queues wait 9 service times, an M/M/3 pool 2.4). The service is banded again when
//     its load falls under (cap − PoolHysteresis)·Σμ, so a load at the edge does not flap.
//     A callee service never yet planned with a service rate (the estimator is still learning
//     it: no window has enough samples) is pooled too: until its load can be seen, the
//     balancer that sees queues is safer than lata's routes, which load pods by weight alone
//     (a pod slower than it looks builds a queue while the estimate forms). Once it has had
//     rates in force, losing them (the breaker) makes it lata's, as Fallback says.
//
// The callers balance least-request inside the plan's latency bands (xds.LBBands); the
// hold-down of one estimator window after a measurement-driven push is the feeder's (it owns
// the clock).

// DefaultStep is the closed-loop policy's step limit when Planner.Step is 0.
const DefaultStep = 0.5

// PoolHysteresis is how far under lata-q's utilisation cap a pooled service's load must fall
// before the closed-loop policy bands it again (see Pooling near saturation above).
const PoolHysteresis = 0.1

// planObjective is lata-q's objective of an allocation applied to a model: its network and
// exact queueing cost in ms·req/s, and the pods it loads to their service rate or beyond (the
// queueing cost is then +Inf).
type planObjective struct {
	network, queue float64
	overloaded     []string
	load           [][]float64 // every pod's load, per service (by index) and pod
}

func (o planObjective) total() float64 { return o.network + o.queue }

// fractionsOf returns an allocation's fractions, per call edge of m (by index), per caller pod
// name, per callee pod name; an edge the allocation lacks has none.
func fractionsOf(m *Model, a *Allocation) []map[string]map[string]float64 {
	out := make([]map[string]map[string]float64, len(m.Calls))
	for k, e := range m.Calls {
		if c := a.Call(m.Services[e.From].Name, m.Services[e.To].Name); c != nil {
			out[k] = c.Fractions()
		}
	}
	return out
}

// applyFractions builds the allocation of policy p that sends, on every call edge of m, each
// caller pod's requests by frac (fractionsOf's shape), the pods' loads propagated through the
// call graph in topological order (a pod sends what it receives times the edge's rate; ingress
// is spread by weight), and evaluates lata-q's objective on it. A caller pod without fractions
// sends by its callees' weights. Routes under dustFraction are dropped, as the solvers drop them.
// The pods in skip are left out of the queueing term (the pods a plan cannot keep under their
// service rate: lata-q serves their services as lata, outside its objective). O(routes + pods).
func applyFractions(m *Model, p Policy, frac []map[string]map[string]float64, skip map[string]bool) (*Allocation, planObjective) {
	load := make([][]float64, len(m.Services))
	for b := range m.Services {
		svc := &m.Services[b]
		load[b] = make([]float64, len(svc.Pods))
		if w := svc.TotalWeight(); w > 0 {
			for i, q := range svc.Pods {
				load[b][i] = svc.Ingress * q.Weight / w
			}
		}
	}
	from := make([][]int, len(m.Services))
	for k, e := range m.Calls {
		from[e.From] = append(from[e.From], k)
	}
	order, _ := topoOrder(len(m.Services), m.Calls)
	alloc := &Allocation{Policy: p, Calls: make([]CallAllocation, len(m.Calls))}
	for _, a := range order {
		callers := m.Services[a].Pods
		for _, k := range from[a] {
			e := m.Calls[k]
			callees := m.Services[e.To].Pods
			index := make(map[string]int, len(callees))
			for j, q := range callees {
				index[q.Name] = j
			}
			ca := CallAllocation{From: m.Services[a].Name, To: m.Services[e.To].Name}
			for i, c := range callers {
				supply := load[a][i] * e.Rate
				row := make([]float64, len(callees))
				if f := frac[k][c.Name]; len(f) > 0 {
					for name, x := range f {
						if j, ok := index[name]; ok {
							row[j] += x
						}
					}
				} else {
					copy(row, weights(callees))
				}
				var sum float64
				for _, x := range row {
					sum += x
				}
				for j, x := range row {
					if !(sum > 0) || x/sum < dustFraction {
						continue
					}
					lat := m.Latency.At(c.Node, callees[j].Node)
					r := Route{Caller: c.Name, Callee: callees[j].Name, Fraction: x / sum, RPS: x / sum * supply, LatencyMS: lat}
					ca.Cost += r.RPS * lat
					ca.Routes = append(ca.Routes, r)
					load[e.To][j] += r.RPS
				}
			}
			alloc.Calls[k] = ca
			alloc.Cost += ca.Cost
		}
	}
	obj := planObjective{network: alloc.Cost, load: load}
	for b := range m.Services {
		for i, q := range m.Services[b].Pods {
			if q.CapacityRPS <= 0 || skip[q.Name] {
				continue
			}
			if load[b][i] >= q.CapacityRPS {
				obj.overloaded = append(obj.overloaded, q.Name)
				obj.queue = math.Inf(1)
				continue
			}
			obj.queue += m.Services[b].queueOf(q).cost(load[b][i])
		}
	}
	if !math.IsInf(obj.queue, 1) {
		alloc.QueueCost = obj.queue
	}
	return alloc, obj
}

// blendFractions returns old + step·(new − old), per edge and caller pod; a caller that one side
// lacks takes the other's fractions, and so does every caller of an edge marked in full.
func blendFractions(old, new []map[string]map[string]float64, step float64, full []bool) []map[string]map[string]float64 {
	out := make([]map[string]map[string]float64, len(new))
	for k := range new {
		if full[k] {
			out[k] = new[k]
			continue
		}
		out[k] = map[string]map[string]float64{}
		callers := map[string]bool{}
		for c := range old[k] {
			callers[c] = true
		}
		for c := range new[k] {
			callers[c] = true
		}
		for c := range callers {
			o, n := old[k][c], new[k][c]
			switch {
			case len(o) == 0:
				out[k][c] = n
				continue
			case len(n) == 0:
				out[k][c] = o
				continue
			}
			row := map[string]float64{}
			for q, x := range o {
				row[q] += (1 - step) * x
			}
			for q, x := range n {
				row[q] += step * x
			}
			out[k][c] = row
		}
	}
	return out
}

// closedLoopStep applies the closed-loop guards to a recompute whose membership is unchanged:
// it replaces r.Allocation by the step from last toward it (see the top of this file) and sets
// Moved, Gain and Push. damping < 0 pushes every step.
func (pl *Planner) closedLoopStep(m *Model, r *PlanResult, damping float64) {
	step := pl.Step
	if step == 0 {
		step = DefaultStep
	}
	target := r.Allocation
	// The pods the new plan itself loads to their service rate (a saturated service) are out of
	// the comparison: no plan does better there.
	skip := map[string]bool{}
	_, t := applyFractions(m, ClosedLoop, fractionsOf(m, target), nil)
	for _, q := range t.overloaded {
		skip[q] = true
	}
	old := fractionsOf(m, pl.last)
	_, before := applyFractions(m, ClosedLoop, old, skip)
	fell, fallback := pl.fellBack(m)
	next := target
	if step < 1 && len(before.overloaded) == 0 {
		blended, obj := applyFractions(m, ClosedLoop, blendFractions(old, fractionsOf(m, target), step, fell), skip)
		if len(obj.overloaded) == 0 {
			blended.Saturated = slices.Clone(target.Saturated)
			next = blended
		}
	}
	// A step leaves a part of every band it leaves (1 − Step of it), so a plan that moves in
	// steps keeps slivers across the network that no later step is worth pushing for; they go
	// as lata-q's own do (foldThinBands).
	next = foldThinBands(m, next)
	_, after := applyFractions(m, ClosedLoop, fractionsOf(m, next), skip)
	r.Allocation = next
	r.Moved = moved(pl.last, next)
	switch {
	case len(before.overloaded) > 0:
		r.Gain = 1
	case before.total() > 0:
		r.Gain = (before.total() - after.total()) / before.total()
	}
	r.Push = damping < 0 || len(before.overloaded) > 0 || fallback || (r.Moved >= damping && r.Gain >= damping)
}

// fellBack marks the call edges of m into a service that the allocation in force was planned
// with service rates for and m gives none (see Fallback at the top of this file), and says
// whether there is one. O(calls + pods of their callees).
func (pl *Planner) fellBack(m *Model) ([]bool, bool) {
	fell := make([]bool, len(m.Calls))
	found := false
	for k, e := range m.Calls {
		if to := &m.Services[e.To]; pl.queued[to.Name] && !hasCapacity(to) {
			fell[k], found = true, true
		}
	}
	return fell, found
}

// queuedServices returns the services of m that have a service rate (lata-q plans them as
// queues), by name.
func queuedServices(m *Model) map[string]bool {
	out := map[string]bool{}
	for i := range m.Services {
		if hasCapacity(&m.Services[i]) {
			out[m.Services[i].Name] = true
		}
	}
	return out
}

// pool marks in r's allocation the callee services the closed-loop policy pools (see Pooling
// near saturation at the top of this file: the loaded ones, those pooled in the allocation in
// force with hysteresis, and the ones never measured), and makes r pushed when the set differs from the one in force. The
// allocation is copied, not changed in place (the incremental planner keeps it).
// O(services + pods).
func (pl *Planner) pool(m *Model, r *PlanResult) {
	called := make([]bool, len(m.Services))
	for _, e := range m.Calls {
		called[e.To] = true
	}
	var pooled []string
	for b := range m.Services {
		svc := &m.Services[b]
		if !called[b] {
			continue // served from outside: no caller of ours picks its pods
		}
		var mu float64
		for _, q := range svc.Pods {
			if q.Weight > 0 {
				mu += q.CapacityRPS
			}
		}
		if !(mu > 0) {
			if !pl.measured[svc.Name] {
				pooled = append(pooled, svc.Name) // still learning
			}
			continue
		}
		limit := m.UtilizationCap
		if pl.pooled[svc.Name] {
			limit -= PoolHysteresis
		}
		if svc.Load >= limit*mu {
			pooled = append(pooled, svc.Name)
		}
	}
	a := *r.Allocation
	a.Pooled = pooled
	r.Allocation = &a
	if len(pooled) != len(pl.pooled) {
		r.Push = true
		return
	}
	for _, name := range pooled {
		if !pl.pooled[name] {
			r.Push = true
			return
		}
	}
}
