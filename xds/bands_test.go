package xds

import (
	"math"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	clientwrr "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/client_side_weighted_round_robin/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/common/v3"
	leastrequestv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	wrrlocalityv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/wrr_locality/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeflow/edgeflow/optimizer"
)

// bandsTopology: callers a-0 (n1), a-1 (n2), a-2 (n3) call b, whose pods b-0 and b-1 share
// node n1 (one band), b-2 is on n2 and b-3 (capacity 2) on n3.
func bandsTopology() *optimizer.Topology {
	w2 := 2.0
	return &optimizer.Topology{
		Nodes:   []optimizer.Node{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}},
		Latency: []optimizer.Latency{{From: "n1", To: "n2", MS: 5}, {From: "n1", To: "n3", MS: 10}, {From: "n2", To: "n3", MS: 5}},
		Services: []optimizer.Service{
			{Name: "a", Pods: []optimizer.Pod{{Name: "a-0", Node: "n1"}, {Name: "a-1", Node: "n2"}, {Name: "a-2", Node: "n3"}}},
			{Name: "b", Ports: []optimizer.Port{{Port: 9080}}, Pods: []optimizer.Pod{
				{Name: "b-0", Node: "n1", Address: "127.0.0.1:1001"},
				{Name: "b-1", Node: "n1", Address: "127.0.0.1:1002"},
				{Name: "b-2", Node: "n2", Address: "127.0.0.1:1003"},
				{Name: "b-3", Node: "n3", Address: "127.0.0.1:1004", Weight: &w2},
			}},
		},
		Calls:   []optimizer.Call{{From: "a", To: "b"}},
		Ingress: []optimizer.Ingress{{Service: "a", RPS: 100}},
	}
}

// bandsAlloc: a-0 and a-1 send 60 % to band n1 (split differently inside it) and 40 % to n2;
// a-2 sends everything to b-3.
func bandsAlloc() *optimizer.Allocation {
	return &optimizer.Allocation{Policy: "test", Calls: []optimizer.CallAllocation{{From: "a", To: "b", Routes: []optimizer.Route{
		{Caller: "a-0", Callee: "b-0", Fraction: 0.5}, {Caller: "a-0", Callee: "b-1", Fraction: 0.1}, {Caller: "a-0", Callee: "b-2", Fraction: 0.4},
		{Caller: "a-1", Callee: "b-0", Fraction: 0.1}, {Caller: "a-1", Callee: "b-1", Fraction: 0.5}, {Caller: "a-1", Callee: "b-2", Fraction: 0.4},
		{Caller: "a-2", Callee: "b-3", Fraction: 1},
	}}}}
}

func bandLoc(node string, w uint32, eps ...*endpoint.LbEndpoint) *endpoint.LocalityLbEndpoints {
	return &endpoint.LocalityLbEndpoints{Locality: &core.Locality{Zone: node, SubZone: BandSubZone}, LbEndpoints: eps, LoadBalancingWeight: wrapperspb.UInt32(w)}
}

func failoverLoc(eps ...*endpoint.LbEndpoint) *endpoint.LocalityLbEndpoints {
	return &endpoint.LocalityLbEndpoints{Locality: &core.Locality{SubZone: FailoverSubZone}, LbEndpoints: eps, LoadBalancingWeight: wrapperspb.UInt32(1), Priority: 1}
}

// TestTranslateBands: with LBBands a proxyless caller gets one locality per band it sends to,
// weighted by its plan summed over the band, every pod of the band in it weighted by capacity
// (1:1:1:2 → 2000 each, 4000), the other bands at priority 1; and the WrrLocality{LeastRequest}
// cluster, exactly.
func TestTranslateBands(t *testing.T) {
	tr, err := TranslateWith(bandsTopology(), bandsAlloc(), TranslateConfig{LBPolicy: LBBands})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, tr)
	b0, b1, b2, b3 := fo("127.0.0.1", 1001, 2000), fo("127.0.0.1", 1002, 2000), fo("127.0.0.1", 1003, 2000), fo("127.0.0.1", 1004, 4000)
	tests := []struct {
		node string
		want *endpoint.ClusterLoadAssignment
	}{
		{"a-0", &endpoint.ClusterLoadAssignment{ClusterName: "b", Endpoints: []*endpoint.LocalityLbEndpoints{
			bandLoc("n1", 6000, b0, b1), bandLoc("n2", 4000, b2), failoverLoc(b3)}}},
		{"a-1", &endpoint.ClusterLoadAssignment{ClusterName: "b", Endpoints: []*endpoint.LocalityLbEndpoints{
			bandLoc("n1", 6000, b0, b1), bandLoc("n2", 4000, b2), failoverLoc(b3)}}},
		{"a-2", &endpoint.ClusterLoadAssignment{ClusterName: "b", Endpoints: []*endpoint.LocalityLbEndpoints{
			bandLoc("n3", 10000, b3), failoverLoc(b0, b1, b2)}}},
		// Unknown nodes: round-robin, i.e. capacity summed per band.
		{"", &endpoint.ClusterLoadAssignment{ClusterName: "b", Endpoints: []*endpoint.LocalityLbEndpoints{
			bandLoc("n1", 4000, b0, b1), bandLoc("n2", 2000, b2), bandLoc("n3", 4000, b3)}}},
	}
	for _, tc := range tests {
		n := tr.Default
		if tc.node != "" {
			n = tr.Pods[tc.node]
		}
		if diff := cmp.Diff(tc.want, n.Assignment("b"), protocmp.Transform()); diff != "" {
			t.Errorf("%q: assignment -want +got:\n%s", tc.node, diff)
		}
	}
	if tr.Pods["a-0"].Sets[EndpointSet].Version != tr.Pods["a-1"].Sets[EndpointSet].Version {
		t.Error("callers whose plans differ only inside a band got different EDS versions")
	}

	wantCluster := &cluster.Cluster{
		Name:                 "b",
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: adsSource()},
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
		LoadBalancingPolicy: &cluster.LoadBalancingPolicy{Policies: []*cluster.LoadBalancingPolicy_Policy{{
			TypedExtensionConfig: &core.TypedExtensionConfig{
				Name: "envoy.load_balancing_policies.wrr_locality",
				TypedConfig: mustAny(&wrrlocalityv3.WrrLocality{EndpointPickingPolicy: &cluster.LoadBalancingPolicy{
					Policies: []*cluster.LoadBalancingPolicy_Policy{{TypedExtensionConfig: &core.TypedExtensionConfig{
						Name:        "envoy.load_balancing_policies.least_request",
						TypedConfig: mustAny(&leastrequestv3.LeastRequest{ChoiceCount: wrapperspb.UInt32(2)}),
					}}},
				}}),
			},
		}}},
	}
	for _, n := range []*NodeResources{tr.Pods["a-0"], tr.Default} {
		if diff := cmp.Diff(wantCluster, n.Cluster("b"), protocmp.Transform()); diff != "" {
			t.Errorf("cluster -want +got:\n%s", diff)
		}
	}
	// Envoy would reject it: the gRPC cluster must never reach an Envoy node.
	if err := CheckClusters([]*cluster.Cluster{tr.Default.Cluster("b")}); err == nil || !strings.Contains(err.Error(), "ClientSideWeightedRoundRobin") {
		t.Errorf("CheckClusters(gRPC bands cluster) = %v, want Envoy's WrrLocality rule", err)
	}

	rr, err := Translate(bandsTopology(), bandsAlloc(), EncodingLocality)
	if err != nil {
		t.Fatal(err)
	}
	if rr.Default.Sets[ClusterSet].Version == tr.Default.Sets[ClusterSet].Version {
		t.Error("round-robin and bands clusters share a version")
	}
}

// TestTranslateBandsEnvoy: Envoy and Istio nodes get the same bands under Istio's cluster
// names (endpoints with their capacity weights); Envoy's clusters are LEAST_REQUEST with
// locality weights and the explicit active_request_bias, and every output passes Envoy's rules.
func TestTranslateBandsEnvoy(t *testing.T) {
	tr, err := TranslateWith(bandsTopology(), bandsAlloc(), TranslateConfig{LBPolicy: LBBands})
	if err != nil {
		t.Fatal(err)
	}
	const name = "outbound|9080||b.default.svc.cluster.local"
	ep := func(port, w uint32) *endpoint.LbEndpoint { // with Istio's mTLS metadata: pods have sidecars by default
		e := istioLbEndpoint("127.0.0.1", port, true)
		e.LoadBalancingWeight = wrapperspb.UInt32(w)
		return e
	}
	b0, b1, b2, b3 := ep(1001, 2000), ep(1002, 2000), ep(1003, 2000), ep(1004, 4000)
	wantA0 := &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{
		bandLoc("n1", 6000, b0, b1), bandLoc("n2", 4000, b2), failoverLoc(b3)}}
	wantLR := &cluster.Cluster_LeastRequestLbConfig{
		ChoiceCount:       wrapperspb.UInt32(2),
		ActiveRequestBias: &core.RuntimeDouble{DefaultValue: 1, RuntimeKey: "edgeflow.bands.active_request_bias"},
	}
	for _, pod := range []string{"a-0", "a-1", "a-2", "unknown"} {
		for _, kind := range []NodeKind{Envoy, IstioSidecar} {
			n := tr.Resources(pod, kind)
			if kind == Envoy {
				if err := CheckEnvoy(n); err != nil {
					t.Errorf("%s envoy: %v", pod, err)
				}
				c := n.Cluster(name)
				if c.GetLbPolicy() != cluster.Cluster_LEAST_REQUEST || c.GetCommonLbConfig().GetLocalityWeightedLbConfig() == nil {
					t.Errorf("%s envoy: cluster lb_policy %v, common_lb_config %v; want LEAST_REQUEST, locality weighted", pod, c.GetLbPolicy(), c.GetCommonLbConfig())
				}
				if diff := cmp.Diff(wantLR, c.GetLeastRequestLbConfig(), protocmp.Transform()); diff != "" {
					t.Errorf("%s envoy: least_request_lb_config -want +got:\n%s", pod, diff)
				}
			} else if err := CheckAssignments(typed[*endpoint.ClusterLoadAssignment](n.Sets[EndpointSet])); err != nil {
				t.Errorf("%s istio: %v", pod, err)
			}
			if pod == "a-0" {
				if diff := cmp.Diff(wantA0, n.Assignment(name), protocmp.Transform()); diff != "" {
					t.Errorf("a-0 %v: assignment -want +got:\n%s", kind, diff)
				}
			}
		}
	}
}

// TestCheckClustersLbPolicy: the load-balancing rules CheckClusters encodes from Envoy's
// source (checkLbPolicy, checkEndpointPicking).
func TestCheckClustersLbPolicy(t *testing.T) {
	policy := func(name string, m proto.Message) *cluster.LoadBalancingPolicy {
		return &cluster.LoadBalancingPolicy{Policies: []*cluster.LoadBalancingPolicy_Policy{{
			TypedExtensionConfig: &core.TypedExtensionConfig{Name: name, TypedConfig: mustAny(m)}}}}
	}
	typed := func(lbp *cluster.LoadBalancingPolicy) *cluster.Cluster {
		c := edsCluster("c", LBRoundRobin)
		c.CommonLbConfig = nil
		c.LoadBalancingPolicy = lbp
		return c
	}
	bias := func(v float64) *cluster.Cluster {
		c := envoyCluster("c", LBBands)
		c.GetLeastRequestLbConfig().ActiveRequestBias.DefaultValue = v
		return c
	}
	tests := []struct {
		name string
		c    *cluster.Cluster
		want string // "" accepted
	}{
		{"bands envoy cluster", envoyCluster("c", LBBands), ""},
		{"least-request envoy cluster", envoyCluster("c", LBLeastRequest), ""},
		{"bias 0", bias(0), ""},
		{"negative bias", bias(-1), "active_request_bias -1"},
		{"NaN bias", bias(math.NaN()), "active_request_bias NaN"},
		{"infinite bias", bias(math.Inf(1)), "active_request_bias +Inf"},
		{"least_request_lb_config on round robin", func() *cluster.Cluster {
			c := envoyCluster("c", LBBands)
			c.LbPolicy = cluster.Cluster_ROUND_ROBIN
			return c
		}(), "least_request_lb_config on a ROUND_ROBIN cluster"},
		{"choice_count 1", func() *cluster.Cluster {
			c := envoyCluster("c", LBBands)
			c.GetLeastRequestLbConfig().ChoiceCount = wrapperspb.UInt32(1)
			return c
		}(), "ChoiceCount"},
		{"typed policy with locality_weighted_lb_config", func() *cluster.Cluster {
			c := typed(policy("rr", &roundrobinv3.RoundRobin{}))
			c.CommonLbConfig = edsCluster("c", LBRoundRobin).CommonLbConfig
			return c
		}(), "cannot be combined with common_lb_config"},
		{"typed policy with subsets", func() *cluster.Cluster {
			c := typed(policy("rr", &roundrobinv3.RoundRobin{}))
			c.LbSubsetConfig = &cluster.Cluster_LbSubsetConfig{}
			return c
		}(), "cannot be combined with lb_subset_config"},
		{"typed round robin without locality weights", typed(policy("rr", &roundrobinv3.RoundRobin{})), "does not weigh localities"},
		{"typed least request with locality weights", typed(policy("lr", &leastrequestv3.LeastRequest{
			LocalityLbConfig: &commonv3.LocalityLbConfig{LocalityConfigSpecifier: &commonv3.LocalityLbConfig_LocalityWeightedLbConfig_{
				LocalityWeightedLbConfig: &commonv3.LocalityLbConfig_LocalityWeightedLbConfig{}}}})), ""},
		{"unknown policy only", typed(policy("mine", &wrapperspb.StringValue{})), "no policy Envoy has a factory for"},
		{"wrr_locality of least request", typed(policy("wrr", &wrrlocalityv3.WrrLocality{EndpointPickingPolicy: policy("lr", &leastrequestv3.LeastRequest{})})),
			"Envoy takes only ClientSideWeightedRoundRobin"},
		{"wrr_locality of client-side wrr", typed(policy("wrr", &wrrlocalityv3.WrrLocality{EndpointPickingPolicy: policy("cswrr", &clientwrr.ClientSideWeightedRoundRobin{})})), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckClusters([]*cluster.Cluster{tc.c})
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("CheckClusters: %v, want none", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("CheckClusters: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestLBPolicyBandsRejects(t *testing.T) {
	_, err := TranslateWith(small(), smallAlloc(), TranslateConfig{LBPolicy: LBBands, Encoding: EncodingWeightedClusters})
	if err == nil || !strings.Contains(err.Error(), "needs the locality encoding") {
		t.Errorf("TranslateWith(bands, weighted clusters): %v, want the locality-encoding error", err)
	}
}

// TestTranslateBandsPooled: a service the allocation pools (optimizer.Allocation.Pooled) gets,
// for every caller and every node kind, one locality of all its pods weighted by capacity
// (least-request over all pods, as LBLeastRequest), whatever the routes say; the bands come back
// when it is no longer pooled, under another version; Envoy's rules pass; a pooled name that is
// not a service is an error naming it.
func TestTranslateBandsPooled(t *testing.T) {
	pooled := bandsAlloc()
	pooled.Pooled = []string{"b"}
	tr, err := TranslateWith(bandsTopology(), pooled, TranslateConfig{LBPolicy: LBBands})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, tr)
	all := &endpoint.ClusterLoadAssignment{ClusterName: "b", Endpoints: []*endpoint.LocalityLbEndpoints{{
		Locality:            &core.Locality{SubZone: AllPodsSubZone},
		LbEndpoints:         []*endpoint.LbEndpoint{fo("127.0.0.1", 1001, 2000), fo("127.0.0.1", 1002, 2000), fo("127.0.0.1", 1003, 2000), fo("127.0.0.1", 1004, 4000)},
		LoadBalancingWeight: wrapperspb.UInt32(1),
	}}}
	for _, pod := range []string{"a-0", "a-1", "a-2", ""} {
		n := tr.Default
		if pod != "" {
			n = tr.Pods[pod]
		}
		if diff := cmp.Diff(all, n.Assignment("b"), protocmp.Transform()); diff != "" {
			t.Errorf("%q: pooled assignment -want +got:\n%s", pod, diff)
		}
		if err := CheckEnvoy(tr.Resources(pod, Envoy)); err != nil {
			t.Errorf("%q envoy: %v", pod, err)
		}
		if err := CheckAssignments(typed[*endpoint.ClusterLoadAssignment](tr.Resources(pod, IstioSidecar).Sets[EndpointSet])); err != nil {
			t.Errorf("%q istio: %v", pod, err)
		}
	}
	if tr.Pods["a-0"].Sets[EndpointSet].Version != tr.Pods["a-2"].Sets[EndpointSet].Version {
		t.Error("callers of a pooled service got different EDS versions")
	}

	banded, err := TranslateWith(bandsTopology(), bandsAlloc(), TranslateConfig{LBPolicy: LBBands})
	if err != nil {
		t.Fatal(err)
	}
	if got := banded.Pods["a-2"].Assignment("b").GetEndpoints()[0].GetLocality().GetZone(); got != "n3" {
		t.Errorf("not pooled: a-2's first locality is in zone %q, want its band n3", got)
	}
	if banded.Default.Sets[EndpointSet].Version == tr.Default.Sets[EndpointSet].Version {
		t.Error("the pooled and banded round-robin assignments share a version")
	}

	pooled.Pooled = []string{"nope"}
	if _, err := TranslateWith(bandsTopology(), pooled, TranslateConfig{LBPolicy: LBBands}); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("pooled unknown service: err %v, want one naming it", err)
	}
}
