package istio

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

// TestPassLoop drives the loop's queue by hand: a fixed retry delay however often passes
// fail, a resync after a success, a wake-up that passes at once without moving the pending
// resync, and a run that returns when its context ends.
func TestPassLoop(t *testing.T) {
	t.Parallel()
	const retry, resync = 5 * time.Second, time.Minute
	clock := newFakeClock()
	l := &passLoop{clock: clock, resync: resync, retry: retry, log: slog.New(slog.DiscardHandler), what: "test", owner: "test"}
	ctx, cancel := context.WithCancel(context.Background())
	results := make(chan error) // each pass returns the next one sent
	done := make(chan error)
	go func() {
		done <- l.run(ctx, func(ctx context.Context) (bool, error) {
			select {
			case err := <-results:
				return true, err
			case <-ctx.Done():
				return true, ctx.Err()
			}
		})
	}()
	boom := errors.New("apiserver unavailable")
	pass := func(err error, what string) {
		t.Helper()
		select {
		case results <- err:
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	waitPending := func(want time.Duration, what string) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, what, func() bool { return pending(clock) == want })
	}

	pass(boom, "the pass at the start")
	waitPending(retry, "a retry after the first failure")
	clock.Step(retry)
	pass(boom, "the first retry")
	waitPending(retry, "the same retry delay after the second failure")
	clock.Step(retry)
	pass(nil, "the second retry")
	waitPending(resync, "a resync after the success")

	clock.Step(resync / 2)
	l.wake()
	pass(nil, "the wake-up's pass, at once")
	waitPending(resync/2, "the resync still due at its time")
	clock.Step(resync / 2)
	pass(boom, "the resync's pass, at its time")
	waitPending(retry, "a retry after the failed resync")

	cancel()
	if err := <-done; err != nil {
		t.Errorf("run returned %v", err)
	}
	if err := l.run(canceled(), nil); err != nil {
		t.Errorf("a run after the first returned %v", err)
	}
}

func TestPassLoopOneRunAtATime(t *testing.T) {
	t.Parallel()
	l := &passLoop{clock: newFakeClock(), resync: time.Minute, retry: time.Second, log: slog.New(slog.DiscardHandler), owner: "Test"}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- l.run(ctx, func(context.Context) (bool, error) {
			close(started)
			return false, nil
		})
	}()
	<-started
	if err := l.run(ctx, nil); err == nil || err.Error() != "xds/istio: Test.Run called while another Run runs" {
		t.Errorf("an overlapping run returned %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run returned %v", err)
	}
}
