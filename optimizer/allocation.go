package optimizer

import (
	"fmt"
	"sort"
)

// Policy names a traffic-allocation policy.
type Policy string

// The allocation policies (docs/architecture.md, "The policies"): LATA and the baselines it
// is compared with, and lata-q.
const (
	// RoundRobin is the Kubernetes default: f_pq ∝ w_q, ignoring latency.
	RoundRobin Policy = "round-robin"
	// Localization sends everything to the caller's lowest-latency callee pods, ties split by
	// weight, with no load constraint.
	Localization Policy = "localization"
	// OptTraffic sends to same-node callee pods first, up to their balanced share, and spreads
	// the remainder over the other pods in proportion to their remaining share.
	OptTraffic Policy = "opttraffic"
	// LATA is the min-cost allocation under the load-balance constraint.
	LATA Policy = "lata"
	// LATAQ is load-aware LATA: instead of fixed equal shares, each callee pod with a service
	// rate μ costs its M/M/1 queueing delay, under a utilisation cap (see lataq.go).
	LATAQ Policy = "lata-q"
	// ClosedLoop is lata-q on measured capacities with the closed loop's guards (a step limit,
	// damping on lata-q's objective; see closedloop.go), delivered as latency bands with
	// least-request inside each.
	ClosedLoop Policy = "closed-loop"
)

// queued says whether p plans with lata-q's queueing model.
func (p Policy) queued() bool { return p == LATAQ || p == ClosedLoop }

// Policies lists the allocation policies in the order reports show them.
func Policies() []Policy {
	return []Policy{RoundRobin, Localization, OptTraffic, LATA, LATAQ, ClosedLoop}
}

// ParsePolicy returns the named allocation policy.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies() {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("optimizer: unknown policy %q (want one of round-robin, localization, opttraffic, lata, lata-q, closed-loop)", s)
}

// Allocation is the result of a policy: for every call edge, what fraction of each caller pod's
// requests goes to each callee pod.
type Allocation struct {
	Policy Policy `json:"policy" yaml:"policy"`
	// Cost is Σ rps × latency over all routes, in ms·req/s.
	Cost float64 `json:"cost" yaml:"cost"`
	// QueueCost is lata-q's queueing term at the allocation's pod loads ℓ: Σ 1000·ℓ/(μ−ℓ) over
	// the pods with a service rate μ, in ms·req/s (the M/M/1 delay times the rate, exact, not
	// linearised; lata-q minimises Cost plus its linearisation). Other policies leave it 0.
	QueueCost float64 `json:"queue_cost,omitempty" yaml:"queue_cost,omitempty"`
	// Saturated (lata-q) says, for each callee service whose load the utilisation cap cannot
	// hold, why: such a service is served as lata by capacity (each pod's share in proportion to
	// its capacity, every pod at the same utilisation: lata-q's saturated limit) and its
	// queueing term is left out of QueueCost.
	Saturated []string `json:"saturated,omitempty" yaml:"saturated,omitempty"`
	// ServedAsLATA (lata-q) says lata-q's own plan was no cheaper than lata's in its objective,
	// so these are lata's routes, with QueueCost at lata's loads.
	ServedAsLATA bool `json:"served_as_lata,omitempty" yaml:"served_as_lata,omitempty"`
	// Pooled (closed-loop) names the callee services whose load reached the utilisation cap of
	// their measured capacity: their callers balance least-request over all their pods, not
	// by the routes (which stay the plan's, for its accounting). See closedloop.go.
	Pooled []string         `json:"pooled,omitempty" yaml:"pooled,omitempty"`
	Calls  []CallAllocation `json:"calls" yaml:"calls"`
}

// CallAllocation is the allocation of one call edge. Routes are ordered by caller pod, then
// callee pod, in the topology's order; routes with zero flow are omitted, so every caller has at
// least one route and its fractions sum to 1.
type CallAllocation struct {
	From   string  `json:"from" yaml:"from"`
	To     string  `json:"to" yaml:"to"`
	Cost   float64 `json:"cost" yaml:"cost"`
	Routes []Route `json:"routes" yaml:"routes"`
}

// Route is the share of one caller pod's requests sent to one callee pod.
type Route struct {
	Caller    string  `json:"caller" yaml:"caller"`
	Callee    string  `json:"callee" yaml:"callee"`
	Fraction  float64 `json:"fraction" yaml:"fraction"`
	RPS       float64 `json:"rps" yaml:"rps"`
	LatencyMS float64 `json:"latency_ms" yaml:"latency_ms"`
}

// Call returns the allocation of the edge from → to, or nil.
func (a *Allocation) Call(from, to string) *CallAllocation {
	for i := range a.Calls {
		if a.Calls[i].From == from && a.Calls[i].To == to {
			return &a.Calls[i]
		}
	}
	return nil
}

// Fractions returns, per caller pod, its fraction to each callee pod.
func (c *CallAllocation) Fractions() map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for _, r := range c.Routes {
		if out[r.Caller] == nil {
			out[r.Caller] = map[string]float64{}
		}
		out[r.Caller][r.Callee] += r.Fraction
	}
	return out
}

// split is one caller's share to one callee pod (by index in the callee service).
type split struct {
	callee   int
	fraction float64
}

// buildCall turns per-caller splits into a CallAllocation with rps and cost, each caller pod
// sending its share of the caller service's load by weight.
func buildCall(m *Model, e CallEdge, splits [][]split) CallAllocation {
	return buildCallFrom(m, e, splits, nil)
}

// buildCallFrom is buildCall with each caller pod p receiving load[p] requests/s (lata-q,
// where upstream loads follow the plan, not the weights); load nil means by weight.
func buildCallFrom(m *Model, e CallEdge, splits [][]split, load []float64) CallAllocation {
	a, b := &m.Services[e.From], &m.Services[e.To]
	ca := CallAllocation{From: a.Name, To: b.Name}
	wa := a.TotalWeight()
	// Sized at once: at thousands of callers, growing the slice by doubling copied and
	// cleared several times its final size (most of a publication's solve time).
	routes := 0
	for _, row := range splits {
		for _, s := range row {
			if s.fraction > 0 {
				routes++
			}
		}
	}
	if routes > 0 {
		ca.Routes = make([]Route, 0, routes)
	}
	for p, row := range splits {
		caller := a.Pods[p]
		supply := a.Load * e.Rate * caller.Weight / wa
		if load != nil {
			supply = load[p] * e.Rate
		}
		sort.Slice(row, func(i, j int) bool { return row[i].callee < row[j].callee })
		for _, s := range row {
			if !(s.fraction > 0) {
				continue
			}
			callee := b.Pods[s.callee]
			lat := m.Latency.At(caller.Node, callee.Node)
			r := Route{Caller: caller.Name, Callee: callee.Name, Fraction: s.fraction, RPS: s.fraction * supply, LatencyMS: lat}
			ca.Cost += float64(r.RPS * lat) // never fused into one rounding: RoundRobinCost sums the same
			ca.Routes = append(ca.Routes, r)
		}
	}
	return ca
}
