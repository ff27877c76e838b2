package app

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// DefaultCPUPeriod is the period of a pod's CPU limit: the kernel's CFS bandwidth period the
// kubelet sets (cpu.cfs_period_us, 100 ms).
const DefaultCPUPeriod = 100 * time.Millisecond

// cpuQuota is a pod's CPU limit as the kernel's CFS bandwidth control enforces a container's
// limits.cpu: in each period (aligned on the Unix epoch, as every period is the same length)
// the pod runs at most limit × period of CPU time over all its workers; work that would pass
// it waits, throttled, for the next period. A request is charged in the order it is admitted:
// from its start, each period gives it what is left of its budget (and of its wall time), until
// its work is done. Two requests that run at once thus share a period's budget as CFS's
// threads of one cgroup do, the total a period runs never passing it; what the model leaves
// out is which of the two is throttled first (here the later admitted). Safe for concurrent use.
//
// Light load is never throttled: a pod using less than its limit on average pays nothing until
// a burst within one period passes the budget. That is the bottleneck a shared core does not
// have: a hop costs its service time until the pod's limit binds, then the period's rest.
type cpuQuota struct {
	period, budget time.Duration

	mu   sync.Mutex
	used map[int64]time.Duration // CPU time charged, by period index (recent periods only)
	last int64                   // the latest period index charged
}

// newCPUQuota returns the quota of a limit in cores (> 0) per period (> 0).
func newCPUQuota(limit float64, period time.Duration) (*cpuQuota, error) {
	if !(limit > 0) || math.IsInf(limit, 0) {
		return nil, fmt.Errorf("CPU limit must be positive and finite, got %v", limit)
	}
	if period <= 0 {
		return nil, fmt.Errorf("CPU period must be positive, got %v", period)
	}
	budget := time.Duration(limit * float64(period))
	if budget <= 0 {
		return nil, fmt.Errorf("CPU limit %v × period %v is under a nanosecond", limit, period)
	}
	return &cpuQuota{period: period, budget: budget, used: map[int64]time.Duration{}}, nil
}

// run charges work of CPU time that may start at start and returns when it is done: work
// itself when the budget allows, later when it is throttled. It also returns the time it
// waited throttled. O(periods it spans).
func (c *cpuQuota) run(start time.Time, work time.Duration) (finish time.Time, throttled time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := start
	for work > 0 {
		k := t.UnixNano() / int64(c.period)
		end := time.Unix(0, (k+1)*int64(c.period))
		left := c.budget - c.used[k]
		if left <= 0 {
			throttled += end.Sub(t)
			t = end
			continue
		}
		d := min(work, left, end.Sub(t))
		c.used[k] += d
		c.last = max(c.last, k)
		work -= d
		t = t.Add(d)
	}
	if len(c.used) > 64 { // forget periods long past: requests start near the latest
		for k := range c.used {
			if k < c.last-32 {
				delete(c.used, k)
			}
		}
	}
	return t, throttled
}
