package server

import (
	"context"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
)

// deltaWeights renders a delta response's assignments like weights does a SOTW response's.
func deltaWeights(t testing.TB, r *discovery.DeltaDiscoveryResponse) string {
	t.Helper()
	var anys []*anypb.Any
	for _, res := range r.GetResources() {
		anys = append(anys, res.GetResource())
	}
	return weights(t, &discovery.DiscoveryResponse{Resources: anys})
}

// TestDeltaACKAndNACK: delta clients are tracked like SOTW ones. A publication converges only
// once they ACKed; a NACK is counted, the node goes back to what it ACKed (and the client is
// sent that again), and counts as the answer; a publication that changes nothing a delta client
// subscribes to sends it nothing and still converges.
func TestDeltaACKAndNACK(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	c := dialDelta(t, h.addr, "x-0")
	c.subscribe(resource.EndpointType, "y")
	testkit.Eventually(t, 5*time.Second, "node registered", func() bool { return counter(t, h.srv.m.nodes) == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	h.srv.Update(two(5))
	v1 := c.next()
	if w := deltaWeights(t, v1); w != "y: y-0@0:10000 edgeflow/failover@1:1;" {
		t.Fatalf("first delta response %q", w)
	}
	if h.srv.converged.Load() >= 1 {
		t.Fatal("publication 1 converged before the delta client ACKed")
	}
	c.ack(v1)
	if err := h.srv.WaitConverged(ctx, 1); err != nil {
		t.Fatal(err)
	}

	h.srv.Update(two(15)) // x-0 now sends to y-1
	v2 := c.next()
	if deltaWeights(t, v2) == deltaWeights(t, v1) {
		t.Fatal("no new weights")
	}
	if err := h.srv.WaitPublished(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if h.srv.converged.Load() >= 2 {
		t.Fatal("publication 2 converged before the delta client answered")
	}
	c.nack(v2)
	back := c.next()
	if got := counter(t, h.srv.m.nacks.WithLabelValues("eds")); got != 1 {
		t.Errorf("nacks{eds} = %v, want 1", got)
	}
	if deltaWeights(t, back) != deltaWeights(t, v1) {
		t.Errorf("after the NACK the client got %q, want what it ACKed, %q", deltaWeights(t, back), deltaWeights(t, v1))
	}
	if _, v := cachedCount(t, h, "x-0", resource.EndpointType); v != v1.GetSystemVersionInfo() {
		t.Errorf("the cache holds EDS %s after the NACK, want the ACKed %s", v, v1.GetSystemVersionInfo())
	}
	if got := counter(t, h.srv.m.fallbacks.WithLabelValues("acked")); got != 1 {
		t.Errorf("fallbacks{to=acked} = %v, want 1", got)
	}
	if err := h.srv.WaitConverged(ctx, 2); err != nil {
		t.Fatalf("the NACK did not answer publication 2: %v", err)
	}
	c.ack(back)

	// v gets a third pod: x-0's assignment for v changes, y's does not. The client subscribes
	// to y only: it is sent nothing, and the publication converges all the same.
	grown := two(5)
	grown.Services[3].Pods = append(grown.Services[3].Pods, optimizer.Pod{Name: "v-2", Node: "n2", Address: "127.0.0.1:3003"})
	h.srv.Update(grown)
	if err := h.srv.WaitConverged(ctx, 3); err != nil {
		t.Fatalf("a change the delta client does not subscribe to never converged: %v", err)
	}
	if r := c.pendingOne(); r != nil {
		t.Errorf("the client was sent %q for a change to resources it does not subscribe to", deltaWeights(t, r))
	}
}

// TestPerTypeStreams: the per-type services (EDS here, SOTW and delta) send no type_url after
// the stream's first request, or none at all; their ACKs are tracked all the same.
func TestPerTypeStreams(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eds := endpointservice.NewEndpointDiscoveryServiceClient(conn)
	sotw, err := eds.StreamEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	delta, err := eds.DeltaEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sotw.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "x-0"}, ResourceNames: []string{"y"}}); err != nil {
		t.Fatal(err)
	}
	if err := delta.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "x-1"}, ResourceNamesSubscribe: []string{"y"}}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "both nodes registered", func() bool { return counter(t, h.srv.m.nodes) == 2 })
	round := func(pub uint64) {
		t.Helper()
		r, err := sotw.Recv()
		if err != nil {
			t.Fatal(err)
		}
		d, err := delta.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if err := h.srv.WaitPublished(ctx, pub); err != nil {
			t.Fatal(err)
		}
		if err := sotw.Send(&discovery.DiscoveryRequest{ResourceNames: []string{"y"}, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 5*time.Second, "the SOTW ACK handled", func() bool { return !awaits(h, "x-0") })
		if h.srv.converged.Load() >= pub {
			t.Fatalf("publication %d converged before the delta stream ACKed", pub)
		}
		if err := delta.Send(&discovery.DeltaDiscoveryRequest{ResponseNonce: d.GetNonce()}); err != nil {
			t.Fatal(err)
		}
		if err := h.srv.WaitConverged(ctx, pub); err != nil {
			t.Fatalf("publication %d: %v", pub, err)
		}
	}
	h.srv.Update(two(5))
	round(1)
	grown := two(5) // y-2 joins: both nodes' assignments of y change
	grown.Services[1].Pods = append(grown.Services[1].Pods, optimizer.Pod{Name: "y-2", Node: "n1", Address: "127.0.0.1:2003"})
	h.srv.Update(grown)
	round(2)
}

// awaits reports whether the server still waits for an answer from a stream of the node.
func awaits(h *harness, id string) bool {
	h.srv.nodesMu.Lock()
	n := h.srv.nodeByIDLocked(id)
	h.srv.nodesMu.Unlock()
	if n == nil {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.waiting()
}
