package reproduce

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
)

// The intervals on relative claims: a percentile bootstrap over runs.
//
// A claim "x vs base at a cell = −N %" is the change of x's pooled statistic (P99, P65 or the
// mean) against base's. Its interval resamples runs, not requests: within a slice the requests
// queue behind one another (their latencies are strongly correlated), and between slices the
// shared machine's load drifts, so the run is the unit that varies independently; resampling
// requests would treat thousands of correlated latencies as independent and give intervals far
// too narrow. When the two rows' runs took turns in the same rounds (Runs.Round equal, run by
// run) a resample draws round indices and takes both rows' runs of each drawn round (paired:
// the drift they shared cancels); otherwise each row's runs are drawn apart (unpaired). Each
// resample pools the drawn runs' samples (with multiplicity) and computes the statistic as the
// point estimate does. The interval is the 2.5th and 97.5th nearest-rank percentiles of
// BootstrapResamples changes. The random stream is PCG seeded with (BootstrapSeed, FNV-64a of
// the comparison's key), so an interval does not depend on the order claims are computed in.
// With 5 runs the bootstrap has few distinct resamples and its intervals are too narrow more
// often than 5 % of the time; the report says so.
const (
	BootstrapSeed      uint64  = 20261205
	BootstrapResamples int     = 2000
	Confidence         float64 = 0.95
)

// change is one cell's relative claim: x's statistic against base's, in percent.
type change struct {
	// Key names the comparison (app/scenario/rate x vs base metric); it seeds the bootstrap.
	Key string
	// Point is the change of the pooled statistics; Lo and Hi the bootstrap interval. With
	// censoring (BaseAtLeast: base's statistic is a lower bound, so the true change is at most
	// Point) Lo is −100; with XAtLeast (x's is a lower bound) Hi is unbounded (HiOpen).
	Point, Lo, Hi         float64
	HiOpen                bool
	XAtLeast, BaseAtLeast bool
	Paired                bool
	Runs                  [2]int // x's and base's
	// Collapse: either row's cell collapsed (Stats.Collapse).
	Collapse bool
	// Why, when not empty, says why there is no figure (Point, Lo, Hi are then meaningless).
	Why string
}

// metric is a statistic of runs taken with multiplicities (nil: once each), in ticks, and
// whether it is a lower bound.
type metric struct {
	name string
	of   func(runs []runData, mult []int, timeout int64) (float64, bool)
}

func quantileMetric(name string, q float64) metric {
	return metric{name, func(runs []runData, mult []int, timeout int64) (float64, bool) {
		v, at := quantile(runs, mult, q, timeout)
		return float64(v), at
	}}
}

var (
	metricP99  = quantileMetric("P99", 0.99)
	metricP65  = quantileMetric("P65", 0.65)
	metricMean = metric{"mean", meanOf}
)

// roundOf is the round run i of r ran in: r.Round[i] when recorded, else as Run orders them
// (a rate's runs take turns among the default-placement rows, then, after the rebalancer, among
// the LARP rows), "app/scenario/rate placement run".
func roundOf(r *Runs, i int) string {
	if i < len(r.Round) && r.Round[i] != "" {
		return r.Round[i]
	}
	block := "scheduler"
	if j := slices.IndexFunc(Policies, func(p Policy) bool { return p.Name == r.Policy }); j < 0 {
		block = r.Policy
	} else if Policies[j].LARP {
		block = "rebalanced"
	}
	return fmt.Sprintf("%s/%s/%g %s %d", r.App, r.Scenario, r.RPS, block, i+1)
}

// paired says whether x's and base's runs took turns in the same rounds, run by run.
func paired(x, base *Runs) bool {
	if len(x.Results) != len(base.Results) {
		return false
	}
	for i := range x.Results {
		if roundOf(x, i) != roundOf(base, i) {
			return false
		}
	}
	return true
}

// compare computes the change of x's m against base's with its bootstrap interval.
func (o *Outcome) compare(key string, x, base *Runs, m metric) change {
	c := change{Key: key, Runs: [2]int{len(x.Results), len(base.Results)}, Paired: paired(x, base),
		Collapse: o.stats(x).Collapse() || o.stats(base).Collapse()}
	xd, bd, to := data(x), data(base), o.timeoutTicks()
	vx, ax := m.of(xd, nil, to)
	vb, ab := m.of(bd, nil, to)
	c.XAtLeast, c.BaseAtLeast = ax, ab
	switch {
	case ax && ab:
		c.Why = "both ≥ the timeout"
		return c
	case vb == 0:
		c.Why = "no base samples"
		return c
	case len(xd) < 2 || len(bd) < 2:
		c.Why = fmt.Sprintf("%d and %d runs: no interval", len(xd), len(bd))
		return c
	}
	c.Point = pct(vx, vb)
	h := fnv.New64a()
	h.Write([]byte(key))
	rng := rand.New(rand.NewPCG(BootstrapSeed, h.Sum64()))
	vals := make([]float64, 0, BootstrapResamples)
	mx, mb := make([]int, len(xd)), make([]int, len(bd))
	for range BootstrapResamples {
		clear(mx)
		clear(mb)
		if c.Paired {
			for range len(xd) {
				i := rng.IntN(len(xd))
				mx[i]++
				mb[i]++
			}
		} else {
			for range len(xd) {
				mx[rng.IntN(len(xd))]++
			}
			for range len(bd) {
				mb[rng.IntN(len(bd))]++
			}
		}
		sx, _ := m.of(xd, mx, to)
		sb, _ := m.of(bd, mb, to)
		if sb > 0 {
			vals = append(vals, pct(sx, sb))
		}
	}
	if len(vals) == 0 {
		c.Why = "no resample with base samples"
		return c
	}
	slices.Sort(vals)
	alpha := (1 - Confidence) / 2
	c.Lo, c.Hi = vals[rankOf(alpha, len(vals))-1], vals[rankOf(1-alpha, len(vals))-1]
	if ab {
		c.Lo = -100
	}
	if ax {
		c.HiOpen = true
	}
	return c
}
