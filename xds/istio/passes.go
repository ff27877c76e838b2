package istio

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// passKey is the one key of a pass loop's queue: every pass re-reads the latest topology, so a
// wake-up, a retry and a resync all ask for the same work and merge in the queue.
type passKey struct{}

// passLoop is how both reconcilers run: a pass after every wake-up, then every resync after a
// pass that succeeded, and every retry after one that failed. It is a client-go workqueue of
// one key (passKey): wake is Add, the resync is Forget and AddAfter(resync), the retry is
// AddRateLimited with a limiter whose base and maximum delay are both retry (a fixed delay,
// as before the queue), and run's end is ShutDown.
//
// A wake-up does not cancel a resync or retry already pending (a workqueue cannot take an
// item back): that pass still runs when due, one more level-triggered pass that finds
// nothing to change, as a controller-runtime RequeueAfter does.
//
// The queue is made by each run and shut down when it returns (a workqueue starts goroutines
// and cannot restart), so a serve replica that leads several terms gets a fresh one each
// term. wake and run are safe to call concurrently; runs must not overlap.
type passLoop struct {
	clock         clock.WithTicker
	resync, retry time.Duration
	log           *slog.Logger
	what          string // names the objects in the failure log line
	owner         string // names the reconciler in the overlapping-run error
	// passed, when set (tests), is called after each pass with its ok.
	passed func(ok bool)

	mu    sync.Mutex
	queue workqueue.TypedRateLimitingInterface[passKey] // the running loop's; nil while none runs
}

// wake asks the running loop (if any) for a pass; it never blocks on the pass. With no run,
// it does nothing: the next run makes a pass at once.
func (l *passLoop) wake() {
	l.mu.Lock()
	q := l.queue
	l.mu.Unlock()
	if q != nil {
		q.Add(passKey{}) // a no-op once q is shut down
	}
}

// run makes a pass at once, then after every wake, resync and retry, until ctx is done; it
// then returns nil. pass makes one pass; ok false means there was nothing to do yet (no
// Update), and neither a resync nor a retry is scheduled. run fails at once if another run of
// l is running.
func (l *passLoop) run(ctx context.Context, pass func(context.Context) (ok bool, err error)) error {
	q, err := l.start()
	if err != nil {
		return err
	}
	defer l.stop(q)
	stopAfter := context.AfterFunc(ctx, q.ShutDown)
	defer stopAfter()
	q.Add(passKey{}) // a topology recorded while no run ran is reconciled at once
	for {
		key, shutdown := q.Get()
		if shutdown || ctx.Err() != nil { // ShutDown still hands out what was queued
			return nil
		}
		ok, err := pass(ctx)
		switch {
		case !ok:
		case err == nil:
			q.Forget(key)
			q.AddAfter(key, l.resync)
		case ctx.Err() != nil:
			q.Done(key)
			return nil
		default:
			l.log.Warn(l.what+" pass failed; retrying", "err", err, "retry_in", l.retry)
			q.AddRateLimited(key)
		}
		q.Done(key)
		if l.passed != nil {
			l.passed(ok)
		}
	}
}

// start makes the run's queue and publishes it to wake.
func (l *passLoop) start() (workqueue.TypedRateLimitingInterface[passKey], error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.queue != nil {
		return nil, fmt.Errorf("xds/istio: %s.Run called while another Run runs", l.owner)
	}
	// Unnamed: no workqueue metrics (edgeflow installs no workqueue metrics provider).
	l.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[passKey](l.retry, l.retry),
		workqueue.TypedRateLimitingQueueConfig[passKey]{Clock: l.clock})
	return l.queue, nil
}

// stop withdraws q from wake and shuts it down.
func (l *passLoop) stop(q workqueue.TypedRateLimitingInterface[passKey]) {
	l.mu.Lock()
	l.queue = nil
	l.mu.Unlock()
	q.ShutDown()
}
