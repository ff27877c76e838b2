package watcher

import (
	"math"
	"sort"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

func (c *Live) staticCalls(t *optimizer.Topology, ignored map[string]int) ([]optimizer.Call, []optimizer.Ingress) {
	have := map[string]bool{}
	for i := range t.Services {
		have[t.Services[i].Key()] = true
	}
	var calls []optimizer.Call
	for _, cl := range c.cfg.CallGraph.Calls {
		cl.From, cl.To = optimizer.CanonicalKey(cl.From), optimizer.CanonicalKey(cl.To)
		if !have[cl.From] || !have[cl.To] {
			ignored[CallNoService]++
			continue
		}
		calls = append(calls, cl)
	}
	var ingress []optimizer.Ingress
	for _, in := range c.cfg.CallGraph.Ingress {
		in.Service = optimizer.CanonicalKey(in.Service)
		if !have[in.Service] {
			ignored[CallNoService]++
			continue
		}
		ingress = append(ingress, in)
	}
	return calls, ingress
}

// measuredCalls maps workload rates to service calls. A workload backing several services
// calls as the first of them (by key) and is called as each, the rate split equally.
//
// Calls that would close a cycle are dropped before the rates are taken, and Λ(a) is the rate
// measured into a over the calls kept (plus its ingress), so that in the compiled topology
// every call kept carries its measured rate: Λ(a)·r(a→b) = R(a→b).
func measuredCalls(ks *kube.State, rates []prom.CallRate, ignored map[string]int) ([]optimizer.Call, []optimizer.Ingress) {
	type edge struct{ from, to string }
	rps := map[edge]float64{}
	ext := map[string]float64{} // service → rate into it from workloads backing no service
	for _, r := range rates {
		callees := ks.Workloads[kube.Workload{Name: r.To.Name, Namespace: r.To.Namespace}]
		if len(callees) == 0 {
			ignored[CallUnmanaged]++
			continue
		}
		callers := ks.Workloads[kube.Workload{Name: r.From.Name, Namespace: r.From.Namespace}]
		share := r.RPS / float64(len(callees))
		for _, to := range callees {
			switch {
			case len(callers) == 0:
				ext[to] += share
			case callers[0] == to:
				ignored[CallCycle]++
			default:
				rps[edge{callers[0], to}] += share
			}
		}
	}
	calls := make([]optimizer.Call, 0, len(rps))
	for e := range rps {
		calls = append(calls, optimizer.Call{From: e.from, To: e.to})
	}
	sort.Slice(calls, func(i, j int) bool {
		if calls[i].From != calls[j].From {
			return calls[i].From < calls[j].From
		}
		return calls[i].To < calls[j].To
	})
	calls = dropCycles(calls, ignored)
	in := map[string]float64{} // service → measured rate into it over ingress and the calls kept
	out := map[string]float64{}
	for s, r := range ext {
		in[s] += r
	}
	for _, cl := range calls {
		r := rps[edge{cl.From, cl.To}]
		in[cl.To] += r
		out[cl.From] = math.Max(out[cl.From], r)
	}
	for i := range calls {
		from := calls[i].From
		load := in[from]
		if load <= 0 { // a caller with no measured inbound load: its calls are its own ingress
			load = out[from]
			ext[from] = math.Max(ext[from], load)
		}
		rate := 0.0 // every call from a caller without load was measured at zero
		if load > 0 {
			rate = rps[edge{from, calls[i].To}] / load
		}
		calls[i].Rate = &rate
	}
	var ingress []optimizer.Ingress
	for s, r := range ext {
		ingress = append(ingress, optimizer.Ingress{Service: s, RPS: r})
	}
	sort.Slice(ingress, func(i, j int) bool { return ingress[i].Service < ingress[j].Service })
	return calls, ingress
}

// dropCycles keeps the calls in order, leaving out each one that would close a cycle.
func dropCycles(calls []optimizer.Call, ignored map[string]int) []optimizer.Call {
	out := map[string][]string{}
	reaches := func(from, to string) bool { // is there a path from → … → to?
		seen := map[string]bool{}
		stack := []string{from}
		for len(stack) > 0 {
			s := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if s == to {
				return true
			}
			if seen[s] {
				continue
			}
			seen[s] = true
			stack = append(stack, out[s]...)
		}
		return false
	}
	var kept []optimizer.Call
	for _, c := range calls {
		if c.From == c.To || reaches(c.To, c.From) {
			ignored[CallCycle]++
			continue
		}
		out[c.From] = append(out[c.From], c.To)
		kept = append(kept, c)
	}
	return kept
}
