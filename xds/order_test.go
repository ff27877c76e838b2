package xds

// Make before break on the wire: raw SOTW and delta ADS streams that hold back their ACKs show
// that a route naming a new cluster waits for the cluster's ACK, and a removed cluster waits
// for the ACK of the route that stopped naming it.

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/edgeflow/edgeflow/optimizer"
)

// mirror is what a client holds, built from the responses it applied.
type mirror struct {
	res [numSets]map[string]proto.Message
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

func resourceName(msg proto.Message) string {
	if c, ok := msg.(*endpoint.ClusterLoadAssignment); ok {
		return c.GetClusterName()
	}
	return msg.(interface{ GetName() string }).GetName()
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
	for _, msg := range m.res[RouteSet] {
		routeRefs(msg.(*route.RouteConfiguration), out)
	}
	return out
}

// broken lists the clusters a held route names that the client lacks, with or without their
// endpoints.
func (m *mirror) broken() []string {
	var out []string
	for c := range m.named() {
		if !m.has(ClusterSet, c) {
			out = append(out, c+" (cluster)")
		} else if !m.has(EndpointSet, c) {
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
	w := &rawWire{m: newMirror()}
	if delta {
		c := dialDelta(t, addr, node)
		for _, typ := range allTypes {
			c.subscribe(typ)
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
		c.subscribe(typ)
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

func cachedNames(t testing.TB, h *harness, id, typeURL string) map[string]bool {
	t.Helper()
	snap, err := h.srv.cacheFor(id).GetSnapshot(id)
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
	for _, tc := range []struct {
		name  string
		delta bool
	}{{"sotw", false}, {"delta", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := startServer(t, Config{Policy: optimizer.Localization, Encoding: EncodingWeightedClusters, DebounceQuiet: -1})
			top := two(5)
			w := openWire(t, h.addr, "x-0", tc.delta)
			eventually(t, 5*time.Second, "node registered", func() bool { return counter(t, h.srv.m.nodes) == 1 })
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
				return w.m.has(ClusterSet, "y/y-2") && w.m.has(EndpointSet, "y/y-2")
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
			if !w.m.has(ClusterSet, "y/y-0") {
				t.Fatal("y/y-0's cluster left before the route that named it was ACKed")
			}
			if !cachedNames(t, h, "x-0", resource.ClusterType)["y/y-0"] {
				t.Fatal("the server dropped y/y-0's cluster before the route that named it was ACKed")
			}
			for _, ack := range acks {
				ack()
			}
			w.pump(t, h, 3)
			if w.m.has(ClusterSet, "y/y-0") || w.m.has(EndpointSet, "y/y-0") {
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
