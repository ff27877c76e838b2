package server

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

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
		addr[pod] = testkit.ServeSlowEcho(t, testkit.Listen(t), pod, delay).Addr
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
		lb       xds.LBPolicy
		min, max float64 // the slow pod's share
	}{
		// The pods are in two localities of equal weight, which grpc-go picks at random
		// (weighted_target): the slow pod's share is binomial, σ = 2.5 % over 400 RPCs, and
		// the band is ±4σ (a ±2σ band failed 2 runs in 30, before and after the server's
		// SOTW watches changed).
		{xds.LBRoundRobin, 0.40, 0.60},
		{xds.LBLeastRequest, 0, 0.375},
	} {
		t.Run(string(tc.lb), func(t *testing.T) {
			const n, workers = 400, 8
			h, c := dialWhenReady(t, top, tc.lb, 2)
			counts := callConcurrently(t, c, n, workers)
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

// dialWhenReady serves top's round-robin plan under lb and dials caller c-0 to service echo;
// it returns once RPCs have reached pods pods of it (least-request picks among READY endpoints
// only, so a measurement starts when every pod is connected).
func dialWhenReady(t *testing.T, top *optimizer.Topology, lb xds.LBPolicy, pods int) (*harness, testgrpc.TestServiceClient) {
	t.Helper()
	h := startServer(t, Config{Policy: optimizer.RoundRobin, LBPolicy: lb, DebounceQuiet: -1})
	h.srv.Update(top)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.srv.WaitPublished(ctx, 1); err != nil {
		t.Fatal(err)
	}
	c := xdsConn(t, h.addr, "c-0", "echo")
	seen := map[string]bool{}
	testkit.Eventually(t, 10*time.Second, "RPCs to every pod", func() bool {
		pod, err := call(c)
		if err != nil {
			t.Fatal(err)
		}
		seen[pod] = true
		return len(seen) == pods
	})
	return h, c
}

// callConcurrently makes n RPCs on c from workers goroutines at once and counts them by the
// pod that answered.
func callConcurrently(t *testing.T, c testgrpc.TestServiceClient, n, workers int) map[string]int {
	t.Helper()
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
	return counts
}
