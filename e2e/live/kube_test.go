// Package live holds edgeflow's tests against real servers: a real kube-apiserver and etcd
// (e2e/kubeapi), a real Prometheus and blackbox-exporter in a network-namespace testbed with
// real delay (e2e/testbed), and real grpc-go xDS clients receiving the weights.
package live

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
)

const ns = "shop"

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestKubernetesPodsDriveWeights: a real kube-apiserver, edgeflow's informers, the xDS server
// and a real grpc-go xDS client. A pod becoming ready gets traffic (and the time from the
// EndpointSlice update to its first RPC is measured), a deleted pod gets none, and not-ready
// pods and a managed service without ready pods never block the others.
func TestKubernetesPodsDriveWeights(t *testing.T) {
	t.Parallel()
	w := newWorld(t, worldOptions{kube: true, kubeNodes: []string{"n1", "n2", "n3"},
		services: []string{"web", "api", "ghost"}, // ghost: managed, never a ready pod
		backends: []string{"api-0", "api-1", "api-2", "api-3"}})
	ctx, k, backends := w.ctx, w.k, w.backends
	k.Service("unmanaged", false) // not labelled: ignored
	w.pod("web", "web-0", "n1", true)
	w.pod("api", "api-0", "n1", true)
	w.pod("api", "api-1", "n2", true)
	w.pod("api", "api-2", "n3", false)
	w.pod("ghost", "ghost-0", "n3", false)
	w.pod("unmanaged", "u-0", "n3", true)

	defaultMS := 10.0
	w.watch(watchOptions{live: watcher.LiveConfig{DefaultLatencyMS: &defaultMS,
		CallGraph: &watcher.CallGraph{
			Calls:   []optimizer.Call{{From: "web.shop", To: "api.shop"}, {From: "web.shop", To: "ghost.shop"}, {From: "web.shop", To: "unmanaged.shop"}},
			Ingress: []optimizer.Ingress{{Service: "web.shop", RPS: 100}}}}})
	reg, cl, srv := w.reg, w.cl, w.srv
	web := w.caller("web-0.shop", "api.shop")

	// Two ready pods: each gets half (LATA's balance constraint with one caller pod).
	testkit.Eventually(t, 30*time.Second, "first publication", func() bool { return srv.Published() > 0 })
	got := share(t, ctx, web, 2000)
	t.Logf("api-2 not ready: %s", fmtShare(got))
	if got["api-2"] != 0 || math.Abs(got["api-0"]-0.5) > 0.05 || math.Abs(got["api-1"]-0.5) > 0.05 {
		t.Fatalf("before api-2 is ready: shares %s, want api-0 and api-1 0.5 each", fmtShare(got))
	}
	if n := gaugeValue(t, reg, "edgeflow_kube_skipped", "not_ready"); n < 1 {
		t.Errorf("edgeflow_kube_skipped{reason=not_ready} = %v, want ≥ 1", n)
	}
	if n := gaugeValue(t, reg, "edgeflow_kube_skipped", "no_ready_pods"); n != 1 {
		t.Errorf("edgeflow_kube_skipped{reason=no_ready_pods} = %v, want 1 (ghost)", n)
	}

	// api-2 becomes ready: traffic reaches it; measure from the EndpointSlice update.
	loopCtx, stop := context.WithCancel(ctx)
	wait := web.loop(loopCtx, 2*time.Millisecond)
	start := time.Now()
	k.SetReady("api", "api-2", true)
	var first time.Time
	testkit.Eventually(t, 10*time.Second, "first RPC on api-2", func() bool {
		var ok bool
		first, ok = web.firstAnswer("api-2")
		return ok
	})
	readyToRPC := first.Sub(start)
	stop()
	wait()
	t.Logf("pod ready → first RPC on it: %v (target ≤ 1 s)", readyToRPC.Round(time.Millisecond))
	if readyToRPC > time.Second {
		t.Errorf("pod ready → first RPC took %v, want ≤ 1 s", readyToRPC)
	}
	got = share(t, ctx, web, 3000)
	t.Logf("api-2 ready: %s", fmtShare(got))
	for _, p := range []string{"api-0", "api-1", "api-2"} {
		if math.Abs(got[p]-1.0/3) > 0.05 {
			t.Errorf("after api-2 is ready: %s got %.2f, want 1/3", p, got[p])
		}
	}

	// A not-ready newcomer never blocks the others: api-3 not ready, then api-1 deleted.
	w.pod("api", "api-3", "n2", false)
	pub := srv.Published()
	k.DeletePod("api", "api-1")
	testkit.Eventually(t, 10*time.Second, "publication after the deletion", func() bool { return srv.Published() > pub })
	// The push is done when the client has ACKed it; grpc-go swaps its picker just after the
	// ACK, so wait until a run of RPCs avoids the pod, then require that it gets nothing.
	if err := srv.WaitConverged(ctx, srv.Published()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "the client's picker without api-1", func() bool { return share(t, ctx, web, 20)["api-1"] == 0 })
	before := backends["api-1"].Calls.Load()
	got = share(t, ctx, web, 2000)
	t.Logf("api-1 deleted, api-3 not ready: %s", fmtShare(got))
	if n := backends["api-1"].Calls.Load() - before; n != 0 {
		t.Errorf("deleted pod api-1 served %d RPCs after the push", n)
	}
	if got["api-3"] != 0 {
		t.Errorf("not-ready pod api-3 got %.2f of the traffic", got["api-3"])
	}
	if math.Abs(got["api-0"]-0.5) > 0.05 || math.Abs(got["api-2"]-0.5) > 0.05 {
		t.Errorf("after deletion: %s, want api-0 and api-2 0.5 each", fmtShare(got))
	}
	if f := web.failed.Load(); f != 0 {
		t.Errorf("%d of %d RPCs failed", f, web.sent.Load())
	}
	top := cl.Current()
	for _, s := range top.Services {
		if s.Name == "ghost" || s.Name == "unmanaged" {
			t.Errorf("service %s is in the topology", s.Key())
		}
	}

	// api-2 is deleted gracefully: still serving, terminating. Once the client has the push it
	// sends api-2 nothing new, while api-2 stays up (its in-flight work could finish).
	pub = srv.Published()
	k.Terminate("api", "api-2")
	testkit.Eventually(t, 10*time.Second, "publication after the graceful deletion", func() bool { return srv.Published() > pub })
	if err := srv.WaitConverged(ctx, srv.Published()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "the client's picker without api-2", func() bool { return share(t, ctx, web, 20)["api-2"] == 0 })
	before = backends["api-2"].Calls.Load()
	got = share(t, ctx, web, 1000)
	t.Logf("api-2 terminating (serving): %s", fmtShare(got))
	if n := backends["api-2"].Calls.Load() - before; n != 0 {
		t.Errorf("terminating pod api-2 served %d new RPCs after the push", n)
	}
	if got["api-0"] < 0.999 {
		t.Errorf("with api-2 terminating: %s, want everything on api-0", fmtShare(got))
	}
	if n := gaugeValue(t, reg, "edgeflow_kube_skipped", "terminating"); n != 1 {
		t.Errorf("edgeflow_kube_skipped{reason=terminating} = %v, want 1", n)
	}

	// The API server goes away: the watches fail, /readyz says so and since when, and the last
	// known state is still served.
	ready := w.ready
	if code, body := get(t, ready.URL); code != 200 || strings.Contains(body, "degraded") {
		t.Fatalf("/readyz before the API server stops: %d %q", code, body)
	}
	down := time.Now()
	if err := w.cluster.Stop("kube-apiserver"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "/readyz naming the failing watches", func() bool {
		_, body := get(t, ready.URL)
		return strings.Contains(body, "[-]kubernetes") && strings.Contains(body, "failing since")
	})
	code, body := get(t, ready.URL)
	t.Logf("/readyz %v after the API server stopped (%d):\n%s", time.Since(down).Round(time.Millisecond), code, body)
	if code != 200 || !strings.Contains(body, "degraded") {
		t.Errorf("/readyz with the API server down: %d %q, want 200 degraded", code, body)
	}
	if got := share(t, ctx, web, 200); got["api-0"] < 0.999 {
		t.Errorf("with the API server down: %s, want the last state (all on api-0)", fmtShare(got))
	}
}

// gaugeValue reads one labelled gauge (reason=…) from the registry.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if reason == "" && len(m.GetLabel()) == 0 {
				return m.GetGauge().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return math.NaN()
}
