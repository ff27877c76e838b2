package live

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/resolver"
	xdsclient "google.golang.org/grpc/xds"

	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// backend is a real gRPC server standing for one callee pod, on its own loopback IP.
type backend struct {
	pod    string
	ip     string
	served atomic.Int64
	first  atomic.Int64 // unix nanos of the first RPC served
	last   atomic.Int64
}

type echo struct {
	testgrpc.UnimplementedTestServiceServer
	b *backend
}

func (e echo) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	now := time.Now().UnixNano()
	if e.b.served.Add(1) == 1 {
		e.b.first.Store(now)
	}
	e.b.last.Store(now)
	return &testgrpc.SimpleResponse{ServerId: e.b.pod}, nil
}

// startBackends starts one gRPC server per pod inside the pod namespace podNS (198.18.1.0/24
// on its loopback), pod i on 198.18.1.(i+2), all on one port (a Service's target port is the
// same for all its pods). Stopped at cleanup.
func startBackends(t *testing.T, podNS *testbed.Namespace, pods ...string) (map[string]*backend, int32) {
	t.Helper()
	for attempt := 0; attempt < 20; attempt++ {
		var lis []net.Listener
		port := 0
		ok := true
		for i := range pods {
			l, err := podNS.Listen("tcp", net.JoinHostPort(podIP(i+2), strconv.Itoa(port)))
			if err != nil {
				ok = false
				break
			}
			port = l.Addr().(*net.TCPAddr).Port
			lis = append(lis, l)
		}
		if !ok {
			for _, l := range lis {
				l.Close()
			}
			continue
		}
		out := map[string]*backend{}
		for i, p := range pods {
			b := &backend{pod: p, ip: podIP(i + 2)}
			out[p] = b
			g := grpc.NewServer()
			testgrpc.RegisterTestServiceServer(g, echo{b: b})
			done := make(chan struct{})
			l := lis[i]
			go func() { defer close(done); _ = g.Serve(l) }()
			t.Cleanup(func() { g.Stop(); <-done })
		}
		return out, int32(port)
	}
	t.Fatal("no free port shared by the backends' addresses")
	return nil, 0
}

// podIP is the address of the i-th pod in the pod namespace.
func podIP(i int) string { return "198.18.1." + strconv.Itoa(i) }

// xdsServer runs edgeflow's xDS server fed by a source; returns its address. Stopped at cleanup.
func xdsServer(t *testing.T, cfg xdsserver.Config, run func(context.Context, watcher.Listener) error) (*xdsserver.Server, string) {
	t.Helper()
	srv, err := xdsserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, fn := range []func() error{
		func() error { return srv.Run(ctx) },
		func() error { return run(ctx, srv) },
		func() error { return g.Serve(lis) },
	} {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- fn() }()
	}
	t.Cleanup(func() {
		cancel()
		g.Stop()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil && err != grpc.ErrServerStopped {
				t.Errorf("xDS stack: %v", err)
			}
		}
	})
	return srv, lis.Addr().String()
}

// caller is a real grpc-go xDS client with node id pod, dialing xds:///target.
type caller struct {
	conn    *grpc.ClientConn
	client  testgrpc.TestServiceClient
	failed  atomic.Int64
	sent    atomic.Int64
	lastErr atomic.Value // string
}

// Its data-plane connections are opened inside podNS; its xDS stream stays on loopback.
func newCaller(t *testing.T, podNS *testbed.Namespace, xdsAddr, pod, target string) *caller {
	t.Helper()
	bootstrap, err := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{"server_uri": xdsAddr,
			"channel_creds": []any{map[string]any{"type": "insecure"}}, "server_features": []string{"xds_v3"}}},
		"node": map[string]any{"id": pod, "cluster": "edgeflow-live"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var b resolver.Builder
	if b, err = xdsclient.NewXDSResolverWithConfigForTesting(bootstrap); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///"+target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(b),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return podNS.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &caller{conn: conn, client: testgrpc.NewTestServiceClient(conn)}
}

// call sends one RPC and returns the pod that served it.
func (c *caller) call(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c.sent.Add(1)
	resp, err := c.client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
	if err != nil {
		c.failed.Add(1)
		return "", err
	}
	return resp.GetServerId(), nil
}

// loop sends RPCs every interval until ctx is done; the returned wait ends when it has stopped.
func (c *caller) loop(ctx context.Context, interval time.Duration) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				// The RPC itself is not cut by stopping the loop: a cancelled RPC is no failure.
				if _, err := c.call(context.WithoutCancel(ctx)); err != nil {
					c.lastErr.Store(err.Error())
				}
			}
		}
	}()
	return func() { <-done }
}

// eventually polls cond every 10 ms until it holds or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !waitUntil(d, cond) {
		t.Fatalf("%s: not within %v", what, d)
	}
}

// waitUntil polls cond every 10 ms until it holds (true) or d has passed (false).
func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// share runs n RPCs and returns the fraction each pod served.
func share(t *testing.T, ctx context.Context, c *caller, n int) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for i := 0; i < n; i++ {
		pod, err := c.call(ctx)
		if err != nil {
			t.Fatalf("RPC %d: %v", i, err)
		}
		out[pod] += 1 / float64(n)
	}
	return out
}

func fmtShare(m map[string]float64) string {
	s := ""
	for _, k := range sortedKeys(m) {
		s += fmt.Sprintf("%s=%.2f ", k, m[k])
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	for i := range ks {
		for j := i + 1; j < len(ks); j++ {
			if ks[j] < ks[i] {
				ks[i], ks[j] = ks[j], ks[i]
			}
		}
	}
	return ks
}

var _ = optimizer.LATA
