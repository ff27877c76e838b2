package xds

import (
	"context"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

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
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	c := dialDelta(t, h.addr, "x-0")
	c.subscribe(resource.EndpointType, "y")
	eventually(t, 5*time.Second, "node registered", func() bool { return counter(t, h.srv.m.nodes) == 1 })
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
