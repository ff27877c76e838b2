package live

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
	"github.com/edgeflow/edgeflow/xds"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// fan hands every topology to several listeners.
type fan []watcher.Listener

func (f fan) Update(t *optimizer.Topology) {
	for _, l := range f {
		l.Update(t)
	}
}

// Noisy latency — every link's real delay redrawn every second, ±10 % around its base, for a
// minute — must not cause a push storm. The whole input path is real: nqdelay's delay on the
// links, blackbox-exporter's ICMP probes, Prometheus, edgeflow's Prometheus source with its
// defaults (2 s interval, 10 s window, 5 % hysteresis). Two xDS servers follow the same cluster
// source: one with the default flap damping (1 %) and one with damping off, so the figure says
// what the damping itself holds back. The base delays make LATA's optimum nearly degenerate
// (10 ms against 11 ms): noise flips it.
func TestNoisyLatencyNoPushStorm(t *testing.T) {
	testbed.RequireRoot(t)
	if testing.Short() {
		t.Skip("a minute of noise: skipped with -short")
	}
	nodes := []string{"edge-1", "edge-2", "edge-3", "edge-4"}
	base := map[[2]string]float64{
		{"edge-1", "edge-3"}: 10, {"edge-1", "edge-4"}: 11, {"edge-2", "edge-3"}: 11,
		{"edge-2", "edge-4"}: 10, {"edge-1", "edge-2"}: 20, {"edge-3", "edge-4"}: 20}
	tb := testbed.Start(t, testbed.Config{Nodes: nodes, ScrapeInterval: time.Second, RTT: base})
	tb.StartProbes(t)

	c := kubeapi.Start(t, kubeapi.Options{})
	ctx := kubeapi.Context(t)
	k := kubeapi.NewKubelet(t, ctx, c.Client, ns, 9000)
	k.Namespace()
	for _, n := range nodes {
		k.Node(n)
	}
	k.Service("web", true)
	k.Service("api", true)
	k.DeploymentPod("web", "web-1", "edge-1", podIP(100))
	k.DeploymentPod("web", "web-2", "edge-2", podIP(101))
	k.DeploymentPod("api", "api-3", "edge-3", podIP(102))
	k.DeploymentPod("api", "api-4", "edge-4", podIP(103))

	reg := prometheus.NewRegistry()
	ks, err := kube.NewSource(kube.Config{Client: c.Client, Namespaces: []string{ns}, Selector: kube.DefaultSelector})
	must(t, err)
	ps, err := prom.NewSource(prom.Config{URL: tb.PrometheusURL(), RoundTripper: tb.PrometheusTransport(),
		Window: 10 * time.Second, CallsQuery: prom.DisableCalls})
	must(t, err)
	one := 1.0
	cl, err := watcher.NewLive(watcher.LiveConfig{Kube: ks, Prom: ps, Check: xds.CheckTopology, Registerer: reg,
		CallGraph: &watcher.CallGraph{Calls: []optimizer.Call{{From: "web.shop", To: "api.shop", Rate: &one}},
			Ingress: []optimizer.Ingress{{Service: "web.shop", RPS: 100}}}})
	must(t, err)
	damped, err := xdsserver.New(xdsserver.Config{Registerer: reg})
	must(t, err)
	undamped, err := xdsserver.New(xdsserver.Config{Damping: -1})
	must(t, err)
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func() error{
		func() error { return damped.Run(runCtx) },
		func() error { return undamped.Run(runCtx) },
		func() error { return cl.Run(runCtx, fan{damped, undamped}) },
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(); err != nil {
				t.Errorf("pipeline: %v", err)
			}
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })

	eventually(t, 60*time.Second, "first publication", func() bool { return damped.Published() > 0 && undamped.Published() > 0 })
	// Let the 10 s window fill with samples of the base delays before the noise starts.
	time.Sleep(12 * time.Second)
	d0, u0 := damped.Published(), undamped.Published()
	top0 := counterValue(t, reg, "edgeflow_cluster_topologies_total")
	rng := rand.New(rand.NewPCG(7, 11))
	start := time.Now()
	for range 60 {
		for pair, ms := range base {
			if err := tb.SetRTT(pair[0], pair[1], ms*(0.9+0.2*rng.Float64())); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Until(start.Add(time.Duration(time.Since(start)/time.Second+1) * time.Second)))
	}
	// The window still holds noisy samples for another 10 s.
	time.Sleep(10 * time.Second)
	d, u := damped.Published()-d0, undamped.Published()-u0
	topologies := counterValue(t, reg, "edgeflow_cluster_topologies_total") - top0
	suppressed := counterValue(t, reg, "edgeflow_xds_suppressed_publications_total")
	t.Logf("60 s of ±10%% noise on every link (%v): %v topologies passed the source's window and hysteresis; "+
		"publications with damping %d (suppressed %v), without damping %d",
		time.Since(start).Round(time.Second), topologies, d, suppressed, u)
	if d > 3 {
		t.Errorf("%d publications in 70 s of noise with damping: a push storm (at most 3 wanted)", d)
	}
	if d > u {
		t.Errorf("damping published more (%d) than no damping (%d)", d, u)
	}
}
