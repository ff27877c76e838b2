package xds

import (
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestTranslateLeastRequest: with LBLeastRequest every caller, whatever its weights, gets the
// callee's pods as one locality (capacity-weighted endpoints) under a LEAST_REQUEST cluster
// with choice_count 2; Envoy and Istio nodes too, within Envoy's rules.
func TestTranslateLeastRequest(t *testing.T) {
	tr, err := TranslateWith(small(), smallAlloc(), TranslateConfig{LBPolicy: LBLeastRequest})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, tr)
	// Capacity weights 1:2:1 → 2500/5000/2500, as round-robin's.
	wantCLA := &endpoint.ClusterLoadAssignment{ClusterName: "b", Endpoints: []*endpoint.LocalityLbEndpoints{{
		Locality:            &core.Locality{SubZone: AllPodsSubZone},
		LbEndpoints:         []*endpoint.LbEndpoint{fo("127.0.0.1", 1001, 2500), fo("127.0.0.1", 1002, 5000), fo("127.0.0.1", 1003, 2500)},
		LoadBalancingWeight: wrapperspb.UInt32(1),
	}}}
	for _, node := range []string{"a-0", "a-1", ""} { // a-0 0.7/0.3/0, a-1 0/0/1, unknown: round-robin
		n := tr.Default
		if node != "" {
			n = tr.Pods[node]
		}
		if diff := cmp.Diff(wantCLA, n.Assignment("b"), protocmp.Transform()); diff != "" {
			t.Errorf("%q: assignment -want +got:\n%s", node, diff)
		}
		c := n.Cluster("b")
		if c.GetLbPolicy() != cluster.Cluster_LEAST_REQUEST || c.GetLeastRequestLbConfig().GetChoiceCount().GetValue() != 2 {
			t.Errorf("%q: cluster lb_policy %v, least_request_lb_config %v; want LEAST_REQUEST, choice_count 2", node, c.GetLbPolicy(), c.GetLeastRequestLbConfig())
		}
	}
	if tr.Pods["a-0"].Sets[EndpointSet].Version != tr.Pods["a-1"].Sets[EndpointSet].Version {
		t.Error("callers with different weights got different EDS versions; least-request serves them one assignment")
	}
	rr, err := Translate(small(), smallAlloc(), EncodingLocality)
	if err != nil {
		t.Fatal(err)
	}
	if rr.Default.Sets[ClusterSet].Version == tr.Default.Sets[ClusterSet].Version {
		t.Error("round-robin and least-request clusters share a version")
	}

	top := loadTopology(t, "testdata/bookinfo.yaml")
	btr, err := TranslateWith(top, bookinfoAllocation(t, top), TranslateConfig{LBPolicy: LBLeastRequest})
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []NodeKind{Envoy, IstioSidecar} {
		n := btr.Resources("reviews-1", kind)
		if kind == Envoy {
			if err := CheckEnvoy(n); err != nil {
				t.Errorf("envoy: %v", err)
			}
			for _, r := range n.Sets[ClusterSet].Items {
				if c := r.(*cluster.Cluster); c.GetLbPolicy() != cluster.Cluster_LEAST_REQUEST {
					t.Errorf("envoy: cluster %q lb_policy %v", c.GetName(), c.GetLbPolicy())
				}
			}
		}
		for _, r := range n.Sets[EndpointSet].Items {
			cla := r.(*endpoint.ClusterLoadAssignment)
			if len(cla.GetEndpoints()) != 1 || cla.GetEndpoints()[0].GetLocality().GetSubZone() != AllPodsSubZone {
				t.Errorf("%v: assignment %q: %d localities, want the one %q", kind, cla.GetClusterName(), len(cla.GetEndpoints()), AllPodsSubZone)
			}
		}
	}
}

func TestLBPolicyRejects(t *testing.T) {
	tests := []struct {
		name string
		cfg  TranslateConfig
		want string
	}{
		{"unknown", TranslateConfig{LBPolicy: "fastest"}, `unknown lb policy "fastest"`},
		{"weighted clusters", TranslateConfig{LBPolicy: LBLeastRequest, Encoding: EncodingWeightedClusters}, "needs the locality encoding"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := TranslateWith(small(), smallAlloc(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("TranslateWith: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
