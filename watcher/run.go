package watcher

import (
	"context"
	"time"

	"golang.org/x/sync/errgroup"
)

// keepLatest is a source's callback: it keeps what the source delivered in *latest (under
// c.mu), replacing what was there, and tells the merge loop (deliver) without waiting: one
// pending signal stands for any number of changes.
func keepLatest[T any](c *Live, latest **T) func(*T) {
	return func(v *T) {
		c.mu.Lock()
		*latest = v
		c.mu.Unlock()
		c.changed.Notify()
	}
}

// Run runs the sources and delivers merged topologies to l until ctx is done (then it returns
// nil, after every goroutine it started has ended), or until a source fails (its error, after
// the other source and the merge loop ended).
//
// The sources run in an errgroup (errgroup.WithContext): the first to fail cancels the group's
// context, which ends the other source and the merge loop; Wait returns that first error. A
// source that returns nil cancels nothing.
func (c *Live) Run(ctx context.Context, l Listener) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return c.cfg.Kube.Run(gctx, keepLatest(c, &c.kube))
	})
	if c.cfg.Prom != nil {
		history := c.capacity != nil && c.cfg.CapacityHistoryWindows > 0
		if history {
			c.mu.Lock()
			c.history.reading = true
			c.mu.Unlock()
		}
		g.Go(func() error {
			if history {
				c.readHistory(gctx)
			}
			return c.cfg.Prom.Run(gctx, keepLatest(c, &c.meas))
		})
		if c.cfg.FirstRoundWait > 0 {
			c.mu.Lock()
			c.awaiting = true
			c.mu.Unlock()
			g.Go(func() error {
				c.awaitFirstRound(gctx)
				return nil
			})
		}
	}
	c.deliver(gctx, l)
	stopped := ctx.Err() != nil // the caller stopped us (cancelled, or its deadline passed)
	err := g.Wait()
	if stopped {
		return nil // whatever a source returned as it stopped
	}
	return err // a source failed
}

// readHistory reads Prometheus's history of pod load for the capacity feed
// (LiveConfig.CapacityHistoryWindows) and hands it to deliver. It runs on the Prometheus
// source's goroutine before its Run, as LoadHistory requires; a failure is logged and leaves
// no history (it is best effort).
func (c *Live) readHistory(ctx context.Context) {
	windows, err := c.cfg.Prom.LoadHistory(ctx, c.cfg.CapacityHistoryWindows)
	if err != nil {
		c.log.Warn("watcher: no history of pod load for the capacity estimator", "error", err)
	}
	c.mu.Lock()
	c.history = historyRead{read: true, windows: windows}
	c.mu.Unlock()
	c.changed.Notify()
}

// awaitFirstRound lets deliver go on once Prometheus's first round has ended, or
// FirstRoundWait after it was called (Run's start), or when ctx is done.
func (c *Live) awaitFirstRound(ctx context.Context) {
	timer := time.NewTimer(c.cfg.FirstRoundWait)
	defer timer.Stop()
	select {
	case <-c.cfg.Prom.FirstRound():
	case <-timer.C:
		c.log.Warn("watcher: no answer from Prometheus yet; delivering the topology without measurements until one comes", "waited", c.cfg.FirstRoundWait)
	case <-ctx.Done():
		return
	}
	c.mu.Lock()
	c.awaiting = false
	c.mu.Unlock()
	c.changed.Notify()
}

// deliver merges the latest inputs on each change and delivers what differs from the last
// topology delivered, until ctx is done. The first time it has a Kubernetes state it first
// feeds the capacity feed Prometheus's history of pod load (waiting for it while it is read).
// Run's only; it alone uses c.compiler.
func (c *Live) deliver(ctx context.Context, l Listener) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.changed.C():
		}
		c.mu.Lock()
		ks, meas, last, history := c.kube, c.meas, c.current, c.history
		// Never a half-built topology; the history of pod load and Prometheus's first answer first.
		ready := ks != nil && !history.reading && !c.awaiting
		if ready && history.read {
			c.history = historyRead{}
		}
		c.mu.Unlock()
		if !ready {
			continue
		}
		if history.read {
			c.feedHistory(ks, history.windows)
		}
		merged := c.mergeFed(ks, meas)
		if history.read {
			c.feedLatencyHistory(ks, history.windows, merged)
		}
		t := c.correctLatency(ks, meas, merged)
		// Compiled once, here, with the consumers' options: the compile validates it, says
		// whether anything changed, and is published for the Planners downstream.
		cm, err := c.compiler.Compile(t)
		if err == nil && last != nil && !cm.Changed {
			continue
		}
		if err == nil && c.cfg.Check != nil {
			err = c.cfg.Check(t)
		}
		if err != nil {
			c.rejected.Inc()
			c.log.Error("watcher: merged cluster topology rejected; keeping the last good one", "error", err)
			continue
		}
		c.mu.Lock()
		c.current = t
		c.mu.Unlock()
		c.delivered.Inc()
		Deliver(l, t, cm)
	}
}
