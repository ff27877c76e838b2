package istio

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/utils/clock"
)

// passLoop is how both reconcilers run: a pass after every wake-up, then every resync, and
// every retry while passes fail.
type passLoop struct {
	wake          <-chan struct{}
	clock         clock.WithTickerAndDelayedExecution
	resync, retry time.Duration
	log           *slog.Logger
	what          string // names the objects in the failure log line
	// pass makes one pass; ok false means there was nothing to do yet (no Update), and no
	// timer is set.
	pass func(context.Context) (ok bool, err error)
}

// run loops until ctx is done and then returns nil.
func (l passLoop) run(ctx context.Context) error {
	var timer clock.Timer
	stop := func() {
		if timer != nil {
			timer.Stop()
			timer = nil
		}
	}
	defer stop()
	for {
		var fire <-chan time.Time
		if timer != nil {
			fire = timer.C()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-l.wake:
		case <-fire:
			timer = nil
		}
		stop()
		ok, err := l.pass(ctx)
		if !ok {
			continue
		}
		wait := l.resync
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			l.log.Warn(l.what+" pass failed; retrying", "err", err, "retry_in", l.retry)
			wait = l.retry
		}
		timer = l.clock.NewTimer(wait)
	}
}

// wake signals a pass loop's wake channel (capacity 1) without blocking.
func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
