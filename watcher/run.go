package watcher

import (
	"context"
	"sync"

	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

func (c *Live) poke() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// Run runs the sources and delivers merged topologies to l until ctx is done (then it returns
// nil, after every goroutine it started has ended), or until a source fails (its error).
func (c *Live) Run(ctx context.Context, l Listener) error {
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := c.cfg.Kube.Run(ctx, func(st *kube.State) {
			c.mu.Lock()
			c.kube = st
			c.mu.Unlock()
			c.poke()
		})
		if err != nil {
			cancel(err)
		}
	}()
	if c.cfg.Prom != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.cfg.Prom.Run(ctx, func(m *prom.Measurements) {
				c.mu.Lock()
				c.meas = m
				c.mu.Unlock()
				c.poke()
			})
			if err != nil {
				cancel(err)
			}
		}()
	}
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			if parent.Err() != nil {
				return nil // the caller stopped us (cancelled, or its deadline passed)
			}
			return context.Cause(ctx) // a source failed
		case <-c.changed:
		}
		c.mu.Lock()
		ks, meas, last := c.kube, c.meas, c.current
		c.mu.Unlock()
		if ks == nil {
			continue // never a half-built topology
		}
		t := c.Merge(ks, meas)
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
