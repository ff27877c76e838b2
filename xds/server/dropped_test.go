package server

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
)

const (
	detailsCLA = "outbound|9080||details.default.svc.cluster.local"
	reviewsCLA = "outbound|9080||reviews.default.svc.cluster.local"
	ppSidecar  = "sidecar~10.0.0.1~productpage-0.default~default.svc.cluster.local"
)

// withoutService is top without service name and the calls to and from it.
func withoutService(top *optimizer.Topology, name string) *optimizer.Topology {
	out := *top
	out.Services = slices.DeleteFunc(slices.Clone(top.Services), func(s optimizer.Service) bool { return s.Name == name })
	out.Calls = slices.DeleteFunc(slices.Clone(top.Calls), func(c optimizer.Call) bool { return c.From == name || c.To == name })
	return &out
}

// decodeCLAs decodes assignments by name.
func decodeCLAs(t *testing.T, rs []*anypb.Any) map[string]*endpoint.ClusterLoadAssignment {
	t.Helper()
	out := map[string]*endpoint.ClusterLoadAssignment{}
	for _, a := range rs {
		cla := &endpoint.ClusterLoadAssignment{}
		if err := a.UnmarshalTo(cla); err != nil {
			t.Fatal(err)
		}
		out[cla.GetClusterName()] = cla
	}
	return out
}

// nodeEDSNames is what the server's current EDS set for node id holds.
func nodeEDSNames(t *testing.T, s *Server, id string) []string {
	t.Helper()
	snap, err := s.cached(id)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for name := range snap.GetResources(resource.EndpointType) {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// TestDroppedServiceGetsAnEmptyAssignment: when a service leaves the topology, a sidecar that
// held and still subscribes to its assignment is sent that assignment empty (cluster_name set,
// no endpoints), as istiod does, instead of a response that omits it — which Envoy ignores,
// keeping the stale endpoints (EdsClusterImpl::onConfigUpdate). The others' assignments are
// unchanged; once the sidecar unsubscribes, the empty assignment is no longer kept. SOTW and
// delta, over real ADS streams.
func TestDroppedServiceGetsAnEmptyAssignment(t *testing.T) {
	t.Parallel()
	for _, delta := range []bool{false, true} {
		name := "sotw"
		if delta {
			name = "delta"
		}
		t.Run(name, func(t *testing.T) {
			top := loadTopology(t, bookinfoPath)
			h := startServer(t, Config{DebounceQuiet: -1})
			h.srv.Update(top)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := h.srv.WaitPublished(ctx, 1); err != nil {
				t.Fatal(err)
			}

			// recv returns the assignments of the next response, ACKed; for delta also the
			// names it removed.
			var recv func() (map[string]*endpoint.ClusterLoadAssignment, []string)
			var unsubscribeDetails func()
			if delta {
				c := dialDelta(t, h.addr, ppSidecar)
				c.subscribe(resource.EndpointType, detailsCLA, reviewsCLA)
				recv = func() (map[string]*endpoint.ClusterLoadAssignment, []string) {
					r := c.next()
					c.ack(r)
					var rs []*anypb.Any
					for _, res := range r.GetResources() {
						rs = append(rs, res.GetResource())
					}
					return decodeCLAs(t, rs), r.GetRemovedResources()
				}
				unsubscribeDetails = func() {
					c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesUnsubscribe: []string{detailsCLA}})
				}
			} else {
				c := dialADS(t, h.addr, ppSidecar)
				c.subscribe(resource.EndpointType, detailsCLA, reviewsCLA)
				recv = func() (map[string]*endpoint.ClusterLoadAssignment, []string) {
					r := c.next()
					c.ack(r)
					return decodeCLAs(t, r.GetResources()), nil
				}
				unsubscribeDetails = func() { c.subscribe(resource.EndpointType, reviewsCLA) }
			}

			first, _ := recv()
			if len(first[detailsCLA].GetEndpoints()) == 0 || len(first[reviewsCLA].GetEndpoints()) == 0 {
				t.Fatalf("first response: %v", first)
			}
			if err := h.srv.WaitConverged(ctx, 1); err != nil {
				t.Fatal(err)
			}

			// details leaves the topology.
			h.srv.Update(withoutService(top, "details"))
			if err := h.srv.WaitPublished(ctx, 2); err != nil {
				t.Fatal(err)
			}
			got, removed := recv()
			cla, ok := got[detailsCLA]
			switch {
			case !ok:
				t.Fatalf("the response after details left omits its assignment (Envoy would keep the stale endpoints); got %v, removed %v", slices.Collect(maps.Keys(got)), removed)
			case cla.GetClusterName() != detailsCLA || len(cla.GetEndpoints()) != 0 || cla.GetPolicy() != nil:
				t.Errorf("details' assignment after it left: %v, want only its cluster_name", cla)
			}
			if slices.Contains(removed, detailsCLA) {
				t.Errorf("delta: details sent as removed (Envoy ignores removed_resources for EDS)")
			}
			if r, ok := got[reviewsCLA]; ok && len(r.GetEndpoints()) == 0 {
				t.Errorf("reviews' assignment emptied too: %v", r)
			}
			if err := h.srv.WaitConverged(ctx, 2); err != nil {
				t.Fatal(err)
			}

			// The empty assignment is kept while subscribed (a later publication keeps it) …
			top3 := withoutService(top, "details")
			top3.Ingress = []optimizer.Ingress{{Service: "productpage", RPS: 50}}
			h.srv.Update(top3)
			if err := h.srv.WaitPublished(ctx, 3); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, 10*time.Second, "the node's sets after publication 3", func() bool {
				return slices.Contains(nodeEDSNames(t, h.srv, ppSidecar), detailsCLA)
			})
			// … and goes once the sidecar no longer asks for it.
			unsubscribeDetails()
			testkit.Eventually(t, 10*time.Second, "the empty assignment to go after the unsubscription", func() bool {
				return !slices.Contains(nodeEDSNames(t, h.srv, ppSidecar), detailsCLA)
			})
			if names := nodeEDSNames(t, h.srv, ppSidecar); !slices.Contains(names, reviewsCLA) {
				t.Errorf("after the unsubscription the node's assignments are %v", names)
			}
		})
	}
}
