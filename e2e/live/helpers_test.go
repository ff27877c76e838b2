package live

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/internal/testkit/xdsclient"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// xdsServer runs edgeflow's xDS server fed by a source; returns its address. Stopped at cleanup.
func xdsServer(t *testing.T, cfg xdsserver.Config, run func(context.Context, watcher.Listener) error) (*xdsserver.Server, string) {
	t.Helper()
	srv, err := xdsserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis := testkit.Listen(t)
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
	first   sync.Map     // pod → time.Time the first answer from it arrived
}

// Its data-plane connections are opened inside podNS; its xDS stream stays on loopback.
func newCaller(t *testing.T, podNS *testbed.Namespace, xdsAddr, pod, target string) *caller {
	t.Helper()
	conn := xdsclient.Dial(t, xdsAddr, xdsclient.Node{ID: pod, Cluster: "edgeflow-live"}, target,
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return podNS.DialContext(ctx, "tcp", addr) }))
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
	if _, seen := c.first.Load(resp.GetServerId()); !seen {
		c.first.LoadOrStore(resp.GetServerId(), time.Now())
	}
	return resp.GetServerId(), nil
}

// firstAnswer returns when the first answer from pod arrived (ok false: none yet).
func (c *caller) firstAnswer(pod string) (at time.Time, ok bool) {
	v, ok := c.first.Load(pod)
	if !ok {
		return time.Time{}, false
	}
	return v.(time.Time), true
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
