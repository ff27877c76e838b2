package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// runGroup owns the goroutines of a long-running command (serve, rebalance): each is named,
// runs until the group's context ends, and the first to fail ends it with its error, which
// Wait returns once every goroutine has returned.
type runGroup struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
}

// newRunGroup returns a group whose context is a child of ctx.
func newRunGroup(ctx context.Context) (*runGroup, context.Context) {
	ctx, cancel := context.WithCancelCause(ctx)
	return &runGroup{ctx: ctx, cancel: cancel}, ctx
}

// Go runs fn in the group; an error from it ends the group's context, naming it.
func (g *runGroup) Go(name string, fn func() error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := fn(); err != nil {
			g.cancel(fmt.Errorf("%s: %w", name, err))
		}
	}()
}

// Stop ends the group's context (err nil: a clean stop).
func (g *runGroup) Stop(err error) { g.cancel(err) }

// Wait waits for every goroutine and returns why the group ended: nil after a clean stop or
// the parent context's cancellation, else the first failure.
func (g *runGroup) Wait() error {
	g.wg.Wait()
	if err := context.Cause(g.ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
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

// metricsMux serves /metrics from reg and /healthz; callers add /readyz where they have one.
func metricsMux(reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return mux
}
