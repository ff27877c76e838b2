package optimizer

import "math"

// PredictedOwnTimeMS is lata-q's prediction of each service's own time per request under the
// allocation a, in milliseconds, by service key (Service.Key): the request-weighted mean over
// the service's pods of the sojourn time of a pod as c servers (M/M/c, MMcSojourn) of μ_q/c
// each at load ℓ_q, where μ_q is the pod's service rate in t (its capacity_rps, else its
// service's times its weight, as Compile reads them), ℓ_q its planned load — its share by
// weight of the service's ingress (lata-q's background load) plus the requests/s a's routes
// send it — and c = Servers(service): for c = 1, M/M/1's 1000/(μ_q − ℓ_q); a pod with a CPU
// limit (Service.CPULimit) takes lata-q's quota model instead (podQueue). It is what the
// closed loop's model-error breaker compares with the measured own time
// (watcher/estimate.Breaker). lata-q plans every pod as one M/M/1 server of rate μ_q; a pod
// that works each request on one of c cores takes c/μ_q per request, which the M/M/1 sojourn
// at low load (1/μ_q) under-predicts c-fold, and the breaker would trip on the service-time
// term, which no routing changes: the prediction counts it.
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
		var load, sojourns float64 // Σ ℓ_q, Σ ℓ_q·sojourn_q in ms
		ok := len(s.Pods) > 0
		c := Servers(s)
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
			if s.CPULimit > 0 {
				sojourns += l * 1000 * newPodQueue(mu, s.CPULimit, s.QueueScale).sojourn(l) // lata-q's quota model
				continue
			}
			sojourns += l * 1000 * MMcSojourn(l, mu/float64(c), c)
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

// Servers is the number of requests a pod of s is taken to work on at once in
// PredictedOwnTimeMS: its CPU request in cores (Service.CPU, millicores) rounded to the nearest
// whole core, at least 1. Rounded, not ⌈⌉ as the estimator's queueing bound takes the
// application's cores: the topology's request may include a sidecar's (0.1 core in Istio's
// default), which must not make a one-core pod two servers.
func Servers(s *Service) int {
	return max(1, int(math.Round(float64(s.CPU)/1000)))
}
