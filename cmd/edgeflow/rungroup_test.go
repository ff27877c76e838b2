package main

import (
	"context"
	"errors"
	"testing"
)

// TestRunGroup: the first failure ends the group, named, and is what Wait returns; errors
// returned once the group has ended (a clean stop, the parent's cancellation, another's
// failure) are dropped.
func TestRunGroup(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	late := func(ctx context.Context) func() error {
		return func() error { <-ctx.Done(); return errors.New("late") }
	}

	g, ctx := newRunGroup(context.Background())
	g.Go("waiter", late(ctx))
	g.Go("component", func() error { return boom })
	<-ctx.Done()
	if err := g.Wait(); !errors.Is(err, boom) || err.Error() != "component: boom" {
		t.Errorf("a failure: Wait = %v, want component: boom", err)
	}
	if c := context.Cause(ctx); !errors.Is(c, boom) {
		t.Errorf("a failure: the context's cause is %v, want it", c)
	}

	g, ctx = newRunGroup(context.Background())
	g.Go("waiter", late(ctx))
	g.Stop()
	if err := g.Wait(); err != nil {
		t.Errorf("a clean stop: Wait = %v, want nil", err)
	}

	parent, cancel := context.WithCancel(context.Background())
	g, ctx = newRunGroup(parent)
	g.Go("waiter", late(ctx))
	cancel()
	if err := g.Wait(); err != nil {
		t.Errorf("the parent cancelled: Wait = %v, want nil", err)
	}

	g, ctx = newRunGroup(context.Background())
	g.Go("waiter", late(ctx))
	g.Fail(boom)
	if err := g.Wait(); err != boom {
		t.Errorf("Fail: Wait = %v, want its error as given", err)
	}
}
