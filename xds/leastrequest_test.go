package xds

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeflow/edgeflow/optimizer"
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
			if err := checkEnvoyNode(n); err != nil {
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
		cfg  Config
		want string
	}{
		{"unknown", Config{LBPolicy: "fastest"}, `unknown lb policy "fastest"`},
		{"weighted clusters", Config{LBPolicy: LBLeastRequest, Encoding: EncodingWeightedClusters}, "needs the locality encoding"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewServer(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewServer: %v, want an error naming %q", err, tc.want)
			}
			_, err := TranslateWith(small(), smallAlloc(), TranslateConfig{Encoding: tc.cfg.Encoding, LBPolicy: tc.cfg.LBPolicy})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("TranslateWith: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// slowServer answers after delay.
type slowServer struct {
	testgrpc.UnimplementedTestServiceServer
	pod   string
	delay time.Duration
}

func (s slowServer) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &testgrpc.SimpleResponse{ServerId: s.pod}, nil
}

// TestRealClientLeastRequest shows that grpc-go's xDS client runs least-request on what
// LBLeastRequest serves: of two equal-weight pods, one answering 20 ms later than the other,
// the slow one gets its equal share (50 % on average) of 400 RPCs from 8 concurrent callers under
// round-robin, and far less under least-request (power of two choices with replacement over
// two pods: ~25 %, as a pick goes to the slow pod only when both draws are it).
func TestRealClientLeastRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("real xDS clients: 800 RPCs, half of them slow")
	}
	addr := map[string]string{}
	for pod, delay := range map[string]time.Duration{"fast": 0, "slow": 20 * time.Millisecond} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		g := grpc.NewServer()
		testgrpc.RegisterTestServiceServer(g, slowServer{pod: pod, delay: delay})
		done := make(chan struct{})
		go func() { defer close(done); _ = g.Serve(lis) }()
		t.Cleanup(func() { g.Stop(); <-done })
		addr[pod] = lis.Addr().String()
	}
	top := &optimizer.Topology{
		Nodes:   []optimizer.Node{{Name: "n1"}, {Name: "n2"}},
		Latency: []optimizer.Latency{{From: "n1", To: "n2", MS: 2}},
		Services: []optimizer.Service{
			{Name: "client", Pods: []optimizer.Pod{{Name: "c-0", Node: "n1"}}},
			{Name: "echo", Pods: []optimizer.Pod{{Name: "fast", Node: "n1", Address: addr["fast"]}, {Name: "slow", Node: "n2", Address: addr["slow"]}}},
		},
		Calls:   []optimizer.Call{{From: "client", To: "echo"}},
		Ingress: []optimizer.Ingress{{Service: "client", RPS: 10}},
	}
	for _, tc := range []struct {
		lb       LBPolicy
		min, max float64 // the slow pod's share
	}{
		// The pods are in two localities of equal weight, which grpc-go picks at random
		// (weighted_target): the slow pod's share is binomial, σ = 2.5 % over 400 RPCs, and
		// the band is ±4σ (a ±2σ band failed 2 runs in 30, before and after the server's
		// SOTW watches changed).
		{LBRoundRobin, 0.40, 0.60},
		{LBLeastRequest, 0, 0.375},
	} {
		t.Run(string(tc.lb), func(t *testing.T) {
			h := startServer(t, Config{Policy: optimizer.RoundRobin, LBPolicy: tc.lb, DebounceQuiet: -1})
			h.srv.Update(top)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := h.srv.WaitPublished(ctx, 1); err != nil {
				t.Fatal(err)
			}
			c := xdsConn(t, h.addr, "c-0", "echo")
			// Both pods connected: least-request picks among READY endpoints only.
			seen := map[string]bool{}
			eventually(t, 10*time.Second, "RPCs to both pods", func() bool {
				pod, err := call(c)
				if err != nil {
					t.Fatal(err)
				}
				seen[pod] = true
				return len(seen) == 2
			})
			const n, workers = 400, 8
			var mu sync.Mutex
			counts := map[string]int{}
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < n/workers; i++ {
						pod, err := call(c)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						counts[pod]++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			share := float64(counts["slow"]) / float64(n)
			t.Logf("%s: slow pod got %d of %d RPCs (%.1f%%), fast %d", tc.lb, counts["slow"], n, 100*share, counts["fast"])
			if share < tc.min || share > tc.max {
				t.Errorf("%s: slow pod's share %.1f%%, want in [%.1f%%, %.1f%%]", tc.lb, 100*share, 100*tc.min, 100*tc.max)
			}
			if got := counter(t, h.srv.m.nacks.WithLabelValues("cds")) + counter(t, h.srv.m.nacks.WithLabelValues("eds")); got != 0 {
				t.Errorf("%v NACKs from grpc-go", got)
			}
		})
	}
}
