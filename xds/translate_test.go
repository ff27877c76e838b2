package xds

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds/internal/xdstest"
)

var (
	update           = flag.Bool("update", false, "rewrite the golden files under testdata/")
	updateAllocation = flag.Bool("update-allocation", false, "re-plan testdata/bookinfo-lata.allocation.json with the current optimizer")
)

// bookinfoAllocation is a frozen LATA allocation of testdata/bookinfo.yaml, so that the golden
// files test the translator and do not change when the solver breaks ties differently.
func bookinfoAllocation(t *testing.T, top *optimizer.Topology) *optimizer.Allocation {
	t.Helper()
	path := filepath.Join("testdata", "bookinfo-lata.allocation.json")
	if *updateAllocation {
		b, err := json.MarshalIndent(plan(t, top, optimizer.LATA), "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (create it with -update-allocation)", err)
	}
	var a optimizer.Allocation
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatal(err)
	}
	return &a
}

// The shared fixtures (xdstest), under the names these tests use.
var (
	loadTopology = xdstest.LoadTopology
	plan         = xdstest.Plan
)

// goldenJSON renders a translation: the default resources in full, and per pod the sets that
// differ from the default (the others are written as "default").
func goldenJSON(t *testing.T, tr *Translation) []byte {
	t.Helper()
	render := func(set Set) []json.RawMessage {
		var out []json.RawMessage
		for _, r := range set.Items {
			b, err := protojson.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b)
		}
		return out
	}
	node := func(n *NodeResources, diffOnly bool) map[string]any {
		out := map[string]any{}
		for i, set := range n.Sets {
			if diffOnly && set.Version == tr.Default.Sets[i].Version {
				out[SetNames[i]] = "default"
				continue
			}
			out[SetNames[i]] = map[string]any{"version": set.Version, "resources": render(set)}
		}
		return out
	}
	pods := map[string]any{}
	for name, n := range tr.Pods {
		if n == tr.Default {
			pods[name] = "default"
		} else {
			pods[name] = node(n, true)
		}
	}
	b, err := json.MarshalIndent(map[string]any{"encoding": tr.Encoding, "default": node(tr.Default, false), "pods": pods}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

func TestTranslateGolden(t *testing.T) {
	top := loadTopology(t, "testdata/bookinfo.yaml")
	alloc := bookinfoAllocation(t, top)
	for _, enc := range []Encoding{EncodingLocality, EncodingWeightedClusters} {
		t.Run(string(enc), func(t *testing.T) {
			tr, err := Translate(top, alloc, enc)
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, tr)
			got := goldenJSON(t, tr)
			path := filepath.Join("testdata", "bookinfo-lata-"+string(enc)+".golden.json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./xds -run TestTranslateGolden -update)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("%s differs (-want +got; refresh with -update):\n%s", path, diff)
			}
		})
	}
}

// checkInvariants holds every node of tr to the rules grpc-go's and Envoy's xDS validators apply:
// no weight 0, unique localities and addresses per priority, contiguous priorities, weight
// sums within uint32, routes only to clusters in the node's snapshot, and ValidateAll.
func checkInvariants(t *testing.T, tr *Translation) {
	t.Helper()
	nodes := map[string]*NodeResources{"<default>": tr.Default}
	for k, v := range tr.Pods {
		nodes[k] = v
	}
	for name, n := range nodes {
		clusters := map[string]bool{}
		for _, r := range n.Sets[ClusterSet].Items {
			clusters[r.(*cluster.Cluster).GetName()] = true
		}
		for i, set := range n.Sets {
			for _, r := range set.Items {
				if err := r.(interface{ ValidateAll() error }).ValidateAll(); err != nil {
					t.Errorf("%s %s: %v", name, SetNames[i], err)
				}
			}
		}
		for _, r := range n.Sets[EndpointSet].Items {
			cla := r.(*endpoint.ClusterLoadAssignment)
			if !clusters[cla.GetClusterName()] {
				t.Errorf("%s: assignment %q has no cluster", name, cla.GetClusterName())
			}
			locs, addrs := map[string]bool{}, map[string]bool{}
			sums := map[uint32]uint64{}
			for _, l := range cla.GetEndpoints() {
				w := l.GetLoadBalancingWeight().GetValue()
				if w == 0 {
					t.Errorf("%s: %s: locality %v has weight 0", name, cla.GetClusterName(), l.GetLocality())
				}
				sums[l.GetPriority()] += uint64(w)
				key := fmt.Sprint(l.GetPriority(), l.GetLocality().GetRegion(), l.GetLocality().GetZone(), l.GetLocality().GetSubZone())
				if locs[key] || l.GetLocality().GetSubZone() == "" {
					t.Errorf("%s: %s: duplicate or empty locality %s", name, cla.GetClusterName(), key)
				}
				locs[key] = true
				for _, e := range l.GetLbEndpoints() {
					sa := e.GetEndpoint().GetAddress().GetSocketAddress()
					a := fmt.Sprint(l.GetPriority(), sa.GetAddress(), sa.GetPortValue())
					if addrs[a] {
						t.Errorf("%s: %s: duplicate address %s", name, cla.GetClusterName(), a)
					}
					addrs[a] = true
				}
			}
			for p := uint32(0); p < uint32(len(sums)); p++ {
				if _, ok := sums[p]; !ok {
					t.Errorf("%s: %s: priorities not contiguous: %v", name, cla.GetClusterName(), sums)
				}
				if sums[p] > 1<<32-1 {
					t.Errorf("%s: %s: priority %d weights sum to %d", name, cla.GetClusterName(), p, sums[p])
				}
			}
		}
		for _, r := range n.Sets[RouteSet].Items {
			rc := r.(*route.RouteConfiguration)
			for _, vh := range rc.GetVirtualHosts() {
				for _, rt := range vh.GetRoutes() {
					a := rt.GetRoute()
					if c := a.GetCluster(); c != "" && !clusters[c] {
						t.Errorf("%s: route %q to missing cluster %q", name, rc.GetName(), c)
					}
					for _, wc := range a.GetWeightedClusters().GetClusters() {
						if wc.GetWeight().GetValue() == 0 || !clusters[wc.GetName()] {
							t.Errorf("%s: route %q: weighted cluster %q weight %d", name, rc.GetName(), wc.GetName(), wc.GetWeight().GetValue())
						}
					}
				}
			}
		}
		routes := map[string]bool{}
		for _, r := range n.Sets[RouteSet].Items {
			routes[r.(*route.RouteConfiguration).GetName()] = true
		}
		for _, r := range n.Sets[ListenerSet].Items {
			l := r.(*listener.Listener)
			m := &hcm.HttpConnectionManager{}
			if err := l.GetApiListener().GetApiListener().UnmarshalTo(m); err != nil {
				t.Fatalf("%s: listener %q: %v", name, l.GetName(), err)
			}
			if err := m.ValidateAll(); err != nil {
				t.Errorf("%s: listener %q: %v", name, l.GetName(), err)
			}
			if rn := m.GetRds().GetRouteConfigName(); !routes[rn] {
				t.Errorf("%s: listener %q refers to missing route %q", name, l.GetName(), rn)
			}
		}
	}
}

// small is a 2-caller, 3-callee topology on loopback addresses.
func small() *optimizer.Topology {
	w2 := 2.0
	return &optimizer.Topology{
		Nodes: []optimizer.Node{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}},
		Latency: []optimizer.Latency{
			{From: "n1", To: "n2", MS: 5}, {From: "n1", To: "n3", MS: 10}, {From: "n2", To: "n3", MS: 5},
		},
		Services: []optimizer.Service{
			{Name: "a", Pods: []optimizer.Pod{{Name: "a-0", Node: "n1"}, {Name: "a-1", Node: "n3"}}},
			{Name: "b", Pods: []optimizer.Pod{
				{Name: "b-0", Node: "n1", Address: "127.0.0.1:1001"},
				{Name: "b-1", Node: "n2", Address: "127.0.0.1:1002", Weight: &w2},
				{Name: "b-2", Node: "n3", Address: "127.0.0.1:1003"},
			}},
			{Name: "c", Pods: []optimizer.Pod{{Name: "c-0", Node: "n2", Address: "127.0.0.2:1001"}}},
		},
		Calls:   []optimizer.Call{{From: "a", To: "b"}, {From: "a", To: "c"}},
		Ingress: []optimizer.Ingress{{Service: "a", RPS: 100}},
	}
}

func smallAlloc() *optimizer.Allocation {
	return &optimizer.Allocation{Policy: "test", Calls: []optimizer.CallAllocation{
		{From: "a", To: "b", Routes: []optimizer.Route{
			{Caller: "a-0", Callee: "b-0", Fraction: 0.7}, {Caller: "a-0", Callee: "b-1", Fraction: 0.3},
			{Caller: "a-1", Callee: "b-2", Fraction: 1},
		}},
		{From: "a", To: "c", Routes: []optimizer.Route{
			{Caller: "a-0", Callee: "c-0", Fraction: 1}, {Caller: "a-1", Callee: "c-0", Fraction: 1},
		}},
	}}
}

func loc(p uint32, w uint32, node, pod, ip string, port uint32) *endpoint.LocalityLbEndpoints {
	return &endpoint.LocalityLbEndpoints{
		Locality:            &core.Locality{Zone: node, SubZone: pod},
		LbEndpoints:         []*endpoint.LbEndpoint{lbEndpoint(ip, port)},
		LoadBalancingWeight: wrapperspb.UInt32(w),
		Priority:            p,
	}
}

// fo is a failover endpoint with its capacity weight; failover the priority-1 locality.
func fo(ip string, port, w uint32) *endpoint.LbEndpoint {
	e := lbEndpoint(ip, port)
	e.LoadBalancingWeight = wrapperspb.UInt32(w)
	return e
}

func failover(eps ...*endpoint.LbEndpoint) *endpoint.LocalityLbEndpoints {
	return &endpoint.LocalityLbEndpoints{
		Locality:            &core.Locality{SubZone: FailoverSubZone},
		LbEndpoints:         eps,
		LoadBalancingWeight: wrapperspb.UInt32(1),
		Priority:            1,
	}
}

func TestTranslateWeights(t *testing.T) {
	top, alloc := small(), smallAlloc()
	b0 := func(p, w uint32) *endpoint.LocalityLbEndpoints { return loc(p, w, "n1", "b-0", "127.0.0.1", 1001) }
	b1 := func(p, w uint32) *endpoint.LocalityLbEndpoints { return loc(p, w, "n2", "b-1", "127.0.0.1", 1002) }
	b2 := func(p, w uint32) *endpoint.LocalityLbEndpoints { return loc(p, w, "n3", "b-2", "127.0.0.1", 1003) }
	wc := func(ws ...any) *route.RouteConfiguration {
		var cs []*route.WeightedCluster_ClusterWeight
		for i := 0; i < len(ws); i += 2 {
			cs = append(cs, clusterWeight(ws[i].(string), int64(ws[i+1].(int))))
		}
		rc := routeConfig("b", &route.RouteAction{ClusterSpecifier: &route.RouteAction_WeightedClusters{
			WeightedClusters: &route.WeightedCluster{Clusters: cs}}})
		if len(cs) < 3 { // the unreachable route keeping every pod's cluster active
			rc.VirtualHosts[0].Routes = append(rc.VirtualHosts[0].Routes, &route.Route{
				Name:  KeepClustersRoute,
				Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: ""}},
				Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_WeightedClusters{
					WeightedClusters: &route.WeightedCluster{Clusters: []*route.WeightedCluster_ClusterWeight{
						clusterWeight("b/b-0", 1), clusterWeight("b/b-1", 1), clusterWeight("b/b-2", 1)}}}}},
			})
		}
		return rc
	}
	// Capacity weights 1:2:1 → round-robin 2500/5000/2500, which is also the failover weight.
	tests := []struct {
		name string
		enc  Encoding
		node string
		get  func(*NodeResources) proto.Message
		want proto.Message
	}{
		{"locality a-0", EncodingLocality, "a-0", func(n *NodeResources) proto.Message { return n.Assignment("b") },
			&endpoint.ClusterLoadAssignment{ClusterName: "b", Endpoints: []*endpoint.LocalityLbEndpoints{b0(0, 7000), b1(0, 3000), failover(fo("127.0.0.1", 1003, 2500))}}},
		{"locality a-1", EncodingLocality, "a-1", func(n *NodeResources) proto.Message { return n.Assignment("b") },
			&endpoint.ClusterLoadAssignment{ClusterName: "b", Endpoints: []*endpoint.LocalityLbEndpoints{b2(0, 10000), failover(fo("127.0.0.1", 1001, 2500), fo("127.0.0.1", 1002, 5000))}}},
		{"locality unknown node", EncodingLocality, "", func(n *NodeResources) proto.Message { return n.Assignment("b") },
			&endpoint.ClusterLoadAssignment{ClusterName: "b", Endpoints: []*endpoint.LocalityLbEndpoints{b0(0, 2500), b1(0, 5000), b2(0, 2500)}}},
		{"locality cluster", EncodingLocality, "a-0", func(n *NodeResources) proto.Message { return n.Cluster("b") }, edsCluster("b", LBRoundRobin)},
		{"locality route", EncodingLocality, "a-0", func(n *NodeResources) proto.Message { return n.Route("b") },
			routeConfig("b", &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: "b"}})},
		{"locality listener", EncodingLocality, "a-0", func(n *NodeResources) proto.Message { return n.Listener("b") }, apiListener("b")},
		{"weighted a-0", EncodingWeightedClusters, "a-0", func(n *NodeResources) proto.Message { return n.Route("b") },
			wc("b/b-0", 7000, "b/b-1", 3000)},
		{"weighted a-1", EncodingWeightedClusters, "a-1", func(n *NodeResources) proto.Message { return n.Route("b") },
			wc("b/b-2", 10000)},
		{"weighted unknown node", EncodingWeightedClusters, "", func(n *NodeResources) proto.Message { return n.Route("b") },
			wc("b/b-0", 2500, "b/b-1", 5000, "b/b-2", 2500)},
		{"weighted pod cluster assignment", EncodingWeightedClusters, "a-0", func(n *NodeResources) proto.Message { return n.Assignment("b/b-1") },
			&endpoint.ClusterLoadAssignment{ClusterName: "b/b-1", Endpoints: []*endpoint.LocalityLbEndpoints{b1(0, 1), failover(fo("127.0.0.1", 1001, 2500), fo("127.0.0.1", 1003, 2500))}}},
		{"weighted pod cluster", EncodingWeightedClusters, "a-1", func(n *NodeResources) proto.Message { return n.Cluster("b/b-0") }, edsCluster("b/b-0", LBRoundRobin)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := Translate(top, alloc, tc.enc)
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, tr)
			n := tr.Default
			if tc.node != "" {
				n = tr.Pods[tc.node]
			}
			if diff := cmp.Diff(tc.want, tc.get(n), protocmp.Transform()); diff != "" {
				t.Errorf("-want +got:\n%s", diff)
			}
		})
	}
}

func TestTranslateServesEveryService(t *testing.T) {
	tr, err := Translate(small(), smallAlloc(), EncodingLocality)
	if err != nil {
		t.Fatal(err)
	}
	// a-0 calls b and c: both planned in its one snapshot. a has no addresses: not served.
	for _, svc := range []string{"b", "c"} {
		for _, kind := range []func(*NodeResources) proto.Message{
			func(n *NodeResources) proto.Message { return n.Listener(svc) },
			func(n *NodeResources) proto.Message { return n.Route(svc) },
			func(n *NodeResources) proto.Message { return n.Cluster(svc) },
			func(n *NodeResources) proto.Message { return n.Assignment(svc) },
		} {
			if m := kind(tr.Pods["a-0"]); m == nil || !m.ProtoReflect().IsValid() {
				t.Errorf("a-0 lacks a resource of %s", svc)
			}
		}
	}
	if tr.Pods["a-0"].Listener("a") != nil {
		t.Error("service a has no addresses but is served")
	}
	// Pods that call nothing get the round-robin default, which serves b and c too.
	if tr.Pods["b-0"] != tr.Default || tr.Default.Assignment("c") == nil {
		t.Error("callee pods should share the round-robin default")
	}
}

func TestTranslateVersions(t *testing.T) {
	top := small()
	for _, tc := range []struct {
		enc     Encoding
		changed int
	}{{EncodingLocality, EndpointSet}, {EncodingWeightedClusters, RouteSet}} {
		t.Run(string(tc.enc), func(t *testing.T) {
			a1, err := Translate(top, smallAlloc(), tc.enc)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := Translate(top, smallAlloc(), tc.enc)
			alloc := smallAlloc()
			alloc.Calls[0].Routes[0].Fraction, alloc.Calls[0].Routes[1].Fraction = 0.6, 0.4 // a-0's weights only
			a2, err := Translate(top, alloc, tc.enc)
			if err != nil {
				t.Fatal(err)
			}
			for i := range a1.Default.Sets {
				if a1.Pods["a-0"].Sets[i].Version != again.Pods["a-0"].Sets[i].Version {
					t.Errorf("%s: version not deterministic", SetNames[i])
				}
				if a1.Pods["a-1"].Sets[i].Version != a2.Pods["a-1"].Sets[i].Version {
					t.Errorf("a-1 %s: version changed, but a-1's weights did not", SetNames[i])
				}
				same := a1.Pods["a-0"].Sets[i].Version == a2.Pods["a-0"].Sets[i].Version
				if same == (i == tc.changed) {
					t.Errorf("a-0 %s: version changed=%v, want %v", SetNames[i], !same, i == tc.changed)
				}
			}
		})
	}
}

func TestTranslateRejects(t *testing.T) {
	tests := []struct {
		name   string
		top    func(*optimizer.Topology)
		alloc  func(*optimizer.Allocation)
		is     error
		naming string
	}{
		{"fractions do not sum to 1", nil, func(a *optimizer.Allocation) { a.Calls[0].Routes[0].Fraction = 0.5 },
			ErrInvalidAllocation, `caller pod "a-0": fractions sum to 0.8`},
		{"negative fraction", nil, func(a *optimizer.Allocation) { a.Calls[0].Routes[0].Fraction = -0.7 },
			ErrInvalidAllocation, "route a-0 → b-0: fraction -0.7"},
		{"unknown callee pod", nil, func(a *optimizer.Allocation) { a.Calls[0].Routes[2].Callee = "b-9" },
			ErrInvalidAllocation, `"b-9" is not a pod of "b"`},
		{"unknown caller pod", nil, func(a *optimizer.Allocation) { a.Calls[0].Routes[2].Caller = "x-1" },
			ErrInvalidAllocation, `route from "x-1": not a pod of "a"`},
		{"caller without routes", nil, func(a *optimizer.Allocation) { a.Calls[0].Routes = a.Calls[0].Routes[:2] },
			ErrInvalidAllocation, `caller pod "a-1" has no routes`},
		{"duplicate route", nil, func(a *optimizer.Allocation) {
			a.Calls[0].Routes = append(a.Calls[0].Routes, optimizer.Route{Caller: "a-0", Callee: "b-0"})
		}, ErrInvalidAllocation, "route a-0 → b-0: listed twice"},
		{"unknown service", nil, func(a *optimizer.Allocation) { a.Calls[1].To = "zz" },
			ErrInvalidAllocation, `unknown service "zz"`},
		{"missing address", func(t *optimizer.Topology) { t.Services[1].Pods[2].Address = "" }, nil,
			ErrIncompleteTopology, `pod "b-2" (service "b") has no address`},
		{"duplicate address", func(t *optimizer.Topology) { t.Services[1].Pods[2].Address = "127.0.0.1:1001" }, nil,
			ErrIncompleteTopology, `pod "b-2" (service "b"): address "127.0.0.1:1001" is also pod "b-0"'s`},
		{"host name address", func(t *optimizer.Topology) { t.Services[1].Pods[0].Address = "b0.local:80" }, nil,
			ErrIncompleteTopology, `pod "b-0" (service "b"): address "b0.local:80": want IP:PORT`},
		{"port 0", func(t *optimizer.Topology) { t.Services[2].Pods[0].Address = "10.0.0.1:0" }, nil,
			ErrIncompleteTopology, `pod "c-0" (service "c"): address "10.0.0.1:0": port 0`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			top, alloc := small(), smallAlloc()
			if tc.top != nil {
				tc.top(top)
			}
			if tc.alloc != nil {
				tc.alloc(alloc)
			}
			for _, enc := range []Encoding{EncodingLocality, EncodingWeightedClusters} {
				tr, err := Translate(top, alloc, enc)
				if err == nil || tr != nil {
					t.Fatalf("%s: accepted", enc)
				}
				if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.naming) {
					t.Errorf("%s: error %q, want %v naming %q", enc, err, tc.is, tc.naming)
				}
			}
		})
	}
	// An uncalled service with a pod lacking an address is not an error: it is not served.
	top := small()
	top.Services[0].Pods[0].Address = "127.0.0.9:1"
	if _, err := Translate(top, smallAlloc(), EncodingLocality); err != nil {
		t.Errorf("uncalled service with partial addresses: %v", err)
	}
}

func TestTranslateZeroFlowToFailover(t *testing.T) {
	// A fraction too small for one unit of WeightTotal rounds to 0: the pod goes to the
	// priority-1 failover locality instead of carrying weight 0.
	alloc := smallAlloc()
	alloc.Calls[0].Routes[0].Fraction, alloc.Calls[0].Routes[1].Fraction = 0.99999, 0.00001
	tr, err := Translate(small(), alloc, EncodingLocality)
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, tr)
	got := tr.Pods["a-0"].Assignment("b")
	var prio []string
	for _, l := range got.GetEndpoints() {
		prio = append(prio, fmt.Sprintf("%s@%d:%d", l.GetLocality().GetSubZone(), l.GetPriority(), l.GetLoadBalancingWeight().GetValue()))
	}
	if want := "b-0@0:10000 edgeflow/failover@1:1"; strings.Join(prio, " ") != want {
		t.Errorf("got %v, want %s", prio, want)
	}
}

func TestParseSidecarID(t *testing.T) {
	tests := []struct{ id, pod, ip string }{
		{"sidecar~10.1.2.3~reviews-7d9f.default~default.svc.cluster.local", "reviews-7d9f", "10.1.2.3"},
		{"sidecar~10.1.2.3~my.dotted.pod.shop~shop.svc.cluster.local", "my.dotted.pod", "10.1.2.3"},
		{"sidecar~::ffff:10.0.0.1~p.ns~ns.svc.cluster.local", "p", "10.0.0.1"},
	}
	for _, tc := range tests {
		pod, ip, ok := ParseSidecarID(tc.id)
		if !ok || pod != tc.pod || ip != tc.ip {
			t.Errorf("ParseSidecarID(%q) = %q, %q, %v; want %q, %q", tc.id, pod, ip, ok, tc.pod, tc.ip)
		}
	}
	for _, id := range []string{"reviews-0", "router~10.0.0.1~x.ns~ns.svc.cluster.local", "sidecar~1~2"} {
		if _, _, ok := ParseSidecarID(id); ok {
			t.Errorf("ParseSidecarID(%q) accepted", id)
		}
	}
}

func TestGoldenIsCanonicalJSON(t *testing.T) {
	// The golden files are re-indented protojson, so protojson's deliberately unstable spacing
	// never makes them flap.
	for _, enc := range []Encoding{EncodingLocality, EncodingWeightedClusters} {
		b, err := os.ReadFile(filepath.Join("testdata", "bookinfo-lata-"+string(enc)+".golden.json"))
		if err != nil {
			t.Skip(err)
		}
		var buf bytes.Buffer
		if err := json.Indent(&buf, bytes.TrimSpace(b), "", "  "); err != nil || buf.String() != string(bytes.TrimSpace(b)) {
			t.Errorf("%s golden file is not canonical JSON (%v)", enc, err)
		}
	}
}
