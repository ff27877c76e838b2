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
	w := 0
	for i := range q.free {
		if q.free[i].Before(q.free[w]) {
			w = i
		}
	}
	start = arrival
	if q.free[w].After(start) {
		start = q.free[w]
	}
	finish = start.Add(service)
	q.free[w] = finish
	return start, finish
}
