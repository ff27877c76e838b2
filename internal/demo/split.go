package demo

import (
	"math"
	"sort"

	"github.com/edgeflow/edgeflow/optimizer"
)

// RouteCount is the number of requests one caller pod sent to one callee pod on a call edge.
type RouteCount struct {
	From, To       string // services
	Caller, Callee string // pods
	N              uint64
}

// Observed turns the arrivals counted between two snapshots (before may be nil) into per-route
// counts, ordered by call edge, caller and callee. Arrivals from pods the cluster does not know,
// and from outside the cluster, are left out.
func (c *Cluster) Observed(before, after Received) []RouteCount {
	var out []RouteCount
	for callee, byCaller := range after {
		for caller, n := range byCaller {
			n -= before[callee][caller]
			from, ok := c.podSvc[caller]
			if !ok || n == 0 {
				continue
			}
			out = append(out, RouteCount{From: from, To: c.podSvc[callee], Caller: caller, Callee: callee, N: n})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.From != b.From {
			return a.From < b.From
		}
		if a.To != b.To {
			return a.To < b.To
		}
		if a.Caller != b.Caller {
			return a.Caller < b.Caller
		}
		return a.Callee < b.Callee
	})
	return out
}

// Deviation is the largest difference between an observed and a planned route fraction.
type Deviation struct {
	// PP is |observed − planned| in percentage points; Planned and Observed are fractions.
	PP                float64
	Planned, Observed float64
	// Route names the worst route.
	From, To, Caller, Callee string
	// Requests is the number of observed requests the comparison rests on.
	Requests uint64
}

// SplitDeviation compares observed route counts with the planned allocation: for every caller
// pod that sent requests on a planned call edge, the fraction it sent to each callee pod against
// its planned fraction (0 for an unplanned route). It returns the largest difference; observed
// edges the allocation does not know count as planned 0.
//
// With n requests from a caller, sampling alone makes a route's fraction deviate by about
// √(f(1−f)/n); a weighted random pick (grpc-go's weighted_target) adds no more than that.
func SplitDeviation(plan *optimizer.Allocation, observed []RouteCount) Deviation {
	type key struct{ from, to, caller string }
	sent := map[key]uint64{}
	got := map[key]map[string]uint64{}
	for _, r := range observed {
		k := key{r.From, r.To, r.Caller}
		sent[k] += r.N
		if got[k] == nil {
			got[k] = map[string]uint64{}
		}
		got[k][r.Callee] += r.N
	}
	planned := map[key]map[string]float64{}
	for _, ca := range plan.Calls {
		for _, r := range ca.Routes {
			k := key{ca.From, ca.To, r.Caller}
			if planned[k] == nil {
				planned[k] = map[string]float64{}
			}
			planned[k][r.Callee] += r.Fraction
		}
	}
	var worst Deviation
	consider := func(k key, callee string, want float64) {
		n := sent[k]
		if n == 0 {
			return
		}
		obs := float64(got[k][callee]) / float64(n)
		if d := 100 * math.Abs(obs-want); d > worst.PP || worst.Requests == 0 {
			worst = Deviation{PP: d, Planned: want, Observed: obs, From: k.from, To: k.to, Caller: k.caller, Callee: callee, Requests: n}
		}
	}
	keys := make([]key, 0, len(sent))
	for k := range sent {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.from != b.from {
			return a.from < b.from
		}
		if a.to != b.to {
			return a.to < b.to
		}
		return a.caller < b.caller
	})
	for _, k := range keys {
		callees := map[string]bool{}
		for callee := range planned[k] {
			callees[callee] = true
		}
		for callee := range got[k] {
			callees[callee] = true
		}
		names := make([]string, 0, len(callees))
		for callee := range callees {
			names = append(names, callee)
		}
		sort.Strings(names)
		for _, callee := range names {
			consider(k, callee, planned[k][callee])
		}
	}
	return worst
}
