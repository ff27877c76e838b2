package rebalancer

import (
	"math"

	"github.com/edgeflow/edgeflow/optimizer"
)

// Rate-aware planning. A placement planned at one offered rate can be wrong at another: the
// queueing part of the cost and the nodes' planned utilisation grow with the load. So besides
// every Period the controller plans again as soon as the offered rate — Σ of the topology's
// ingress rates, measured by the watcher when the call graph is measured — differs from the
// rate its last plan was made at by more than Config.RateChange (relative), looked at every
// Config.RateCheck. The reference is the rate of the last plan, whatever started it, so a rate
// that wanders within the band never re-plans, a step out of it re-plans once, and drift
// re-plans once it has added up to the band. The plan then runs as any other: its threshold,
// move limits, minimum age and cool-downs hold.

// offeredRate is Σ of the topology's ingress rates, in requests/s.
func offeredRate(t *optimizer.Topology) float64 {
	var r float64
	for _, in := range t.Ingress {
		r += in.RPS
	}
	return r
}

// rateMoved says whether the offered rate now differs from ref, the rate of the last plan, by
// more than the fraction change of ref (change < 0: never; ref 0: any rate at all).
func rateMoved(ref, now, change float64) bool {
	switch {
	case change < 0 || math.IsNaN(now):
		return false
	case ref <= 0:
		return now > 0
	}
	return math.Abs(now-ref) > change*ref
}

// rateChanged says whether the current topology's offered rate moved out of the band around
// the last plan's (false before any plan or topology).
func (c *Controller) rateChanged() (ref, now float64, moved bool) {
	t := c.cfg.Topology()
	if t == nil {
		return 0, 0, false
	}
	c.mu.Lock()
	ref, planned := c.plannedRate, c.ratePlanned
	c.mu.Unlock()
	now = offeredRate(t)
	return ref, now, planned && rateMoved(ref, now, c.cfg.RateChange)
}
