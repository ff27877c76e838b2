package app

import (
	"fmt"
	"math"
	"time"
)

// NodeConfig describes the CPU of a (simulated) node.
type NodeConfig struct {
	// Name is the node's name, for error messages.
	Name string
	// Cores is the number of cores the node's pods share; 0 means unlimited (each pod is bound
	// by its own workers only, as without a NodeCPU).
	Cores int
	// Speed divides every service time on the node: 0.5 takes twice as long, 2 half as long;
	// 0 means 1. It is the world's hidden truth: nothing tells edgeflow.
	Speed float64
}

// NodeCPU is a node's cores, shared by the pods on it: a request holds one of its pod's workers
// and one of the node's cores for its service time (divided by the node's speed), so co-located
// pods contend for the node as they do on a real machine. Like workerQueue it schedules in
// virtual time, from arrival times, so the machine's timer lag stays out of capacity. Safe for
// concurrent use by any number of pods.
type NodeCPU struct {
	name   string
	speed  float64
	cores  *workerQueue // nil: unlimited
	remote *coreClient  // set: the node's cores are another process's (DialNodeCPU)
}

// NewNodeCPU validates cfg and returns the node's CPU.
func NewNodeCPU(cfg NodeConfig) (*NodeCPU, error) {
	speed := cfg.Speed
	if speed == 0 {
		speed = 1
	}
	switch {
	case cfg.Cores < 0:
		return nil, fmt.Errorf("app: node %s: cores must be ≥ 0, got %d", cfg.Name, cfg.Cores)
	case !(speed > 0) || math.IsInf(speed, 0):
		return nil, fmt.Errorf("app: node %s: speed must be positive and finite, got %v", cfg.Name, cfg.Speed)
	}
	n := &NodeCPU{name: cfg.Name, speed: speed}
	if cfg.Cores > 0 {
		n.cores = newWorkerQueue(cfg.Cores)
	}
	return n, nil
}

// Name returns the node's name.
func (n *NodeCPU) Name() string { return n.name }

// scale is the time a request of the given service time holds a core of the node.
func (n *NodeCPU) scale(service time.Duration) time.Duration {
	if n == nil || n.speed == 1 {
		return service
	}
	return time.Duration(float64(service) / n.speed)
}

// admit schedules a request of pod queue q arriving at arrival with the given (unscaled)
// service time on q's workers and, when n is not nil, n's cores: it starts at the latest of its
// arrival, the time one of q's workers frees and the time one of n's cores frees, and holds both
// for the service time divided by n's speed. It returns when the request starts and finishes;
// finish − start is the busy time. Lock order: q, then n.
//
// The core is chosen best fit: the core that freed last at or before the request's earliest
// start (its pod worker's free time), else the one that frees first. A request queued behind
// its pod's own worker thus takes the core its predecessor leaves, without reserving an idle
// core ahead of time that another pod could use now; with at least as many cores as the node's
// pods have workers, no request ever waits for a core (TestNodeCPUAmpleCoresChangeNothing).
// O(workers + cores).
func admit(q *workerQueue, n *NodeCPU, arrival time.Time, service time.Duration) (start, finish time.Time) {
	start, finish, _ = admitLimited(q, n, nil, arrival, service)
	return start, finish
}

// admitLimited is admit for a pod whose CPU is limited by quota (nil: not limited): once the
// request has its worker and core, it runs its scaled service time through the quota, and
// holds its worker until it is done, throttled periods included. It also returns the CPU time
// the request uses (its scaled service time, throttling excluded). The core stays held for the
// service time from its start: a throttled request's core is not given to another pod in the
// meantime (a limit binding on a node short of cores is not modelled).
func admitLimited(q *workerQueue, n *NodeCPU, quota *cpuQuota, arrival time.Time, service time.Duration) (start, finish time.Time, cpu time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.earliest()
	switch {
	case n == nil || (n.cores == nil && n.remote == nil):
		start = later(arrival, q.free[w])
		finish = start.Add(n.scale(service))
	case n.remote != nil:
		start, finish = n.remote.hold(later(arrival, q.free[w]), service)
	default:
		start, finish = n.hold(later(arrival, q.free[w]), service)
	}
	cpu = finish.Sub(start)
	if quota != nil {
		finish, _ = quota.run(start, cpu)
	}
	q.free[w] = finish
	return start, finish, cpu
}

// hold schedules a request that may start at earliest (its pod's worker is free) with the given
// (unscaled) service time on one of the node's cores, best fit (see admit), and returns when it
// starts and finishes. Safe for concurrent use.
func (n *NodeCPU) hold(earliest time.Time, service time.Duration) (start, finish time.Time) {
	service = n.scale(service)
	if n.cores == nil {
		return earliest, earliest.Add(service)
	}
	c := n.cores
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.bestFit(earliest)
	start = later(earliest, c.free[k])
	finish = start.Add(service)
	c.free[k] = finish
	return start, finish
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
