package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/edgeflow/edgeflow/internal/leader"
	"github.com/edgeflow/edgeflow/internal/testkit"
)

// TestIstioLeaderRunsTheReconcilerOnlyWhileLeading: of two replicas on one Lease only the
// holder runs its reconciler, its gauge is 1 and /readyz says leader; the other's says
// follower naming the holder. When the leader stops, the other's reconciler runs.
func TestIstioLeaderRunsTheReconcilerOnlyWhileLeading(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset()
	lease := leader.Config{Namespace: "edgeflow", Name: DefaultIstioLeaseName, LeaseDuration: 30 * time.Second,
		RenewDeadline: 20 * time.Second, RetryPeriod: 50 * time.Millisecond}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	type replica struct {
		l       *istioLeader
		running atomic.Bool
		cancel  context.CancelFunc
		done    chan error
	}
	start := func(id string) *replica {
		r := &replica{done: make(chan error, 1)}
		var err error
		r.l, err = newIstioLeader(func(ctx context.Context) error {
			r.running.Store(true)
			defer r.running.Store(false)
			<-ctx.Done()
			return nil
		}, cs.CoordinationV1(), lease, id, logger, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		r.cancel = cancel
		go func() { r.done <- r.l.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-r.done })
		return r
	}
	a := start("a")
	testkit.Eventually(t, 10*time.Second, "a's reconciler runs", a.running.Load)
	b := start("b")
	testkit.Eventually(t, 10*time.Second, "b sees a lead", func() bool { return strings.Contains(b.l.check().Message, "follower: a writes") })
	if b.running.Load() || testutil.ToFloat64(b.l.gauge) != 0 || b.l.Leading() {
		t.Fatal("b's reconciler runs while a leads")
	}
	if got := testutil.ToFloat64(a.l.gauge); got != 1 {
		t.Errorf("a's edgeflow_istio_leader = %v, want 1", got)
	}
	if c := a.l.check(); !c.OK || !strings.HasPrefix(c.Message, "leader: ") {
		t.Errorf("a's /readyz line %+v", c)
	}
	a.cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("a: Run: %v", err)
	}
	a.done <- nil
	if a.running.Load() || testutil.ToFloat64(a.l.gauge) != 0 {
		t.Error("a's reconciler still runs after Run returned")
	}
	testkit.Eventually(t, 10*time.Second, "b's reconciler runs once a released the Lease", b.running.Load)
	if got := testutil.ToFloat64(b.l.gauge); got != 1 {
		t.Errorf("b's edgeflow_istio_leader = %v, want 1", got)
	}
}
