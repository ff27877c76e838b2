package optimizer

import "math"

// PredictedOwnTimeMS is lata-q's prediction of each service's own time per request under the
// allocation a, in milliseconds, by service key (Service.Key): the request-weighted mean over
// the service's pods of the M/M/1 sojourn 1000/(μ_q − ℓ_q), where μ_q is the pod's service rate
// in t (its capacity_rps, else its service's times its weight, as Compile reads them) and ℓ_q
// its planned load: its share by weight of the service's ingress (lata-q's background load)
// plus the requests/s a's routes send it. It is what the closed loop's model-error breaker
// compares with the measured own time (watcher/estimate.Breaker).
//
// A service is left out when a pod of it has no valid service rate, when its pods have no
// planned load, or when a pod is planned at or beyond its service rate (no finite sojourn).
// Routes to pods t does not list are ignored; a nil a plans only the ingress. Pure: it writes
// neither input. O(pods + routes).
func PredictedOwnTimeMS(t *Topology, a *Allocation) map[string]float64 {
	into := map[string]float64{} // pod key → requests/s the routes send it
	if a != nil {
		for _, c := range a.Calls {
			for _, r := range c.Routes {
				into[r.Callee] += r.RPS
			}
		}
	}
	ingress := map[string]float64{} // service key → requests/s from outside
	for _, in := range t.Ingress {
		ingress[CanonicalKey(in.Service)] += in.RPS
	}
	out := map[string]float64{}
	for i := range t.Services {
		s := &t.Services[i]
		var weight float64
		for _, p := range s.Pods {
			weight += p.CapacityWeight()
		}
		var load, sojourns float64 // Σ ℓ_q, Σ ℓ_q·1000/(μ_q − ℓ_q)
		ok := len(s.Pods) > 0
		for j := range s.Pods {
			p := &s.Pods[j]
			mu := serviceRate(s, p)
			l := into[s.PodKey(p)]
			if weight > 0 {
				l += ingress[s.Key()] * p.CapacityWeight() / weight
			}
			if !(mu > 0) || math.IsInf(mu, 0) || l >= mu {
				ok = false
				break
			}
			load += l
			sojourns += l * 1000 / (mu - l)
		}
		if ok && load > 0 && !math.IsInf(sojourns, 0) {
			out[s.Key()] = sojourns / load
		}
	}
	return out
}

// serviceRate is a pod's service rate μ as Compile reads it: its own capacity_rps, else its
// service's times its weight; 0 when neither is given.
func serviceRate(s *Service, p *Pod) float64 {
	switch {
	case p.CapacityRPS != nil:
		return *p.CapacityRPS
	case s.CapacityRPS != nil:
		return *s.CapacityRPS * p.CapacityWeight()
	}
	return 0
}
