package istio

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	xdsfake "istio.io/istio/pilot/test/xds"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	efistio "github.com/edgeflow/edgeflow/xds/istio"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// bookinfoCorner is the topology edgeflow's watcher would report for kubeObjects with both
// reviews and ratings managed (and productpage, the caller).
func bookinfoCorner(services ...string) *optimizer.Topology {
	ip := map[string]string{"productpage": "10.0.0.1", "reviews": "10.0.0.2", "ratings": "10.0.0.3"}
	top := &optimizer.Topology{
		Nodes:   []optimizer.Node{{Name: "n1"}},
		Ingress: []optimizer.Ingress{{Service: "productpage", RPS: 10}},
	}
	for _, s := range append([]string{"productpage"}, services...) {
		top.Services = append(top.Services, optimizer.Service{
			Name:  s,
			Ports: []optimizer.Port{{Name: "http", Port: 9080}},
			Pods:  []optimizer.Pod{{Name: s + "-0", Node: "n1", IP: ip[s]}},
		})
		if s != "productpage" {
			top.Calls = append(top.Calls, optimizer.Call{From: "productpage", To: s})
		}
	}
	return top
}

// startEdgeflow runs edgeflow's xDS server on 127.0.0.1:0 until the test ends.
func startEdgeflow(t *testing.T) (*xdsserver.Server, string) {
	t.Helper()
	srv, err := xdsserver.New(xdsserver.Config{DebounceQuiet: -1, Damping: -1})
	if err != nil {
		t.Fatal(err)
	}
	lis := testkit.Listen(t)
	g := grpc.NewServer()
	srv.Register(g)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = g.Serve(lis) }()
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		g.Stop()
		wg.Wait()
	})
	return srv, lis.Addr().String()
}

// TestEDSNeverOmitsAHeldAssignment: the sidecar's EDS stream to edgeflow, as Envoy opens it
// from pilot's clusters (api_config_source GRPC: the EndpointDiscoveryService, one
// subscription per managed cluster's service_name), must never see a response that omits an
// assignment it subscribed to and held (Envoy's rule 2, envoyrules_test.go) — here when a
// managed service leaves the topology while the sidecar still has its cluster.
func TestEDSNeverOmitsAHeldAssignment(t *testing.T) {
	t.Parallel()
	both := []optimizer.Service{managed[0], {Name: "ratings", Ports: []optimizer.Port{{Name: "http", Port: 9080}}}}
	filters, err := efistio.MarshalYAML(efistio.EnvoyFilters(efistio.Config{XDSAddress: "10.96.0.100:18000"}, both))
	if err != nil {
		t.Fatal(err)
	}
	pilot := xdsfake.NewFakeDiscoveryServer(t, xdsfake.FakeOptions{KubernetesObjectString: kubeObjects, ConfigString: string(filters)})
	var names []string
	for _, c := range clustersOf(sidecarClusters(t, pilot, true)) {
		if proto.Equal(c.GetEdsClusterConfig().GetEdsConfig(), efistio.EDSConfig()) {
			names = append(names, c.GetEdsClusterConfig().GetServiceName())
		}
	}
	if !slices.Equal(names, []string{ratingsCluster, reviewsCluster}) {
		t.Fatalf("pilot's clusters taking EDS from edgeflow name %v", names)
	}

	srv, addr := startEdgeflow(t)
	srv.Update(bookinfoCorner("reviews", "ratings"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.WaitPublished(ctx, 1); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := endpointservice.NewEndpointDiscoveryServiceClient(conn).StreamEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check := newEDSStream()
	node := &corev3.Node{Id: sidecarID, UserAgentName: "envoy"}
	send := func(req *discovery.DiscoveryRequest) {
		t.Helper()
		check.sotwRequest(req.GetResourceNames())
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() map[string]*endpointv3.ClusterLoadAssignment {
		t.Helper()
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*endpointv3.ClusterLoadAssignment{}
		var got []string
		for _, a := range r.GetResources() {
			cla := &endpointv3.ClusterLoadAssignment{}
			if err := a.UnmarshalTo(cla); err != nil {
				t.Fatal(err)
			}
			out[cla.GetClusterName()] = cla
			got = append(got, cla.GetClusterName())
		}
		if problems := check.sotwResponse(got); len(problems) > 0 {
			t.Errorf("edgeflow's EDS response breaks Envoy's rule:\n%s", strings.Join(problems, "\n"))
		}
		send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: names, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()})
		return out
	}
	send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: names})
	first := recv()
	for _, n := range names {
		if len(first[n].GetEndpoints()) == 0 {
			t.Fatalf("first response: no endpoints for %s: %v", n, first)
		}
	}

	// ratings leaves the topology (deleted, or no longer managed); the sidecar still has its
	// cluster until pilot's next push.
	srv.Update(bookinfoCorner("reviews"))
	if err := srv.WaitPublished(ctx, 2); err != nil {
		t.Fatal(err)
	}
	after := recv()
	if cla, ok := after[ratingsCluster]; !ok || len(cla.GetEndpoints()) != 0 {
		t.Errorf("ratings after it left: %v (present %v), want an empty assignment", cla, ok)
	}
	if len(after[reviewsCluster].GetEndpoints()) == 0 && after[reviewsCluster] != nil {
		t.Errorf("reviews emptied: %v", after[reviewsCluster])
	}
}

// TestEDSCheckCatchesAnOmission keeps rule 2's check from becoming vacuous: the response the
// old server sent when a service left (SOTW: the held name left out; delta: sent as removed)
// fails it; an empty assignment instead, or a name the sidecar no longer asks for, passes.
func TestEDSCheckCatchesAnOmission(t *testing.T) {
	t.Parallel()
	s := newEDSStream()
	s.sotwRequest([]string{"a", "b"})
	if p := s.sotwResponse([]string{"a", "b"}); len(p) != 0 {
		t.Fatalf("full response: %v", p)
	}
	if p := s.sotwResponse([]string{"a"}); len(p) != 1 || !strings.Contains(p[0], "omits b") {
		t.Errorf("SOTW response omitting a held name: problems %v, want one naming b", p)
	}
	s.sotwRequest([]string{"a"})
	if p := s.sotwResponse([]string{"a"}); len(p) != 0 {
		t.Errorf("after unsubscribing b: %v", p)
	}
	s.sotwRequest([]string{"a", "c"})
	if p := s.sotwResponse([]string{"a"}); len(p) != 0 {
		t.Errorf("a name never held (c) may be absent: %v", p)
	}

	d := newEDSStream()
	d.deltaSubscribe([]string{"a", "b"}, nil)
	if p := d.deltaResponse([]string{"a", "b"}, nil); len(p) != 0 {
		t.Fatal(p)
	}
	if p := d.deltaResponse(nil, []string{"b"}); len(p) != 1 || !strings.Contains(p[0], "removes b") {
		t.Errorf("delta response removing a held name: problems %v, want one naming b", p)
	}
	d.deltaSubscribe(nil, []string{"a"})
	if p := d.deltaResponse(nil, []string{"a"}); len(p) != 0 {
		t.Errorf("removing an unsubscribed name: %v", p)
	}
}
