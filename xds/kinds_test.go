package xds

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeflow/edgeflow/optimizer"
)

func TestClassifyNode(t *testing.T) {
	for _, tc := range []struct {
		node *core.Node
		want NodeKind
	}{
		{&core.Node{Id: "sidecar~10.0.0.1~reviews-0.default~default.svc.cluster.local", UserAgentName: "envoy"}, IstioSidecar},
		{&core.Node{Id: "sidecar~10.0.0.1~reviews-0.default~default.svc.cluster.local"}, IstioSidecar},
		{&core.Node{Id: "reviews-0", UserAgentName: "envoy"}, Envoy},
		{&core.Node{Id: "router~10.0.0.1~gw.istio-system~istio-system.svc.cluster.local", UserAgentName: "envoy"}, Envoy},
		{&core.Node{Id: "reviews-0", UserAgentName: "gRPC Go"}, ProxylessGRPC},
		{&core.Node{Id: "reviews-0"}, ProxylessGRPC},
		{&core.Node{Id: "reviews-0", UserAgentName: "Envoy"}, ProxylessGRPC}, // Envoy sends "envoy", exactly
		{nil, ProxylessGRPC},
	} {
		if got := ClassifyNode(tc.node); got != tc.want {
			t.Errorf("ClassifyNode(%v) = %v, want %v", tc.node, got, tc.want)
		}
	}
}

func bookinfoTranslation(t *testing.T, enc Encoding) (*optimizer.Topology, *Translation) {
	t.Helper()
	top := loadTopology(t, "testdata/bookinfo.yaml")
	tr, err := Translate(top, bookinfoAllocation(t, top), enc)
	if err != nil {
		t.Fatal(err)
	}
	return top, tr
}

// nodeGoldenJSON renders one node's resources in full.
func nodeGoldenJSON(t *testing.T, kind NodeKind, pod string, n *NodeResources) []byte {
	t.Helper()
	sets := map[string]any{}
	for i, set := range n.Sets {
		var rs []json.RawMessage
		for _, r := range set.Items {
			b, err := protojson.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			rs = append(rs, b)
		}
		sets[SetNames[i]] = map[string]any{"version": set.Version, "resources": rs}
	}
	b, err := json.MarshalIndent(map[string]any{"kind": kind.String(), "pod": pod, "sets": sets}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

func TestKindsGolden(t *testing.T) {
	_, tr := bookinfoTranslation(t, EncodingLocality)
	for _, kind := range []NodeKind{Envoy, IstioSidecar} {
		t.Run(kind.String(), func(t *testing.T) {
			got := nodeGoldenJSON(t, kind, "productpage-0", tr.Resources("productpage-0", kind))
			path := filepath.Join("testdata", "bookinfo-lata-"+kind.String()+".golden.json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./xds -run TestKindsGolden -update)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("%s differs (-want +got; refresh with -update):\n%s", path, diff)
			}
		})
	}
}

// checkKinds holds every pod's (and the default's) Envoy and Istio resources of tr to Envoy's
// rules and to the design: Envoy nodes CheckEnvoy; Istio nodes EDS only, named by Istio's
// cluster names, every endpoint with Istio's mTLS metadata; both carrying, per service port,
// exactly the localities, weights and priorities of the node's proxyless locality assignment.
func checkKinds(t *testing.T, top *optimizer.Topology, alloc *optimizer.Allocation, tr *Translation) {
	t.Helper()
	loc, err := Translate(top, alloc, EncodingLocality)
	if err != nil {
		t.Fatal(err)
	}
	pods := []string{""}
	for p := range tr.Pods {
		pods = append(pods, p)
	}
	slices.Sort(pods)
	for _, pod := range pods {
		proxyless := loc.Resources(pod, ProxylessGRPC)
		for _, kind := range []NodeKind{Envoy, IstioSidecar} {
			n := tr.Resources(pod, kind)
			name := fmt.Sprintf("%s node %q", kind, pod)
			if kind == Envoy {
				if err := CheckEnvoy(n); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			} else {
				for i := range EndpointSet {
					if len(n.Sets[i].Items) != 0 {
						t.Errorf("%s: %d %s resources, want none", name, len(n.Sets[i].Items), SetNames[i])
					}
				}
				if err := CheckAssignments(typed[*endpoint.ClusterLoadAssignment](n.Sets[EndpointSet])); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			}
			want := 0
			for i := range top.Services {
				s := &top.Services[i]
				base := proxyless.Assignment(s.Key())
				if base == nil {
					continue // not servable
				}
				if len(s.Ports) == 0 && kind == IstioSidecar {
					want++
					if got := n.Assignment(s.Key()); !proto.Equal(got, base) {
						t.Errorf("%s: %s has no ports: want the proxyless locality assignment, got %v", name, s.Key(), got)
					}
				}
				for k, p := range s.Ports {
					want++
					cla := n.Assignment(s.IstioClusterName(p.Port, ""))
					if cla == nil {
						t.Errorf("%s: no assignment %s", name, s.IstioClusterName(p.Port, ""))
						continue
					}
					if got, w := localityWeights(cla), localityWeights(base); got != w {
						t.Errorf("%s: %s: weights %s, want the proxyless %s", name, cla.GetClusterName(), got, w)
					}
					for _, l := range cla.GetEndpoints() {
						for _, e := range l.GetLbEndpoints() {
							if !hasIstioMTLSMetadata(e) {
								t.Errorf("%s: %s: endpoint without Istio's mTLS metadata: %v", name, cla.GetClusterName(), e)
							}
							sa := e.GetEndpoint().GetAddress().GetSocketAddress()
							target := uint32(p.TargetPort)
							if target == 0 {
								target = uint32(p.Port)
							}
							if k > 0 && sa.GetPortValue() != target {
								t.Errorf("%s: %s: endpoint port %d, want target port %d", name, cla.GetClusterName(), sa.GetPortValue(), target)
							}
						}
					}
				}
			}
			if got := len(n.Sets[EndpointSet].Items); got != want {
				t.Errorf("%s: %d assignments, want %d", name, got, want)
			}
		}
	}
}

// localityWeights renders an assignment's localities as "SUBZONE@PRIORITY:WEIGHT …" with the
// failover locality's endpoint weights.
func localityWeights(cla *endpoint.ClusterLoadAssignment) string {
	var parts []string
	for _, l := range cla.GetEndpoints() {
		s := fmt.Sprintf("%s@%d:%d", l.GetLocality().GetSubZone(), l.GetPriority(), l.GetLoadBalancingWeight().GetValue())
		if l.GetPriority() > 0 {
			for _, e := range l.GetLbEndpoints() {
				s += fmt.Sprintf("/%d", e.GetLoadBalancingWeight().GetValue())
			}
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

func hasIstioMTLSMetadata(e *endpoint.LbEndpoint) bool {
	return e.GetMetadata().GetFilterMetadata()[transportSocketMatchKey].GetFields()[tlsModeKey].GetStringValue() == tlsModeIstio
}

func TestKindsBookinfo(t *testing.T) {
	for _, enc := range []Encoding{EncodingLocality, EncodingWeightedClusters} {
		t.Run(string(enc), func(t *testing.T) {
			top, tr := bookinfoTranslation(t, enc)
			checkKinds(t, top, bookinfoAllocation(t, top), tr)
			if len(tr.Skipped) != 0 {
				t.Errorf("skipped: %v", tr.Skipped)
			}
		})
	}
}

func TestKindsIstioNames(t *testing.T) {
	_, tr := bookinfoTranslation(t, EncodingLocality)
	var names []string
	for _, r := range tr.Resources("reviews-1", IstioSidecar).Sets[EndpointSet].Items {
		names = append(names, r.(*endpoint.ClusterLoadAssignment).GetClusterName())
	}
	want := []string{
		"outbound|9080||details.default.svc.cluster.local",
		"outbound|9080||productpage.default.svc.cluster.local",
		"outbound|9080||ratings.default.svc.cluster.local",
		"outbound|9080||reviews.default.svc.cluster.local",
		"outbound|9090||ratings.default.svc.cluster.local",
	}
	if !slices.Equal(names, want) {
		t.Errorf("assignments %q, want %q", names, want)
	}
	// ratings' second port is served on its target port; its first where the pod's address is.
	cla := tr.Resources("reviews-1", IstioSidecar).Assignment("outbound|9090||ratings.default.svc.cluster.local")
	want9090 := &endpoint.ClusterLoadAssignment{ // the frozen plan splits reviews-1's calls evenly
		ClusterName: "outbound|9090||ratings.default.svc.cluster.local",
		Endpoints: []*endpoint.LocalityLbEndpoints{
			{Locality: &core.Locality{Zone: "n1", SubZone: "ratings-0"}, LbEndpoints: []*endpoint.LbEndpoint{istioLbEndpoint("10.0.0.11", 19090, true)},
				LoadBalancingWeight: wrapperspb.UInt32(3334)},
			{Locality: &core.Locality{Zone: "n3", SubZone: "ratings-1"}, LbEndpoints: []*endpoint.LbEndpoint{istioLbEndpoint("10.0.0.12", 19090, true)},
				LoadBalancingWeight: wrapperspb.UInt32(3333)},
			{Locality: &core.Locality{Zone: "n4", SubZone: "ratings-2"}, LbEndpoints: []*endpoint.LbEndpoint{istioLbEndpoint("10.0.0.13", 19090, true)},
				LoadBalancingWeight: wrapperspb.UInt32(3333)},
		},
	}
	if diff := cmp.Diff(want9090, cla, protocmp.Transform()); diff != "" {
		t.Errorf("-want +got:\n%s", diff)
	}
	if got := tr.Resources("reviews-1", IstioSidecar).Assignment("outbound|9080||ratings.default.svc.cluster.local").
		GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); got != 9080 {
		t.Errorf("first port served on %d, want the pod address's 9080", got)
	}
	// The metadata is exactly Istio's for an mTLS endpoint.
	wantMeta := `{"filterMetadata":{"envoy.transport_socket_match":{"tlsMode":"istio"}}}`
	b, err := protojson.Marshal(cla.GetEndpoints()[0].GetLbEndpoints()[0].GetMetadata())
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.ReplaceAll(string(b), " ", ""); got != wantMeta {
		t.Errorf("metadata %s, want %s", got, wantMeta)
	}
}

func TestKindsShareEntries(t *testing.T) {
	_, tr := bookinfoTranslation(t, EncodingLocality)
	istio, envoy := tr.Resources("productpage-0", IstioSidecar), tr.Resources("productpage-0", Envoy)
	if istio != tr.Resources("productpage-0", IstioSidecar) {
		t.Error("a pod's resources are built again on a second call")
	}
	if istio.Sets[EndpointSet].Version != envoy.Sets[EndpointSet].Version {
		t.Error("an Istio and an Envoy node of one pod get different assignments")
	}
	for i, r := range istio.Sets[EndpointSet].Items {
		if envoy.Sets[EndpointSet].Items[i] != r {
			t.Errorf("assignment %d is not shared between the kinds", i)
		}
	}
	// Every Envoy node shares the listener, route and cluster sets.
	other := tr.Resources("reviews-1", Envoy)
	for i := range EndpointSet {
		if &other.Sets[i].Items[0] != &envoy.Sets[i].Items[0] {
			t.Errorf("%s set is not shared between Envoy nodes", SetNames[i])
		}
	}
	// Pods that call nothing, and unknown pods, share the kind's default.
	if tr.Resources("details-0", Envoy) != tr.Resources("", Envoy) || tr.Resources("nobody", IstioSidecar) != tr.Resources("", IstioSidecar) {
		t.Error("callee-only and unknown pods should share the default")
	}
	// Assignments are shared by equal weights: productpage-0 does not call ratings, so it has
	// the round-robin one every such node has.
	const ratings = "outbound|9080||ratings.default.svc.cluster.local"
	if envoy.Assignment(ratings) != tr.Resources("", Envoy).Assignment(ratings) {
		t.Error("round-robin assignments of services a pod does not call are not shared")
	}
	// Concurrent first calls (the server resolves nodes from many streams) agree.
	tr2 := func() *Translation { _, tr := bookinfoTranslation(t, EncodingLocality); return tr }()
	var wg sync.WaitGroup
	got := make([]*NodeResources, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = tr2.Resources("reviews-2", NodeKind(1+i%2))
		}()
	}
	wg.Wait()
	for i := range got {
		if got[i] != got[i%2] {
			t.Errorf("concurrent call %d got other resources", i)
		}
	}
}

func TestKindsServicesWithoutPorts(t *testing.T) {
	// small() has no ports: Envoy nodes get nothing, Istio nodes the assignments under the
	// service key — the very entries proxyless nodes get, so an Istio node's version is theirs.
	top := small()
	tr, err := Translate(top, smallAlloc(), EncodingLocality)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{
		`service "b" has no ports: Envoy nodes do not get it, Istio nodes get its assignment under the service key`,
		`service "c" has no ports: Envoy nodes do not get it, Istio nodes get its assignment under the service key`,
	}; !slices.Equal(tr.Skipped, want) {
		t.Errorf("Skipped = %q, want %q", tr.Skipped, want)
	}
	for _, pod := range []string{"a-0", "a-1", "b-0", ""} {
		e := tr.Resources(pod, Envoy)
		for i, set := range e.Sets {
			if len(set.Items) != 0 {
				t.Errorf("Envoy node %q: %d %s resources, want none", pod, len(set.Items), SetNames[i])
			}
		}
		if got, want := tr.Resources(pod, IstioSidecar).Sets[EndpointSet].Version, tr.Resources(pod, ProxylessGRPC).Sets[EndpointSet].Version; got != want {
			t.Errorf("Istio node %q: EDS version %s, want the proxyless %s", pod, got, want)
		}
	}
	checkKinds(t, top, smallAlloc(), tr)
}

func TestKindsSkipPorts(t *testing.T) {
	top := small()
	top.Services[1].Ports = []optimizer.Port{{Name: "http", Port: 80}, {Name: "other", Port: 81, TargetPort: 8081}, {Name: "again", Port: 80}}
	top.Services[2].Ports = []optimizer.Port{{Name: "http", Port: 80, TargetPort: 8080}}
	tr, err := Translate(top, smallAlloc(), EncodingLocality)
	if err != nil {
		t.Fatal(err)
	}
	// b's pods share 127.0.0.1, which only the first port (the pods' addresses) tells apart.
	if want := []string{
		`service "b": port 81: pods "b-0" and "b-1" would share endpoint 127.0.0.1:8081: not served to Envoy and Istio nodes`,
		`service "b": port 80 listed twice: the second is not served`,
	}; !slices.Equal(tr.Skipped, want) {
		t.Errorf("Skipped = %q, want %q", tr.Skipped, want)
	}
	checkKinds(t, func() *optimizer.Topology {
		t := top.Clone()
		t.Services[1].Ports = t.Services[1].Ports[:1]
		return t
	}(), smallAlloc(), tr)
	// c's only port serves its pod where its address is (Service.Endpoint), not its target.
	cla := tr.Resources("a-0", Envoy).Assignment("outbound|80||c.default.svc.cluster.local")
	if got := cla.GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); got != 1001 {
		t.Errorf("c-0 on port %d, want its address's 1001", got)
	}
}

func TestEnvoySharedPort(t *testing.T) {
	// Two services named web (namespaces a and b) and api (a) share port 80; web also has 81.
	top := &optimizer.Topology{
		Nodes: []optimizer.Node{{Name: "n1"}},
		Services: []optimizer.Service{
			{Name: "web", Namespace: "a", Ports: []optimizer.Port{{Port: 80}, {Name: "admin", Port: 81}}, Pods: []optimizer.Pod{{Name: "w", Node: "n1", IP: "10.0.0.1"}}},
			{Name: "web", Namespace: "b", Ports: []optimizer.Port{{Port: 80, TargetPort: 8080}}, Pods: []optimizer.Pod{{Name: "w", Node: "n1", IP: "10.0.0.2"}}},
			{Name: "api", Namespace: "a", Ports: []optimizer.Port{{Port: 80}}, Pods: []optimizer.Pod{{Name: "x", Node: "n1", IP: "10.0.0.3"}}},
		},
	}
	tr, err := Translate(top, &optimizer.Allocation{}, EncodingLocality)
	if err != nil {
		t.Fatal(err)
	}
	n := tr.Resources("", Envoy)
	if err := CheckEnvoy(n); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rc := range typed[*route.RouteConfiguration](n.Sets[RouteSet]) {
		for _, vh := range rc.GetVirtualHosts() {
			got = append(got, fmt.Sprintf("%s %s → %s: %s", rc.GetName(), vh.GetName(), vh.GetRoutes()[0].GetRoute().GetCluster(), strings.Join(vh.GetDomains(), " ")))
		}
	}
	want := []string{
		"80 api.a.svc.cluster.local:80 → outbound|80||api.a.svc.cluster.local: api api:80 api.a api.a:80 api.a.svc api.a.svc:80 api.a.svc.cluster.local api.a.svc.cluster.local:80",
		"80 web.a.svc.cluster.local:80 → outbound|80||web.a.svc.cluster.local: web.a web.a:80 web.a.svc web.a.svc:80 web.a.svc.cluster.local web.a.svc.cluster.local:80",
		"80 web.b.svc.cluster.local:80 → outbound|80||web.b.svc.cluster.local: web.b web.b:80 web.b.svc web.b.svc:80 web.b.svc.cluster.local web.b.svc.cluster.local:80",
		"81 web.a.svc.cluster.local:81 → outbound|81||web.a.svc.cluster.local: web web:81 web.a web.a:81 web.a.svc web.a.svc:81 web.a.svc.cluster.local web.a.svc.cluster.local:81",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("virtual hosts (-want +got):\n%s", diff)
	}
	var ls []string
	for _, l := range typed[*listener.Listener](n.Sets[ListenerSet]) {
		sa := l.GetAddress().GetSocketAddress()
		ls = append(ls, fmt.Sprintf("%s %s:%d", l.GetName(), sa.GetAddress(), sa.GetPortValue()))
	}
	if want := []string{"127.0.0.1_80 127.0.0.1:80", "127.0.0.1_81 127.0.0.1:81"}; !slices.Equal(ls, want) {
		t.Errorf("listeners %q, want %q", ls, want)
	}
	// web.b's endpoint is on its target port.
	if got := n.Assignment("outbound|80||web.b.svc.cluster.local").GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().
		GetAddress().GetSocketAddress().GetPortValue(); got != 8080 {
		t.Errorf("web.b on %d, want 8080", got)
	}
}

// TestKindsRandom holds random topologies with ports to the rules, every pod, every kind,
// both encodings (the Envoy and Istio resources built on demand are not validated when built).
func TestKindsRandom(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		top := &optimizer.Topology{}
		nodes := 1 + r.IntN(4)
		for i := range nodes {
			top.Nodes = append(top.Nodes, optimizer.Node{Name: fmt.Sprintf("n%d", i)})
			for j := range i {
				top.Latency = append(top.Latency, optimizer.Latency{From: fmt.Sprintf("n%d", j), To: fmt.Sprintf("n%d", i), MS: float64(1 + r.IntN(20))})
			}
		}
		nsvc := 2 + r.IntN(4)
		ip := 0
		for i := range nsvc {
			s := optimizer.Service{Name: fmt.Sprintf("s%d", i), Namespace: []string{"", "ns1"}[r.IntN(2)]}
			for k := range r.IntN(3) {
				s.Ports = append(s.Ports, optimizer.Port{Name: fmt.Sprintf("p%d", k), Port: int32([]int{80, 8080, 9090}[r.IntN(3)] + k), TargetPort: int32(r.IntN(2) * (10000 + k))})
			}
			for j := range 1 + r.IntN(5) {
				ip++
				w := float64(1 + r.IntN(3))
				s.Pods = append(s.Pods, optimizer.Pod{Name: fmt.Sprintf("s%d-%d", i, j), Node: fmt.Sprintf("n%d", r.IntN(nodes)),
					IP: fmt.Sprintf("10.0.%d.%d", ip/250, ip%250+1), Address: fmt.Sprintf("10.0.%d.%d:%d", ip/250, ip%250+1, 7000+j), Weight: &w})
			}
			top.Services = append(top.Services, s)
		}
		for i := 1; i < nsvc; i++ {
			top.Calls = append(top.Calls, optimizer.Call{From: top.Services[r.IntN(i)].Key(), To: top.Services[i].Key()})
		}
		top.Ingress = []optimizer.Ingress{{Service: top.Services[0].Key(), RPS: 100}}
		alloc := plan(t, top, optimizer.LATA)
		for _, enc := range []Encoding{EncodingLocality, EncodingWeightedClusters} {
			t.Run(fmt.Sprintf("seed%d/%s", seed, enc), func(t *testing.T) {
				tr, err := Translate(top, alloc, enc)
				if err != nil {
					t.Fatal(err)
				}
				checkKinds(t, top, alloc, tr)
				for pod := range tr.Pods {
					for _, kind := range []NodeKind{Envoy, IstioSidecar} {
						for i, set := range tr.Resources(pod, kind).Sets {
							for _, r := range set.Items {
								if err := r.(validator).ValidateAll(); err != nil {
									t.Errorf("%s %s %s: %v", kind, pod, SetNames[i], err)
								}
							}
						}
					}
				}
			})
		}
	}
}

// extraLocality is a copy of cla's first locality under another sub_zone, endpoint and weight.
func extraLocality(cla *endpoint.ClusterLoadAssignment, subZone string, w uint32) *endpoint.LocalityLbEndpoints {
	l := proto.Clone(cla.Endpoints[0]).(*endpoint.LocalityLbEndpoints)
	l.Locality = &core.Locality{Zone: l.GetLocality().GetZone(), SubZone: subZone}
	l.LbEndpoints = []*endpoint.LbEndpoint{lbEndpoint("10.9.9.9", 1)}
	l.LoadBalancingWeight = wrapperspb.UInt32(w)
	return l
}

// grpcSource is a config source on its own gRPC stream to a cluster, as Istio's EnvoyFilter
// points EDS at edgeflow: valid for Envoy, but not the ADS that edgeflow's resources use.
func grpcSource() *core.ConfigSource {
	return &core.ConfigSource{ResourceApiVersion: core.ApiVersion_V3, ConfigSourceSpecifier: &core.ConfigSource_ApiConfigSource{
		ApiConfigSource: &core.ApiConfigSource{ApiType: core.ApiConfigSource_GRPC, TransportApiVersion: core.ApiVersion_V3,
			GrpcServices: []*core.GrpcService{{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: "edgeflow-xds"}}}}}}}
}

// TestEnvoyChecksReject breaks a valid plain Envoy node one rule at a time.
func TestEnvoyChecksReject(t *testing.T) {
	_, tr := bookinfoTranslation(t, EncodingLocality)
	valid := tr.Resources("productpage-0", Envoy)
	if err := CheckEnvoy(valid); err != nil {
		t.Fatal(err)
	}
	clone := func(set int) []proto.Message {
		var out []proto.Message
		for _, r := range valid.Sets[set].Items {
			out = append(out, proto.Clone(r))
		}
		return out
	}
	hcmOf := func(l *listener.Listener) *hcm.HttpConnectionManager {
		m := &hcm.HttpConnectionManager{}
		if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	setHCM := func(l *listener.Listener, m *hcm.HttpConnectionManager) {
		l.GetFilterChains()[0].GetFilters()[0].GetConfigType().(*listener.Filter_TypedConfig).TypedConfig = mustAny(m)
	}
	tests := []struct {
		name   string
		set    int
		break_ func(ms []proto.Message) []proto.Message
		naming string
	}{
		{"duplicate listener name", ListenerSet, func(ms []proto.Message) []proto.Message {
			ms[1].(*listener.Listener).Name = ms[0].(*listener.Listener).Name
			return ms
		}, "duplicate name"},
		{"duplicate listener address", ListenerSet, func(ms []proto.Message) []proto.Message {
			ms[1].(*listener.Listener).Address = ms[0].(*listener.Listener).Address
			return ms
		}, "address TCP 127.0.0.1:9080 is also listener"},
		{"api_listener", ListenerSet, func(ms []proto.Message) []proto.Message {
			return append(ms, apiListener("reviews"))
		}, "api_listener"},
		{"no filter chains", ListenerSet, func(ms []proto.Message) []proto.Message {
			ms[0].(*listener.Listener).FilterChains = nil
			return ms
		}, "no filter chains"},
		{"router not last", ListenerSet, func(ms []proto.Message) []proto.Message {
			l := ms[0].(*listener.Listener)
			m := hcmOf(l)
			m.HttpFilters = append(m.HttpFilters, &hcm.HttpFilter{Name: "envoy.filters.http.cors", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&core.Metadata{})}})
			setHCM(l, m)
			return ms
		}, "the router must be the last filter"},
		{"RDS not from ADS", ListenerSet, func(ms []proto.Message) []proto.Message {
			l := ms[0].(*listener.Listener)
			m := hcmOf(l)
			m.GetRds().ConfigSource = grpcSource()
			setHCM(l, m)
			return ms
		}, "RDS config source is not ADS"},
		{"duplicate domain", RouteSet, func(ms []proto.Message) []proto.Message {
			vhs := ms[0].(*route.RouteConfiguration).VirtualHosts
			vhs[1].Domains = append(vhs[1].Domains, vhs[0].Domains[0])
			return ms
		}, `domain "details" in virtual hosts`},
		{"duplicate virtual host", RouteSet, func(ms []proto.Message) []proto.Message {
			vhs := ms[0].(*route.RouteConfiguration).VirtualHosts
			vhs[1].Name = vhs[0].Name
			return ms
		}, "duplicate virtual host"},
		{"weighted clusters summing to 0", RouteSet, func(ms []proto.Message) []proto.Message {
			r := ms[0].(*route.RouteConfiguration).VirtualHosts[0].Routes[0].GetRoute()
			r.ClusterSpecifier = &route.RouteAction_WeightedClusters{WeightedClusters: &route.WeightedCluster{
				Clusters: []*route.WeightedCluster_ClusterWeight{{Name: "x", Weight: wrapperspb.UInt32(0)}}}}
			return ms
		}, "weighted clusters sum to 0"},
		{"static cluster", ClusterSet, func(ms []proto.Message) []proto.Message {
			ms[0].(*cluster.Cluster).ClusterDiscoveryType = &cluster.Cluster_Type{Type: cluster.Cluster_STATIC}
			return ms
		}, "not EDS"},
		{"EDS not from ADS", ClusterSet, func(ms []proto.Message) []proto.Message {
			ms[0].(*cluster.Cluster).EdsClusterConfig.EdsConfig = grpcSource()
			return ms
		}, "EDS config is not ADS"},
		{"no locality weights", ClusterSet, func(ms []proto.Message) []proto.Message {
			ms[0].(*cluster.Cluster).CommonLbConfig = nil
			return ms
		}, "no locality_weighted_lb_config"},
		{"duplicate cluster", ClusterSet, func(ms []proto.Message) []proto.Message {
			return append(ms, ms[0])
		}, "duplicate name"},
		{"locality weight 0", EndpointSet, func(ms []proto.Message) []proto.Message {
			ms[0].(*endpoint.ClusterLoadAssignment).Endpoints[0].LoadBalancingWeight = nil
			return ms
		}, "no weight"},
		{"weights over 2^32-1", EndpointSet, func(ms []proto.Message) []proto.Message {
			cla := ms[0].(*endpoint.ClusterLoadAssignment)
			cla.Endpoints[0].LoadBalancingWeight = wrapperspb.UInt32(1 << 31)
			cla.Endpoints = append(cla.Endpoints, extraLocality(cla, "extra", 1<<31))
			return ms
		}, "locality weights sum to 4294967296"},
		{"duplicate locality", EndpointSet, func(ms []proto.Message) []proto.Message {
			cla := ms[0].(*endpoint.ClusterLoadAssignment)
			cla.Endpoints = append(cla.Endpoints, extraLocality(cla, cla.Endpoints[0].GetLocality().GetSubZone(), 1))
			return ms
		}, "twice in one priority"},
		{"duplicate address", EndpointSet, func(ms []proto.Message) []proto.Message {
			cla := ms[0].(*endpoint.ClusterLoadAssignment)
			l := extraLocality(cla, "extra", 1)
			l.LbEndpoints = cla.Endpoints[0].LbEndpoints
			cla.Endpoints = append(cla.Endpoints, l)
			return ms
		}, "twice in one priority"},
		{"priority gap", EndpointSet, func(ms []proto.Message) []proto.Message {
			for _, cla := range ms {
				for _, l := range cla.(*endpoint.ClusterLoadAssignment).Endpoints {
					if l.GetPriority() == 1 {
						l.Priority = 2
					}
				}
			}
			return ms
		}, "not contiguous"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckResponse(tc.set, tc.break_(clone(tc.set)))
			if err == nil || !strings.Contains(err.Error(), tc.naming) {
				t.Errorf("error %v, want one naming %q", err, tc.naming)
			}
		})
	}
	// The references across types.
	n := *valid
	n.Sets[ClusterSet] = makeSet(nil)
	if err := CheckEnvoy(&n); err == nil || !strings.Contains(err.Error(), "named by a route, not served") {
		t.Errorf("route to a missing cluster: %v", err)
	}
}

// TestKindsTLSModeOnlyForSidecarPods: as istiod, only the endpoints of pods with a sidecar
// carry tlsMode "istio" (a pod without one could not answer the mTLS handshake the metadata
// selects); a topology file that does not say means a sidecar.
func TestKindsTLSModeOnlyForSidecarPods(t *testing.T) {
	top := loadTopology(t, "testdata/bookinfo.yaml")
	no, yes := false, true
	ratings := -1
	for i := range top.Services {
		if top.Services[i].Name == "ratings" {
			ratings = i
		}
	}
	if ratings < 0 || len(top.Services[ratings].Pods) != 3 {
		t.Fatal("bookinfo.yaml: want ratings with 3 pods")
	}
	pods := top.Services[ratings].Pods
	pods[0].Sidecar, pods[1].Sidecar = &no, &yes // pods[2] says nothing
	tr, err := Translate(top, bookinfoAllocation(t, top), EncodingLocality)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"ratings-0": false, "ratings-1": true, "ratings-2": true}
	for _, kind := range []NodeKind{IstioSidecar, Envoy} {
		for _, caller := range []string{"reviews-1", ""} { // planned and round-robin assignments
			for _, name := range []string{"outbound|9080||ratings.default.svc.cluster.local", "outbound|9090||ratings.default.svc.cluster.local"} {
				cla := tr.Resources(caller, kind).Assignment(name)
				if cla == nil {
					t.Fatalf("%v %q: no assignment %s", kind, caller, name)
				}
				seen := 0
				for _, l := range cla.GetEndpoints() {
					for _, e := range l.GetLbEndpoints() {
						pod := l.GetLocality().GetSubZone()
						if l.GetPriority() > 0 {
							continue // the failover locality: checked below by address
						}
						seen++
						if got := hasIstioMTLSMetadata(e); got != want[pod] {
							t.Errorf("%v %q %s: pod %s tlsMode metadata %v, want %v", kind, caller, name, pod, got, want[pod])
						}
						if !want[pod] && e.GetMetadata() != nil {
							t.Errorf("%v %q %s: pod %s without a sidecar has metadata %v", kind, caller, name, pod, e.GetMetadata())
						}
					}
				}
				if seen == 0 {
					t.Errorf("%v %q %s: no priority-0 endpoint", kind, caller, name)
				}
			}
		}
	}
	// The change reaches the wire: the same topology with every pod a sidecar pod gives other
	// assignment versions (content-addressed), so a node is pushed the change.
	top2 := loadTopology(t, "testdata/bookinfo.yaml")
	tr2, err := Translate(top2, bookinfoAllocation(t, top2), EncodingLocality)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Resources("reviews-1", IstioSidecar).Sets[EndpointSet].Version == tr2.Resources("reviews-1", IstioSidecar).Sets[EndpointSet].Version {
		t.Error("a pod losing its sidecar does not change the assignments' version")
	}
}

// TestKindsClusterDomain: the cluster's DNS domain names Istio's clusters and plain Envoy's
// virtual hosts; nothing says cluster.local when another domain is given.
func TestKindsClusterDomain(t *testing.T) {
	top := loadTopology(t, "testdata/bookinfo.yaml")
	tr, err := TranslateWith(top, bookinfoAllocation(t, top), TranslateConfig{ClusterDomain: "edge.example"})
	if err != nil {
		t.Fatal(err)
	}
	istio := tr.Resources("reviews-1", IstioSidecar)
	if cla := istio.Assignment("outbound|9080||ratings.default.svc.edge.example"); cla == nil {
		t.Error("no assignment outbound|9080||ratings.default.svc.edge.example")
	}
	envoy := tr.Resources("reviews-1", Envoy)
	for _, set := range envoy.Sets {
		for _, r := range set.Items {
			b, err := protojson.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), "cluster.local") {
				t.Errorf("%s says cluster.local with ClusterDomain edge.example", cache.GetResourceName(r))
			}
		}
	}
	for _, bad := range []string{"Cluster.Local", "a..b", "-x.local", "x_y"} {
		if _, err := TranslateWith(top, bookinfoAllocation(t, top), TranslateConfig{ClusterDomain: bad}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("cluster domain %q: err %v, want one naming it", bad, err)
		}
	}
	found := false
	for _, r := range envoy.Sets[RouteSet].Items {
		if rc := r.(*route.RouteConfiguration); rc.GetName() == RouteName(9080) {
			for _, vh := range rc.GetVirtualHosts() {
				if slices.Contains(vh.GetDomains(), "ratings.default.svc.edge.example:9080") {
					found = true
				}
			}
		}
	}
	if !found {
		t.Error("no virtual host matches ratings.default.svc.edge.example:9080")
	}
}
