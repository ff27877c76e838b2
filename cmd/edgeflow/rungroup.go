package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"
)

// runGroup owns the goroutines of a long-running command (serve, rebalance): an errgroup whose
// goroutines are named. Each runs until the group's context ends; the first to fail ends it
// with its error, named; Wait returns once every goroutine has returned.
type runGroup struct {
	g    *errgroup.Group
	ctx  context.Context    // the errgroup's
	stop context.CancelFunc // ends it cleanly (its parent)
}

// newRunGroup returns a group whose context is a child of ctx.
func newRunGroup(ctx context.Context) (*runGroup, context.Context) {
	ctx, stop := context.WithCancel(ctx)
	g, ctx := errgroup.WithContext(ctx)
	return &runGroup{g: g, ctx: ctx, stop: stop}, ctx
}

// Go runs fn in the group; an error from it ends the group's context, naming it. An error
// returned once the group has ended (a clean stop, the parent's cancellation, another's
// failure) is not why it ended, and is dropped.
func (g *runGroup) Go(name string, fn func() error) {
	g.g.Go(func() error {
		if err := fn(); err != nil && g.ctx.Err() == nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

// Stop ends the group's context cleanly.
func (g *runGroup) Stop() { g.stop() }

// Fail ends the group's context with err, as a goroutine failing would (unless it has ended).
func (g *runGroup) Fail(err error) {
	g.g.Go(func() error {
		if g.ctx.Err() == nil {
			return err
		}
		return nil
	})
}

// Wait waits for every goroutine and returns why the group ended: nil after a clean stop or
// the parent context's cancellation, else the first failure.
func (g *runGroup) Wait() error {
	err := g.g.Wait()
	g.stop()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// ServeHTTP serves srv on l in the group, and shuts it down gracefully when the group ends.
func (g *runGroup) ServeHTTP(name string, srv *http.Server, l net.Listener) {
	g.Go(name, func() error {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(name+" shutdown", func() error {
		<-g.ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})
}
