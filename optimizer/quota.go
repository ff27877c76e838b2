package optimizer

import "math"

// CFSPeriod is the period of a CPU limit, in seconds: the kernel's CFS bandwidth period that the
// kubelet gives a container with limits.cpu (cpu.cfs_period_us, 100 ms unless the kubelet's
// cpuCFSQuotaPeriod changes it).
const CFSPeriod = 0.1

// maxQuotaSlots bounds a CPU-limited pod's slots (podQueue): beyond a thousand requests a
// period, Erlang's C is 0 to within float precision below lata-q's utilisation cap, and the
// recursion costs O(slots) a point.
const maxQuotaSlots = 1000

// podQueue is the queueing model lata-q prices a pod with a service rate by.
//
// A pod without a CPU limit is one M/M/1 server of rate μ (its capacity): it adds
// 1000·ℓ/(μ−ℓ) ms·req/s at load ℓ, the model of lata-q since it was written.
//
// A pod with a CPU limit (Service.CPULimit) is different, and M/M/1 prices it badly: its
// capacity is the limit's (μ = limit / CPU per request by the utilisation law, when the limit
// is the request the capacity is measured against, as in Kubernetes' Guaranteed QoS), but a
// request runs at full speed, s = limit/μ seconds of CPU, until the period's quota is spent;
// then it waits, throttled, for the next period. So the pod pays s and nothing more while the
// requests of a period fit its quota, and a wall near μ. M/M/1 at μ charges 1/μ (ten times
// s for a 100m pod) from the first request, and charges a load of half μ as much again, so
// lata-q moves calls across nodes to spread load that costs nothing. The model: the pod serves
// c = ⌊μ·CFSPeriod⌋ requests a period, and a request waits as it would for one of c servers
// of rate μ/c (M/M/c's Erlang-C wait), so its sojourn is s + C(c, ℓc/μ)/(μ−ℓ): flat at low load,
// steep near μ. Against a simulation of the quota (internal/demo/app's cpuQuota in virtual
// time, TestQuotaModelBoundsTheQuota: a 100m pod, 1.1 ms of CPU a request, 2 workers, Poisson
// arrivals, 60,000 requests a load) its mean is at or above the simulated one at every load
// from 10 to 90 % of μ (0.36: 1.21 vs 1.13 ms; 0.60: 4.4 vs 1.7; 0.74: 14.3 vs 3.3; 0.90: 76 vs
// 21), where M/M/1 says 17, 28, 42 and 110 ms: an upper bound with the quota's shape, 2.5–4.4×
// too high between 60 and 90 % of μ.
//
// Being a bound, the wait is priced at a share of itself where the closed loop has measured less
// (Service.QueueScale, the WaitScaler's Σ measured / Σ predicted wait, in (0, 1]): s + κ·wait.
// κ scales the wait at every load alike, so the model keeps its shape (convex, the wall at μ)
// and the plan its cap.
type podQueue struct {
	mu    float64 // the service rate, requests/s
	slots int     // 0: M/M/1; else c, the requests a CFS period serves
	cpu   float64 // s, the CPU seconds of a request (slots > 0)
	scale float64 // κ, the share of the wait priced (slots > 0)
}

// queueOf is lata-q's model of pod p of s.
func (s *ServiceModel) queueOf(p PodRef) podQueue {
	return newPodQueue(p.CapacityRPS, s.CPULimit, s.QueueScale)
}

// newPodQueue is the model of a pod of service rate mu (requests/s), CPU limit limit
// (millicores; 0: none) and wait scale scale (in (0, 1]; otherwise 1).
func newPodQueue(mu float64, limit int64, scale float64) podQueue {
	if limit <= 0 || !(mu > 0) {
		return podQueue{mu: mu}
	}
	if !(scale > 0 && scale <= 1) {
		scale = 1
	}
	return podQueue{mu: mu, slots: int(min(maxQuotaSlots, max(1, math.Floor(mu*CFSPeriod)))), cpu: float64(limit) / 1000 / mu, scale: scale}
}

// sojourn is the mean time (seconds) a request spends in the pod at load l: +Inf at or past μ.
func (q podQueue) sojourn(l float64) float64 {
	if l >= q.mu {
		return math.Inf(1)
	}
	if q.slots == 0 {
		return 1 / (q.mu - l)
	}
	return q.cpu + q.scale*q.wait(l)
}

// wait is the quota model's wait at load l below μ, unscaled: Erlang C's wait alone.
func (q podQueue) wait(l float64) float64 {
	c := float64(q.slots)
	return max(MMcSojourn(l, q.mu/c, q.slots)-c/q.mu, 0)
}

// cost is the pod's term in lata-q's objective, 1000·ℓ·sojourn(ℓ) ms·req/s.
func (q podQueue) cost(l float64) float64 {
	if q.slots == 0 {
		return queueCost(l, q.mu)
	}
	return 1000 * l * q.sojourn(l)
}

// QuotaSojourn is the mean time in seconds a request spends in a pod of service rate mu
// (requests/s) with a CPU limit of limit millicores at load l, as lata-q prices it (podQueue's
// quota model, its whole wait; +Inf at or past mu). With limit 0 it is M/M/1's 1/(mu − l).
func QuotaSojourn(l, mu float64, limit int64) float64 { return newPodQueue(mu, limit, 1).sojourn(l) }

// QuotaWait is the quota model's wait in seconds (its sojourn less the CPU a request takes,
// limit/mu) in a pod of service rate mu and CPU limit limit millicores (> 0) at load l: the
// share of it lata-q prices is Service.QueueScale. +Inf at or past mu.
func QuotaWait(l, mu float64, limit int64) float64 {
	q := newPodQueue(mu, limit, 1)
	if l >= mu {
		return math.Inf(1)
	}
	if q.slots == 0 {
		return q.sojourn(l) - 1/mu
	}
	return q.wait(l)
}
