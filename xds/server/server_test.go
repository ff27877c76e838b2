package server

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/xds"
)

// The server is what the watcher feeds.
var _ watcher.Listener = (*Server)(nil)

// two is a topology with two independent call edges, x → y and u → v. Under localization,
// changing L(n1,n2) moves x-0 from y-0 to y-1 and changes nothing else.
func two(l12 float64) *optimizer.Topology {
	d := func(a, b string, ms float64) optimizer.Latency { return optimizer.Latency{From: a, To: b, MS: ms} }
	return &optimizer.Topology{
		Nodes: []optimizer.Node{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}, {Name: "n4"}},
		Latency: []optimizer.Latency{d("n1", "n2", l12), d("n1", "n3", 10), d("n1", "n4", 10),
			d("n2", "n3", 10), d("n2", "n4", 20), d("n3", "n4", 3)},
		Services: []optimizer.Service{
			{Name: "x", Pods: []optimizer.Pod{{Name: "x-0", Node: "n1"}, {Name: "x-1", Node: "n4"}}},
			{Name: "y", Pods: []optimizer.Pod{{Name: "y-0", Node: "n2", Address: "127.0.0.1:2001"}, {Name: "y-1", Node: "n3", Address: "127.0.0.1:2002"}}},
			{Name: "u", Pods: []optimizer.Pod{{Name: "u-0", Node: "n1"}, {Name: "u-1", Node: "n4"}}},
			{Name: "v", Pods: []optimizer.Pod{{Name: "v-0", Node: "n1", Address: "127.0.0.1:3001"}, {Name: "v-1", Node: "n4", Address: "127.0.0.1:3002"}}},
		},
		Calls:   []optimizer.Call{{From: "x", To: "y"}, {From: "u", To: "v"}},
		Ingress: []optimizer.Ingress{{Service: "x", RPS: 10}, {Service: "u", RPS: 10}},
	}
}

var allTypes = []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}

// subscribeAll asks for every type of services y and v, and ACKs the first response of each.
func subscribeAll(t *testing.T, c *adsClient, enc xds.Encoding) map[string]string {
	t.Helper()
	names := map[string][]string{
		resource.ListenerType: {"y", "v"}, resource.RouteType: {"y", "v"},
		resource.ClusterType: {"y", "v"}, resource.EndpointType: {"y", "v"},
	}
	if enc == xds.EncodingWeightedClusters {
		pods := []string{"y/y-0", "y/y-1", "v/v-0", "v/v-1"}
		names[resource.ClusterType], names[resource.EndpointType] = pods, pods
	}
	for _, typ := range allTypes {
		c.subscribe(typ, names[typ]...)
	}
	versions := map[string]string{}
	for range allTypes {
		r := c.next()
		versions[r.GetTypeUrl()] = r.GetVersionInfo()
		c.ack(r)
	}
	return versions
}

func TestOnlyChangedNodesArePushed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		enc     xds.Encoding
		changed string
	}{{xds.EncodingLocality, resource.EndpointType}, {xds.EncodingWeightedClusters, resource.RouteType}} {
		t.Run(string(tc.enc), func(t *testing.T) {
			h := startServer(t, Config{Policy: optimizer.Localization, Encoding: tc.enc, DebounceQuiet: -1})
			ids := []string{"x-0", "x-1", "u-0", "u-1", "y-0", "stranger"}
			clients := map[string]*adsClient{}
			for _, id := range ids {
				clients[id] = dialADS(t, h.addr, id)
			}
			h.srv.Update(two(5))
			before := map[string]map[string]string{}
			for _, id := range ids {
				before[id] = subscribeAll(t, clients[id], tc.enc)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := h.srv.WaitConverged(ctx, 1); err != nil {
				t.Fatal(err)
			}
			pushes := map[string]float64{}
			for i, l := range xds.SetNames {
				pushes[typeURLs[i]] = counter(t, h.srv.m.pushes.WithLabelValues(l))
			}

			cached := func(id string) [xds.NumSets]string {
				snap, err := h.srv.cached(id)
				if err != nil {
					t.Fatal(err)
				}
				var v [xds.NumSets]string
				for i, u := range typeURLs {
					v[i] = snap.GetVersion(u)
				}
				return v
			}
			old := map[string][xds.NumSets]string{}
			for _, id := range ids {
				old[id] = cached(id)
			}

			h.srv.Update(two(15)) // x-0 now prefers y-1
			r := clients["x-0"].next()
			if r.GetTypeUrl() != tc.changed || r.GetVersionInfo() == before["x-0"][tc.changed] {
				t.Fatalf("x-0 got %s version %s, want a new %s", r.GetTypeUrl(), r.GetVersionInfo(), tc.changed)
			}
			clients["x-0"].ack(r)
			if err := h.srv.WaitConverged(ctx, 2); err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				now := cached(id)
				for i := range now {
					changed := now[i] != old[id][i]
					if want := id == "x-0" && typeURLs[i] == tc.changed; changed != want {
						t.Errorf("%s: %s version changed=%v, want %v", id, xds.SetNames[i], changed, want)
					}
				}
			}
			for i, l := range xds.SetNames {
				want := pushes[typeURLs[i]]
				if typeURLs[i] == tc.changed {
					want++
				}
				if got := counter(t, h.srv.m.pushes.WithLabelValues(l)); got != want {
					t.Errorf("pushes{type=%q} = %v, want %v", l, got, want)
				}
			}
			if got := h.srv.Allocation().Call("x", "y").Fractions()["x-0"]["y-1"]; got != 1 {
				t.Errorf("allocation not updated: x-0 → y-1 = %v", got)
			}
		})
	}
}

func TestDebounce(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	start := clock.Now()
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: 100 * time.Millisecond,
		DebounceMax: time.Second, Clock: clock})
	updates := 0
	// waitTimer waits until the loop has handled the latest Update: one timer per Update,
	// the pending one due at the given offset.
	waitTimer := func(at time.Duration) {
		t.Helper()
		testkit.Eventually(t, 5*time.Second, "debounce timer at "+at.String(), func() bool {
			d := clock.Deadlines(start)
			return clock.TimersCreated() == updates && len(d) == 1 && d[0] == at
		})
	}
	// Updates every 90 ms keep the quiet period from ever elapsing: the push happens at the
	// maximum delay, 1 s after the first Update, with the latest topology.
	for at := time.Duration(0); at < time.Second; at += 90 * time.Millisecond {
		h.srv.Update(two(float64(5 + at/(90*time.Millisecond))))
		updates++
		want := at + 100*time.Millisecond
		if want > time.Second {
			want = time.Second
		}
		waitTimer(want)
		if h.srv.Published() != 0 {
			t.Fatalf("published at %v, before the quiet period or the maximum", at)
		}
		if at+90*time.Millisecond < time.Second {
			clock.Step(90 * time.Millisecond)
		}
	}
	clock.Step(time.Second - clock.Now().Sub(start)) // to exactly 1 s
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.srv.WaitPublished(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := h.srv.Allocation().Call("x", "y").Fractions()["x-0"]["y-1"]; got != 1 {
		t.Errorf("published an older topology (x-0 → y-1 = %v)", got)
	}
	if d := clock.Deadlines(start); len(d) != 0 {
		t.Errorf("timers left after the push: %v", d)
	}

	// A single Update publishes after the quiet period, not before.
	t2 := clock.Now()
	h.srv.Update(two(5))
	updates++
	testkit.Eventually(t, 5*time.Second, "quiet timer", func() bool {
		d := clock.Deadlines(t2)
		return clock.TimersCreated() == updates && len(d) == 1 && d[0] == 100*time.Millisecond
	})
	clock.Step(99 * time.Millisecond)
	if h.srv.Published() != 1 {
		t.Fatal("published before the quiet period")
	}
	clock.Step(time.Millisecond)
	if err := h.srv.WaitPublished(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, h.srv.m.publications); got != 2 {
		t.Errorf("publications = %v, want 2", got)
	}
}

func TestDebounceDisabledPublishesEveryUpdate(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := uint64(1); i <= 3; i++ {
		h.srv.Update(two(float64(i)))
		if err := h.srv.WaitPublished(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNothingServedBeforeFirstCompleteTopology(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	c := dialADS(t, h.addr, "x-0")
	c.subscribe(resource.EndpointType, "y")
	testkit.Eventually(t, 5*time.Second, "node registered", func() bool { return counter(t, h.srv.m.nodes) == 1 })

	bad := two(5)
	bad.Services[1].Pods[1].Address = "" // y-1 is called but has no address
	h.srv.Update(bad)
	testkit.Eventually(t, 5*time.Second, "incomplete topology rejected", func() bool { return counter(t, h.srv.m.rejected) == 1 })
	if got := c.pending(); len(got) != 0 || h.srv.Published() != 0 || h.srv.Allocation() != nil {
		t.Fatalf("something was served from an incomplete topology: %d responses", len(got))
	}

	h.srv.Update(two(5))
	first := c.next()
	if w := weights(t, first); w != "y: y-0@0:10000 edgeflow/failover@1:1;" {
		t.Errorf("first response %q", w)
	}
	c.ack(first)

	// A later incomplete topology keeps the previous publication.
	h.srv.Update(bad)
	testkit.Eventually(t, 5*time.Second, "second rejection", func() bool { return counter(t, h.srv.m.rejected) == 2 })
	if h.srv.Published() != 1 || h.srv.Allocation() == nil {
		t.Errorf("published = %d after a rejected topology", h.srv.Published())
	}
	snap, err := h.srv.cached("x-0")
	if err != nil || snap.GetVersion(resource.EndpointType) != first.GetVersionInfo() {
		t.Errorf("the previous snapshot did not stay: %v", err)
	}
}

func TestNACKKeepsPreviousVersion(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	c := dialADS(t, h.addr, "x-0")
	h.srv.Update(two(5))
	c.subscribe(resource.EndpointType, "y")
	v1 := c.next()
	c.ack(v1)

	h.srv.Update(two(15))
	v2 := c.next()
	if v2.GetVersionInfo() == v1.GetVersionInfo() {
		t.Fatal("no new version")
	}
	c.nack(v2, v1.GetVersionInfo())
	testkit.Eventually(t, 5*time.Second, "NACK counted", func() bool { return counter(t, h.srv.m.nacks.WithLabelValues("eds")) == 1 })
	testkit.Eventually(t, 5*time.Second, "snapshot set back", func() bool {
		snap, err := h.srv.cached("x-0")
		return err == nil && snap.GetVersion(resource.EndpointType) == v1.GetVersionInfo()
	})

	// The same (rejected) result again is not resent; a different one is, and it is the next
	// response the client sees: the rejected version was never sent again in between.
	h.srv.Update(two(15))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.srv.WaitPublished(ctx, 3); err != nil {
		t.Fatal(err)
	}
	next := two(15)
	next.Services[1].Pods = append(next.Services[1].Pods, optimizer.Pod{Name: "y-2", Node: "n1", Address: "127.0.0.1:2003"})
	h.srv.Update(next)
	v3 := c.next()
	if v3.GetVersionInfo() == v2.GetVersionInfo() || v3.GetVersionInfo() == v1.GetVersionInfo() {
		t.Fatalf("after a NACK the client got version %s again", v3.GetVersionInfo())
	}
	if w := weights(t, v3); !strings.HasPrefix(w, "y: y-2@0:10000") {
		t.Errorf("v3 = %q", w)
	}
	c.ack(v3)
	if err := h.srv.WaitConverged(ctx, 4); err != nil {
		t.Fatal(err)
	}
}

func TestNACKOfFirstResponse(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	h.srv.Update(two(5))
	c := dialADS(t, h.addr, "x-0")
	c.subscribe(resource.EndpointType, "y")
	v1 := c.next()
	c.nack(v1, "")
	// Nothing to fall back to: the cache keeps the assignments under the version the client
	// holds (""), so it neither resends v1 in a loop nor answers with nothing.
	testkit.Eventually(t, 5*time.Second, "NACK handled", func() bool {
		snap, err := h.srv.cached("x-0")
		return err == nil && snap.GetVersion(resource.EndpointType) == ""
	})
	if n, _ := cachedCount(t, h, "x-0", resource.EndpointType); n != 2 {
		t.Errorf("after the NACK the cache holds %d assignments, want the 2 it had", n)
	}
	h.srv.Update(two(15))
	if v2 := c.next(); v2.GetVersionInfo() == v1.GetVersionInfo() {
		t.Fatal("rejected version resent")
	}
}

func TestNodeIdentity(t *testing.T) {
	t.Parallel()
	top := two(5)
	top.Services[0].Pods[0].Address = "127.0.0.40:1" // x pods get addresses, so they match by IP
	top.Services[0].Pods[1].Address = "127.0.0.41:1"
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	h.srv.Update(top)
	tr, err := xds.Translate(top, plan(t, top, optimizer.Localization), xds.EncodingLocality)
	if err != nil {
		t.Fatal(err)
	}
	want := func(pod string) string {
		n := tr.Default
		if pod != "" {
			n = tr.Pods[pod]
		}
		return n.Sets[xds.EndpointSet].Version
	}
	for _, tc := range []struct{ id, pod string }{
		{"x-0", "x-0"},
		{"sidecar~10.9.9.9~x-1.default~default.svc.cluster.local", "x-1"},       // by pod name
		{"sidecar~127.0.0.40~renamed.default~default.svc.cluster.local", "x-0"}, // by IP
		{"sidecar~127.0.0.1~nobody.default~default.svc.cluster.local", ""},      // IP shared by y and v pods: ambiguous
		{"stranger", ""},
		{"", ""},
	} {
		c := dialADS(t, h.addr, tc.id)
		c.subscribe(resource.EndpointType, "y", "v")
		r := c.next()
		if r.GetVersionInfo() != want(tc.pod) {
			t.Errorf("node %q: got EDS %s (%s), want %q's", tc.id, r.GetVersionInfo(), weights(t, r), tc.pod)
		}
		if tc.pod == "" && weights(t, r) != "v: v-0@0:5000 v-1@0:5000;y: y-0@0:5000 y-1@0:5000;" {
			t.Errorf("node %q: round-robin expected, got %s", tc.id, weights(t, r))
		}
	}

	// An unknown node that becomes a pod of the topology gets its own weights.
	c := dialADS(t, h.addr, "x-2")
	c.subscribe(resource.EndpointType, "y")
	first := c.next()
	if w := weights(t, first); w != "y: y-0@0:5000 y-1@0:5000;" {
		t.Fatalf("unknown x-2: %s", w)
	}
	c.ack(first)
	grown := top.Clone()
	grown.Services[0].Pods = append(grown.Services[0].Pods, optimizer.Pod{Name: "x-2", Node: "n3", Address: "127.0.0.42:1"})
	h.srv.Update(grown)
	if w := weights(t, c.next()); w != "y: y-1@0:10000 edgeflow/failover@1:1;" {
		t.Errorf("x-2 after joining the topology: %s", w)
	}
}

func TestRunEndsStreams(t *testing.T) {
	t.Parallel()
	srv, err := New(Config{Policy: optimizer.Localization, DebounceQuiet: -1, Damping: -1, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = g.Serve(lis) }()
	runErr := make(chan error, 1)
	go func() { defer wg.Done(); runErr <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); g.Stop(); wg.Wait() })

	srv.Update(two(5))
	c := dialADS(t, lis.Addr().String(), "x-0")
	c.subscribe(resource.EndpointType, "y")
	c.next()
	if err := srv.Run(ctx); err == nil {
		t.Error("a second Run was accepted")
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Errorf("Run returned %v", err)
	}
	// The stream ends, so a graceful stop does not hang on it.
	testkit.Eventually(t, 5*time.Second, "stream end", func() bool {
		select {
		case _, ok := <-c.resp:
			return !ok
		default:
			return false
		}
	})
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("GracefulStop hung on xDS streams")
	}
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "edgeflow_xds_") {
			t.Errorf("%s: not edgeflow_xds_", name)
		}
		switch mf.GetType().String() {
		case "COUNTER":
			if !strings.HasSuffix(name, "_total") {
				t.Errorf("counter %s without _total", name)
			}
		case "HISTOGRAM":
			if !strings.HasSuffix(name, "_seconds") {
				t.Errorf("histogram %s not in seconds", name)
			}
		}
	}
	if _, err := New(Config{Registerer: reg}); err == nil {
		t.Error("registering twice in one registry should fail")
	}
}

func TestConvergenceAwaitsOnlySubscribedTypes(t *testing.T) {
	t.Parallel()
	// A sidecar that takes only EDS (Istio's integration) never answers for CDS or LDS: a
	// publication that changes those too still converges on its EDS ACK.
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	h.srv.Update(two(5))
	c := dialADS(t, h.addr, "x-0")
	c.subscribe(resource.EndpointType, "y")
	c.ack(c.next())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.srv.WaitConverged(ctx, 1); err != nil {
		t.Fatal(err)
	}
	grown := two(15)
	grown.Services = append(grown.Services, optimizer.Service{Name: "w", Pods: []optimizer.Pod{{Name: "w-0", Node: "n1", Address: "127.0.0.1:4001"}}})
	h.srv.Update(grown) // new listener, route, cluster and assignment for w; x-0's y weights change
	c.ack(c.next())
	if err := h.srv.WaitConverged(ctx, 2); err != nil {
		t.Fatalf("publication 2 did not converge: %v", err)
	}
	if got := counter(t, h.srv.m.pushes.WithLabelValues("cds")); got != 0 {
		t.Errorf("CDS pushes counted for a node that never asked for CDS: %v", got)
	}
}

func TestOnePushInFlight(t *testing.T) {
	t.Parallel()
	// Updates from many goroutines while pushes run: publications never overlap, and the
	// last topology is the one published in the end.
	srv, err := New(Config{Policy: optimizer.Localization, DebounceQuiet: -1, Damping: -1, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var inFlight, maxInFlight, attempts atomic.Int64
	srv.publishHook = func(begin bool) {
		if !begin {
			inFlight.Add(-1)
			return
		}
		attempts.Add(1)
		n := inFlight.Add(1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-runDone })

	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				srv.Update(two(float64(1 + (g*50+i)%20)))
			}
		}(g)
	}
	wg.Wait()
	last := two(15)
	last.Ingress[0].RPS = 999 // recognisable in the allocation's rates
	srv.Update(last)
	testkit.Eventually(t, 10*time.Second, "the last topology published", func() bool {
		a := srv.Allocation()
		return a != nil && a.Call("x", "y").Routes[0].RPS == 499.5 && inFlight.Load() == 0
	})
	if m := maxInFlight.Load(); m != 1 {
		t.Errorf("%d publications ran at once", m)
	}
	t.Logf("%d publications for 401 updates", attempts.Load())
}

// Flap damping in the server: a recompute that moves nothing (here: the same plan under new
// latencies) is not published and is counted; a new pod is published whatever it moves.
func TestServerDamping(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{DebounceQuiet: -1, Damping: optimizer.DefaultDamping})
	top := &optimizer.Topology{
		Nodes:   []optimizer.Node{{Name: "n1"}, {Name: "n2"}},
		Latency: []optimizer.Latency{{From: "n1", To: "n2", MS: 10}},
		Services: []optimizer.Service{
			{Name: "web", Pods: []optimizer.Pod{{Name: "web-0", Node: "n1", Address: "127.0.0.1:9001"}}},
			{Name: "api", Pods: []optimizer.Pod{{Name: "api-0", Node: "n1", Address: "127.0.0.1:9002"},
				{Name: "api-1", Node: "n2", Address: "127.0.0.1:9003"}}},
		},
		Calls: []optimizer.Call{{From: "web", To: "api"}},
	}
	h.srv.Update(top)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.srv.WaitPublished(ctx, 1); err != nil {
		t.Fatal(err)
	}
	slower := top.Clone()
	slower.Latency[0].MS = 12 // LATA's equal shares do not move
	h.srv.Update(slower)
	testkit.Eventually(t, 10*time.Second, "the recompute suppressed", func() bool { return counter(t, h.srv.m.suppressed) == 1 })
	if n := h.srv.Published(); n != 1 {
		t.Errorf("%d publications, want 1: the recompute that moved nothing was pushed", n)
	}
	more := slower.Clone()
	more.Services[1].Pods = append(more.Services[1].Pods, optimizer.Pod{Name: "api-2", Node: "n2", Address: "127.0.0.1:9004"})
	h.srv.Update(more)
	if err := h.srv.WaitPublished(ctx, 2); err != nil {
		t.Fatalf("a new pod was not published: %v", err)
	}
	if got := counter(t, h.srv.m.suppressed); got != 1 {
		t.Errorf("suppressed %v, want 1", got)
	}
}

// TestNewRejectsBadWireConfig: New refuses what the translator would refuse to write (the
// same check), naming the bad value, before anything is served.
func TestNewRejectsBadWireConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown lb policy", Config{LBPolicy: "fastest"}, `unknown lb policy "fastest"`},
		{"least-request with weighted clusters", Config{LBPolicy: xds.LBLeastRequest, Encoding: xds.EncodingWeightedClusters}, "needs the locality encoding"},
		{"unknown encoding", Config{Encoding: "morse"}, `"morse"`},
		{"cluster domain with capitals", Config{ClusterDomain: "Cluster.Local"}, "Cluster.Local"},
		{"cluster domain with an empty label", Config{ClusterDomain: "a..b"}, "a..b"},
		{"unknown policy", Config{Policy: "fastest"}, "fastest"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
