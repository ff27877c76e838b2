package app

import (
	"sync"
	"time"
)

// workerQueue schedules a pod's requests first-come first-served over its workers in virtual
// time: a request arriving at t starts at t or when the earliest worker frees, whichever is
// later, and holds that worker for its service time. The caller then sleeps until the computed
// start and finish times.
//
// Computing the schedule from arrival times, rather than holding a worker token while asleep,
// keeps the machine's timer wake-up lag out of the pod's capacity: on a busy machine a late
// wake-up delays that one response, instead of lengthening every service time and with it the
// queue behind it (which, at 60 % utilisation, turns a few hundred µs of lag per request into
// tens of ms of queueing). The queue is exact M/M/c (or G/G/c) FCFS on the arrival times.
//
// A request cancelled before it finishes keeps its worker until its scheduled finish, as in a
// server that notices a cancelled request only when it gets to it.
type workerQueue struct {
	mu   sync.Mutex
	free []time.Time // when each worker is next free
}

func newWorkerQueue(workers int) *workerQueue {
	return &workerQueue{free: make([]time.Time, workers)}
}

// admit schedules a request arriving at arrival with the given service time and returns when it
// starts and finishes. Safe for concurrent use; O(workers).
func (q *workerQueue) admit(arrival time.Time, service time.Duration) (start, finish time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.earliest()
	start = later(arrival, q.free[w])
	finish = start.Add(service)
	q.free[w] = finish
	return start, finish
}

// earliest returns the worker that frees first (the first of equals). The caller holds q.mu.
func (q *workerQueue) earliest() int {
	w := 0
	for i := range q.free {
		if q.free[i].Before(q.free[w]) {
			w = i
		}
	}
	return w
}

// bestFit returns the worker that freed last at or before t, else the one that frees first.
// The caller holds q.mu.
func (q *workerQueue) bestFit(t time.Time) int {
	fit := -1
	for i, f := range q.free {
		if !f.After(t) && (fit < 0 || f.After(q.free[fit])) {
			fit = i
		}
	}
	if fit < 0 {
		return q.earliest()
	}
	return fit
}
