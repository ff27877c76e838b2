package server

// Make before break on the wire: raw SOTW and delta ADS streams that hold back their ACKs show
// that a route naming a new cluster waits for the cluster's ACK, and a removed cluster waits
// for the ACK of the route that stopped naming it.

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"
	"time"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// mirror is what a client holds, built from the responses it applied.
type mirror struct {
	res [xds.NumSets]map[string]proto.Message
}

func newMirror() *mirror {
	m := &mirror{}
	for i := range m.res {
		m.res[i] = map[string]proto.Message{}
	}
	return m
}

func unpack(t testing.TB, a *anypb.Any) proto.Message {
	t.Helper()
	msg, err := a.UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// sotw applies a SOTW response (the whole set of its type) and returns the type's index.
func (m *mirror) sotw(t testing.TB, r *discovery.DiscoveryResponse) int {
	t.Helper()
	i := setIndex(r.GetTypeUrl())
	m.res[i] = map[string]proto.Message{}
	for _, a := range r.GetResources() {
		msg := unpack(t, a)
		m.res[i][resourceName(msg)] = msg
	}
	return i
}

// delta applies a delta response (changed and removed resources).
func (m *mirror) delta(t testing.TB, r *discovery.DeltaDiscoveryResponse) int {
	t.Helper()
	i := setIndex(r.GetTypeUrl())
	for _, res := range r.GetResources() {
		m.res[i][res.GetName()] = unpack(t, res.GetResource())
	}
	for _, name := range r.GetRemovedResources() {
		delete(m.res[i], name)
	}
	return i
}

func (m *mirror) has(i int, name string) bool { return m.res[i][name] != nil }

// named returns the clusters the held routes name.
func (m *mirror) named() map[string]bool {
	out := map[string]bool{}
	for _, msg := range m.res[xds.RouteSet] {
		xds.ClusterRefs(msg.(*route.RouteConfiguration), out)
	}
	return out
}

// broken lists the clusters a held route names that the client lacks, with or without their
// endpoints.
func (m *mirror) broken() []string {
	var out []string
	for c := range m.named() {
		if !m.has(xds.ClusterSet, c) {
			out = append(out, c+" (cluster)")
		} else if !m.has(xds.EndpointSet, c) {
			out = append(out, c+" (endpoints)")
		}
	}
	sort.Strings(out)
	return out
}

// rawWire is one raw stream, SOTW or delta, subscribed to everything (wildcard) as Envoy is.
type rawWire struct {
	m    *mirror
	poll func(wait bool) (ack, nack func(), ok bool) // next response applied to m
}

func openWire(t *testing.T, addr, node string, delta bool) *rawWire {
	return reopenWire(t, addr, node, delta, newMirror(), nil, nil)
}

// reopenWire is openWire for a client that holds m and says so, as a client that reconnects
// does: the version of each type (SOTW, versions) or of each resource (delta,
// resourceVersions, sent as initial_resource_versions).
func reopenWire(t *testing.T, addr, node string, delta bool, m *mirror, versions map[string]string, resourceVersions map[string]map[string]string) *rawWire {
	w := &rawWire{m: m}
	if delta {
		c := dialDelta(t, addr, node)
		for _, typ := range allTypes {
			c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: typ, InitialResourceVersions: resourceVersions[typ]})
		}
		w.poll = func(wait bool) (func(), func(), bool) {
			var r *discovery.DeltaDiscoveryResponse
			if wait {
				r = c.next()
			} else if p := c.pendingOne(); p != nil {
				r = p
			} else {
				return nil, nil, false
			}
			w.m.delta(t, r)
			return func() { c.ack(r) }, func() { c.nack(r) }, true
		}
		return w
	}
	c := dialADS(t, addr, node)
	for _, typ := range allTypes {
		c.subscribeAt(typ, versions[typ])
	}
	w.poll = func(wait bool) (func(), func(), bool) {
		var r *discovery.DiscoveryResponse
		if wait {
			r = c.next()
		} else if p := c.pendingOne(); p != nil {
			r = p
		} else {
			return nil, nil, false
		}
		w.m.sotw(t, r)
		return func() { c.ack(r) }, func() { c.nack(r, "") }, true
	}
	return w
}

// pump applies and ACKs every response until publication pub converged, failing on a held
// route that names a cluster the client lacks.
func (w *rawWire) pump(t *testing.T, h *harness, pub uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.srv.converged.Load() < pub {
		ack, _, ok := w.poll(false)
		if !ok {
			if time.Now().After(deadline) {
				t.Fatalf("publication %d did not converge", pub)
			}
			time.Sleep(time.Millisecond)
			continue
		}
		if b := w.m.broken(); len(b) > 0 {
			t.Fatalf("the client holds routes naming what it lacks: %s", strings.Join(b, ", "))
		}
		ack()
	}
}

// until applies responses without ACKing them until cond holds, and returns their ACKs.
func (w *rawWire) until(t *testing.T, what string, cond func() bool) []func() {
	t.Helper()
	var acks []func()
	for !cond() {
		ack, _, _ := w.poll(true)
		if b := w.m.broken(); len(b) > 0 {
			t.Fatalf("waiting for %s, the client holds routes naming what it lacks: %s", what, strings.Join(b, ", "))
		}
		acks = append(acks, ack)
	}
	return acks
}

// waitSubscribed waits until the node's streams have asked for every type, so that a
// publication finds the subscriptions in place (a client cannot be kept from routes naming
// clusters before it even asks for clusters).
func waitSubscribed(t *testing.T, h *harness, id string) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, "all four types subscribed", func() bool {
		h.srv.nodesMu.Lock()
		n := h.srv.nodeByIDLocked(id)
		h.srv.nodesMu.Unlock()
		if n == nil {
			return false
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		for i := range xds.NumSets {
			subscribed := false
			for _, st := range n.live {
				subscribed = subscribed || st.sub[i].started
			}
			if !subscribed {
				return false
			}
		}
		return true
	})
}

func cachedNames(t testing.TB, h *harness, id, typeURL string) map[string]bool {
	t.Helper()
	snap, err := h.srv.cached(id)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for name := range snap.GetResources(typeURL) {
		out[name] = true
	}
	return out
}

func TestMakeBeforeBreak(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		delta bool
	}{{"sotw", false}, {"delta", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := startServer(t, Config{Policy: optimizer.Localization, Encoding: xds.EncodingWeightedClusters, DebounceQuiet: -1})
			top := two(5)
			w := openWire(t, h.addr, "x-0", tc.delta)
			waitSubscribed(t, h, "x-0")
			h.srv.Update(top)
			w.pump(t, h, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			// A new pod: its cluster and endpoints first; the route naming it only once they
			// are ACKed.
			grown := top.Clone()
			grown.Services[1].Pods = append(grown.Services[1].Pods, optimizer.Pod{Name: "y-2", Node: "n1", Address: "127.0.0.1:2003"})
			_, rdsBefore := cachedCount(t, h, "x-0", resource.RouteType)
			h.srv.Update(grown)
			if err := h.srv.WaitPublished(ctx, 2); err != nil {
				t.Fatal(err)
			}
			acks := w.until(t, "y/y-2's cluster and endpoints", func() bool {
				return w.m.has(xds.ClusterSet, "y/y-2") && w.m.has(xds.EndpointSet, "y/y-2")
			})
			if w.m.named()["y/y-2"] {
				t.Fatal("the route naming y/y-2 came before the client ACKed its cluster")
			}
			if _, v := cachedCount(t, h, "x-0", resource.RouteType); v != rdsBefore {
				t.Fatal("the server set the route naming y/y-2 before the client ACKed its cluster")
			}
			for _, ack := range acks {
				ack()
			}
			w.pump(t, h, 2)
			if !w.m.named()["y/y-2"] {
				t.Fatal("the route never named y/y-2")
			}

			// A removed pod: the route stops naming its cluster first; the cluster leaves only
			// once that route is ACKed.
			shrunk := grown.Clone()
			shrunk.Services[1].Pods = shrunk.Services[1].Pods[1:] // y-0 leaves
			h.srv.Update(shrunk)
			if err := h.srv.WaitPublished(ctx, 3); err != nil {
				t.Fatal(err)
			}
			acks = w.until(t, "the route without y/y-0", func() bool { return !w.m.named()["y/y-0"] })
			if !w.m.has(xds.ClusterSet, "y/y-0") {
				t.Fatal("y/y-0's cluster left before the route that named it was ACKed")
			}
			if !cachedNames(t, h, "x-0", resource.ClusterType)["y/y-0"] {
				t.Fatal("the server dropped y/y-0's cluster before the route that named it was ACKed")
			}
			for _, ack := range acks {
				ack()
			}
			w.pump(t, h, 3)
			if w.m.has(xds.ClusterSet, "y/y-0") || w.m.has(xds.EndpointSet, "y/y-0") {
				t.Error("y/y-0's cluster or endpoints stayed after no route named them")
			}
			if cachedNames(t, h, "x-0", resource.ClusterType)["y/y-0"] {
				t.Error("the cache still holds y/y-0's cluster")
			}
			if got := counter(t, h.srv.m.steps); got < 2 {
				t.Errorf("intermediate snapshots = %v, want ≥ 2 (one per change)", got)
			}
		})
	}
}

// TestMakeBeforeBreakRandom: random topologies (y's pods a random subset, random latencies)
// published while a raw client takes its responses and ACKs some at once and holds others back,
// so publications keep arriving mid-way through a node's steps. After every response the client
// holds no route naming what it lacks; at the end it holds exactly the last publication's
// resources.
func TestMakeBeforeBreakRandom(t *testing.T) {
	t.Parallel()
	pool := []optimizer.Pod{
		{Name: "y-0", Node: "n2", Address: "127.0.0.1:2001"}, {Name: "y-1", Node: "n3", Address: "127.0.0.1:2002"},
		{Name: "y-2", Node: "n1", Address: "127.0.0.1:2003"}, {Name: "y-3", Node: "n4", Address: "127.0.0.1:2004"},
	}
	for _, tc := range []struct {
		name  string
		delta bool
	}{{"sotw", false}, {"delta", true}} {
		for seed := range int64(randomSeeds) {
			t.Run(fmt.Sprint(tc.name, "/seed=", seed), func(t *testing.T) { makeBeforeBreakRandom(t, tc.delta, pool, seed) })
		}
	}
}

// randomSeeds is how many random sequences TestMakeBeforeBreakRandom runs per protocol.
const randomSeeds = 10

func makeBeforeBreakRandom(t *testing.T, delta bool, pool []optimizer.Pod, seed int64) {
	r := rand.New(rand.NewSource(seed))
	random := func() *optimizer.Topology {
		top := two(float64(1 + r.Intn(20)))
		top.Services[1].Pods = nil
		for len(top.Services[1].Pods) == 0 {
			for _, p := range pool {
				if r.Intn(2) == 0 {
					top.Services[1].Pods = append(top.Services[1].Pods, p)
				}
			}
		}
		return top
	}
	h := startServer(t, Config{Policy: optimizer.Localization, Encoding: xds.EncodingWeightedClusters, DebounceQuiet: -1})
	w := openWire(t, h.addr, "x-0", delta)
	waitSubscribed(t, h, "x-0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	last := two(5)
	h.srv.Update(last)
	pub := uint64(1)
	var held []func() // ACKs held back, sent in order
	for range 300 {
		switch r.Intn(5) {
		case 0:
			if pub == 40 {
				continue
			}
			last = random()
			h.srv.Update(last)
			pub++
			if err := h.srv.WaitPublished(ctx, pub); err != nil {
				t.Fatal(err)
			}
		case 1:
			for _, ack := range held {
				ack()
			}
			held = nil
		default:
			ack, _, ok := w.poll(false)
			if !ok {
				time.Sleep(time.Millisecond)
				continue
			}
			if b := w.m.broken(); len(b) > 0 {
				t.Fatalf("publication %d: the client holds routes naming what it lacks: %s", pub, strings.Join(b, ", "))
			}
			if len(held) == 0 && r.Intn(2) == 0 {
				ack()
			} else {
				held = append(held, ack)
			}
		}
	}
	for _, ack := range held {
		ack()
	}
	w.pump(t, h, pub)
	tr, err := xds.Translate(last, plan(t, last, optimizer.Localization), xds.EncodingWeightedClusters)
	if err != nil {
		t.Fatal(err)
	}
	for i, set := range tr.Pods["x-0"].Sets {
		var want, got []string
		for _, res := range set.Items {
			want = append(want, resourceName(res))
		}
		for name := range w.m.res[i] {
			got = append(got, name)
		}
		sort.Strings(got)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: the client holds %v, the last publication has %v", xds.SetNames[i], got, want)
		}
	}
	t.Logf("%d publications, %v intermediate snapshots", pub, counter(t, h.srv.m.steps))
}

// TestNACKMidSteps: a client that rejects a step keeps what it had, and the steps never break
// it: a rejected new cluster is never named by a route, and a rejected route keeps the
// clusters it names.
func TestNACKMidSteps(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{Policy: optimizer.Localization, Encoding: xds.EncodingWeightedClusters, DebounceQuiet: -1})
	c := dialADS(t, h.addr, "x-0")
	for _, typ := range allTypes {
		c.subscribe(typ)
	}
	waitSubscribed(t, h, "x-0")
	acked := map[string]*discovery.DiscoveryResponse{} // by type: the last response the client took
	settle := func(pub uint64) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, fmt.Sprint("publication ", pub, " converged"), func() bool {
			for r := c.pendingOne(); r != nil; r = c.pendingOne() {
				acked[r.GetTypeUrl()] = r
				c.ack(r)
			}
			return h.srv.converged.Load() >= pub
		})
	}
	cached := func(typ string) string {
		_, v := cachedCount(t, h, "x-0", typ)
		return v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	top := two(5)
	h.srv.Update(top)
	settle(1)

	// y-2 arrives; the client rejects the cluster set that brings it.
	grown := top.Clone()
	grown.Services[1].Pods = append(grown.Services[1].Pods, optimizer.Pod{Name: "y-2", Node: "n1", Address: "127.0.0.1:2003"})
	rds := cached(resource.RouteType)
	h.srv.Update(grown)
	for {
		r := c.next()
		if r.GetTypeUrl() != resource.ClusterType {
			acked[r.GetTypeUrl()] = r
			c.ack(r)
			continue
		}
		c.nack(r, acked[resource.ClusterType].GetVersionInfo())
		break
	}
	settle(2)
	if got := cached(resource.RouteType); got != rds {
		t.Error("the route naming y/y-2 was set although the client rejected y/y-2's cluster")
	}
	if got := cached(resource.ClusterType); got != acked[resource.ClusterType].GetVersionInfo() {
		t.Errorf("after the NACK the cache holds CDS %s, want the ACKed %s", got, acked[resource.ClusterType].GetVersionInfo())
	}

	// y-0 leaves (and y-2 with it); the client rejects the route without y/y-0.
	shrunk := top.Clone()
	shrunk.Services[1].Pods = shrunk.Services[1].Pods[1:]
	h.srv.Update(shrunk)
	for {
		r := c.next()
		if r.GetTypeUrl() != resource.RouteType {
			acked[r.GetTypeUrl()] = r
			c.ack(r)
			continue
		}
		c.nack(r, acked[resource.RouteType].GetVersionInfo())
		break
	}
	settle(3)
	if got := cached(resource.RouteType); got != acked[resource.RouteType].GetVersionInfo() {
		t.Errorf("after the NACK the cache holds RDS %s, want the ACKed %s", got, acked[resource.RouteType].GetVersionInfo())
	}
	if !cachedNames(t, h, "x-0", resource.ClusterType)["y/y-0"] {
		t.Error("y/y-0's cluster left although the client kept the route naming it")
	}

	// A later publication goes through as usual.
	final := top.Clone()
	final.Services[1].Pods = []optimizer.Pod{{Name: "y-3", Node: "n4", Address: "127.0.0.1:2004"}}
	h.srv.Update(final)
	if err := h.srv.WaitPublished(ctx, 4); err != nil {
		t.Fatal(err)
	}
	settle(4)
	if got := cachedNames(t, h, "x-0", resource.ClusterType); len(got) != 3 || !got["y/y-3"] {
		t.Errorf("after the last publication the cache holds clusters %v, want v/v-0, v/v-1, y/y-3", got)
	}
	if got := counter(t, h.srv.m.fallbacks.WithLabelValues("acked")); got != 2 {
		t.Errorf("fallbacks{to=acked} = %v, want 2", got)
	}
}

// TestRestartedServerKeepsRoutes: a raw client (SOTW or delta, wildcard, as Envoy is) holds a
// plan from a server that then restarts; it reconnects to the new server before that server's
// first publication, saying what it holds (SOTW: each type's version; delta:
// initial_resource_versions), and the new plan has a pod, so a cluster, that it does not hold.
// It must never be left without its listener and routes: the new server was never given the
// old ones, so holding them back for make before break would send none (SOTW: an empty
// Listener response; delta: the listener removed). It gets the new plan's.
func TestRestartedServerKeepsRoutes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		delta bool
	}{{"sotw", false}, {"delta", true}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Policy: optimizer.Localization, Encoding: xds.EncodingWeightedClusters, DebounceQuiet: -1}
			h1 := startServer(t, cfg)
			w := openWire(t, h1.addr, "x-0", tc.delta)
			waitSubscribed(t, h1, "x-0")
			top := two(5)
			h1.srv.Update(top)
			w.pump(t, h1, 1)
			held := w.m
			versions, resourceVersions := heldVersions(t, h1, "x-0", tc.delta)
			h1.stop()

			h2 := startServer(t, cfg)
			w2 := reopenWire(t, h2.addr, "x-0", tc.delta, held, versions, resourceVersions)
			waitSubscribed(t, h2, "x-0")
			grown := top.Clone()
			grown.Services[1].Pods = append(grown.Services[1].Pods, optimizer.Pod{Name: "y-2", Node: "n1", Address: "127.0.0.1:2003"})
			h2.srv.Update(grown)
			deadline := time.Now().Add(10 * time.Second)
			for h2.srv.converged.Load() < 1 {
				ack, _, ok := w2.poll(false)
				if !ok {
					if time.Now().After(deadline) {
						t.Fatal("the new server's publication did not converge")
					}
					time.Sleep(time.Millisecond)
					continue
				}
				for _, i := range []int{xds.ListenerSet, xds.RouteSet} {
					if len(held.res[i]) == 0 {
						t.Fatalf("the client was left without %s", xds.SetNames[i])
					}
				}
				ack()
			}
			if !held.named()["y/y-2"] || !held.has(xds.ClusterSet, "y/y-2") {
				t.Errorf("the client does not route to the new pod's cluster y/y-2: routes name %v", held.named())
			}
			if b := held.broken(); len(b) > 0 {
				t.Errorf("the client ends with routes naming what it lacks: %s", strings.Join(b, ", "))
			}
		})
	}
}

// heldVersions returns what node id's client holds, as it names it on reconnecting: the
// version of each type (SOTW) or of each resource (delta).
func heldVersions(t *testing.T, h *harness, id string, delta bool) (map[string]string, map[string]map[string]string) {
	t.Helper()
	h.srv.nodesMu.Lock()
	n := h.srv.nodeByIDLocked(id)
	h.srv.nodesMu.Unlock()
	if n == nil {
		t.Fatalf("no node %q", id)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	versions, resourceVersions := map[string]string{}, map[string]map[string]string{}
	for i, typ := range typeURLs {
		versions[typ] = n.sets[i].Version
		if delta {
			resourceVersions[typ] = n.snap.GetVersionMap(typ)
		}
	}
	return versions, resourceVersions
}
