package estimate

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
)

// The queue simulator of the bias tests: FCFS c-server queues with exponential service, in
// virtual time, producing the counters a scrape would read at each window's end.

// arrivalProcess is how requests arrive at the simulated pods.
type arrivalProcess int

const (
	// constantRate: one pod, arrivals exactly 1/λ apart (D/M/c).
	constantRate arrivalProcess = iota
	// roundRobin3: a Poisson stream of rate 3λ dealt round-robin over 3 pods, so each pod sees
	// Erlang-3 inter-arrival times of mean 1/λ (E₃/M/c).
	roundRobin3
	// poisson: one pod, Poisson arrivals of rate λ (M/M/c).
	poisson
)

func (a arrivalProcess) String() string {
	return [...]string{"constant", "round-robin/3", "poisson"}[a]
}

// pods is the number of pods the process feeds.
func (a arrivalProcess) pods() int {
	if a == roundRobin3 {
		return 3
	}
	return 1
}

// simCase is one simulated setting.
type simCase struct {
	servers      int     // c, the pod's cores
	serviceMS    float64 // mean CPU time of a request
	downstreamMS float64 // mean time a request then waits on a downstream call, holding no core
	arrivals     arrivalProcess
	rho          float64 // utilisation λ / (c·μ₁)
}

func (c simCase) String() string {
	return fmt.Sprintf("c=%d/s=%gms/%s/ρ=%g", c.servers, c.serviceMS, c.arrivals, c.rho)
}

// capacity is the true capacity of one pod, requests/s.
func (c simCase) capacity() float64 { return float64(c.servers) * 1000 / c.serviceMS }

// lambda is the arrival rate at one pod, requests/s.
func (c simCase) lambda() float64 { return c.rho * c.capacity() }

// simPod is one FCFS c-server queue with its counters per window.
type simPod struct {
	free   freeTimes // when each server is next free, a min-heap
	counts []Sample  // per window: completions, inbound and downstream time, CPU used in it
}

// freeTimes is a min-heap of times (container/heap).
type freeTimes []float64

func (h freeTimes) Len() int           { return len(h) }
func (h freeTimes) Less(i, j int) bool { return h[i] < h[j] }
func (h freeTimes) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *freeTimes) Push(x any)        { *h = append(*h, x.(float64)) }
func (h *freeTimes) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// serve takes one arrival at time a (seconds): it waits for the earliest free server, is
// served for an exponential time, then waits on its downstream call. Completions, their times,
// and the busy time of the servers are added to the windows of length w they fall in.
func (p *simPod) serve(rng *rand.Rand, c simCase, a, w float64) {
	start := max(a, p.free[0])
	finish := start + rng.ExpFloat64()*c.serviceMS/1000
	p.free[0] = finish
	heap.Fix(&p.free, 0)
	// CPU time: the cores are busy from start to finish, counted in the windows it overlaps, as
	// cAdvisor counts work in progress.
	for k := int(start / w); k < len(p.counts) && float64(k)*w < finish; k++ {
		p.counts[k].CPUSeconds += min(finish, float64(k+1)*w) - max(start, float64(k)*w)
	}
	down := rng.ExpFloat64() * c.downstreamMS / 1000
	done := finish + down
	if k := int(done / w); k < len(p.counts) {
		p.counts[k].Requests++
		p.counts[k].InboundMS += (done - a) * 1000
		p.counts[k].DownstreamMS += down * 1000
	}
}

// simulate runs case c for the given number of windows of w seconds and returns, per pod, the
// cumulative counters at the end of each window (index 0: at time 0, all zero). Requests still
// in flight at the end are not counted.
func simulate(rng *rand.Rand, c simCase, w float64, windows int) [][]Sample {
	n := c.arrivals.pods()
	pods := make([]simPod, n)
	for i := range pods {
		pods[i] = simPod{free: make(freeTimes, c.servers), counts: make([]Sample, windows)}
	}
	end := w * float64(windows)
	lambda := c.lambda()
	for t, i := 0.0, 0; ; i++ {
		switch c.arrivals {
		case constantRate:
			t = float64(i+1) / lambda
		case roundRobin3, poisson:
			t += rng.ExpFloat64() / (lambda * float64(n)) // the whole stream's rate
		}
		if t >= end {
			break
		}
		pods[i%n].serve(rng, c, t, w)
	}
	out := make([][]Sample, n)
	for i, p := range pods {
		cum := make([]Sample, windows+1)
		for k, d := range p.counts {
			cum[k+1] = Sample{
				Requests:     cum[k].Requests + d.Requests,
				InboundMS:    cum[k].InboundMS + d.InboundMS,
				DownstreamMS: cum[k].DownstreamMS + d.DownstreamMS,
				CPUSeconds:   cum[k].CPUSeconds + d.CPUSeconds,
			}
		}
		out[i] = cum
	}
	return out
}

// mm1Inversion is the plain M/M/1 inversion λ + 1/S of a pod's counters between windows i and
// j (requests/s), S the own time per request; NaN if S is not positive.
func mm1Inversion(cum []Sample, i, j int, w float64) float64 {
	req := cum[j].Requests - cum[i].Requests
	own := (cum[j].InboundMS - cum[i].InboundMS - (cum[j].DownstreamMS - cum[i].DownstreamMS)) / req / 1000
	if !(own > 0) {
		return math.NaN()
	}
	return req/(float64(j-i)*w) + 1/own
}
