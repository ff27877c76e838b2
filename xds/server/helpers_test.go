package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/xds/internal/xdstest"
)

// newFakeClock returns the clock of tests that drive the server's timers by hand.
func newFakeClock() *testkit.FakeClock {
	return testkit.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.DiscardHandler)
}

// harness is a Server on 127.0.0.1:0 with its push loop running; everything stops at cleanup.
type harness struct {
	srv  *Server
	addr string
	reg  *prometheus.Registry
	stop func()
}

func startServer(t testing.TB, cfg Config) *harness {
	t.Helper()
	return startServerOn(t, cfg, "127.0.0.1:0")
}

func startServerOn(t testing.TB, cfg Config, addr string) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	if cfg.Registerer == nil {
		cfg.Registerer = reg
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	if cfg.Damping == 0 {
		cfg.Damping = -1 // these tests pin the server's push rules; damping has its own tests
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(srv.ServerOptions()...)
	srv.Register(g)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = g.Serve(srv.Listener(lis)) }()
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	var once sync.Once
	h := &harness{srv: srv, addr: lis.Addr().String(), reg: reg}
	h.stop = func() {
		once.Do(func() {
			cancel()
			g.Stop()
			wg.Wait()
		})
	}
	t.Cleanup(h.stop)
	return h
}

func counter(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}

// adsClient is a raw ADS stream, for the tests that need to see every response or to NACK.
type adsClient struct {
	t      testing.TB
	node   *core.Node
	conn   *grpc.ClientConn
	stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	resp   chan *discovery.DiscoveryResponse
	names  map[string][]string
}

func dialADS(t testing.TB, addr, nodeID string) *adsClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &adsClient{t: t, node: &core.Node{Id: nodeID}, conn: conn, stream: st,
		resp: make(chan *discovery.DiscoveryResponse, 100), names: map[string][]string{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(c.resp)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			c.resp <- r
		}
	}()
	t.Cleanup(func() {
		cancel()
		conn.Close()
		<-done
	})
	return c
}

// subscribe asks for names of typeURL (the first request of the stream carries the node).
func (c *adsClient) subscribe(typeURL string, names ...string) {
	c.t.Helper()
	c.names[typeURL] = names
	if err := c.stream.Send(&discovery.DiscoveryRequest{Node: c.node, TypeUrl: typeURL, ResourceNames: names}); err != nil {
		c.t.Fatal(err)
	}
}

// next returns the next response, failing the test after a deadline.
func (c *adsClient) next() *discovery.DiscoveryResponse {
	c.t.Helper()
	select {
	case r, ok := <-c.resp:
		if !ok {
			c.t.Fatal("ADS stream ended")
		}
		return r
	case <-time.After(10 * time.Second):
		c.t.Fatal("no ADS response within 10s")
	}
	return nil
}

// pending returns the responses received and not yet read, without waiting.
func (c *adsClient) pending() []*discovery.DiscoveryResponse {
	var out []*discovery.DiscoveryResponse
	for {
		select {
		case r, ok := <-c.resp:
			if !ok {
				return out
			}
			out = append(out, r)
		default:
			return out
		}
	}
}

func (c *adsClient) ack(r *discovery.DiscoveryResponse) {
	c.t.Helper()
	if err := c.stream.Send(&discovery.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResourceNames: c.names[r.GetTypeUrl()],
		VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *adsClient) nack(r *discovery.DiscoveryResponse, lastGood string) {
	c.t.Helper()
	if err := c.stream.Send(&discovery.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResourceNames: c.names[r.GetTypeUrl()],
		VersionInfo: lastGood, ResponseNonce: r.GetNonce(), ErrorDetail: &statuspb.Status{Code: 3, Message: "test rejects it"}}); err != nil {
		c.t.Fatal(err)
	}
}

// weights renders the assignments of a response as "pod@priority:weight …".
func weights(t testing.TB, r *discovery.DiscoveryResponse) string {
	t.Helper()
	var parts []string
	for _, a := range r.GetResources() {
		cla := &endpoint.ClusterLoadAssignment{}
		if err := a.UnmarshalTo(cla); err != nil {
			t.Fatal(err)
		}
		out := cla.GetClusterName() + ":"
		for _, l := range cla.GetEndpoints() {
			out += fmt.Sprintf(" %s@%d:%d", l.GetLocality().GetSubZone(), l.GetPriority(), l.GetLoadBalancingWeight().GetValue())
		}
		parts = append(parts, out+";")
	}
	sort.Strings(parts)
	return strings.Join(parts, "")
}

// subscribeAt asks for names of typeURL saying the client holds version (as a client that
// reconnects does).
func (c *adsClient) subscribeAt(typeURL, version string, names ...string) {
	c.t.Helper()
	c.names[typeURL] = names
	if err := c.stream.Send(&discovery.DiscoveryRequest{Node: c.node, TypeUrl: typeURL, ResourceNames: names, VersionInfo: version}); err != nil {
		c.t.Fatal(err)
	}
}

// deltaClient is a raw delta ADS stream (DeltaAggregatedResources).
type deltaClient struct {
	t      testing.TB
	node   *core.Node
	stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	resp   chan *discovery.DeltaDiscoveryResponse
	sent   bool   // the node went out with the first request
	close  func() // ends the stream (also at cleanup)
}

func dialDelta(t testing.TB, addr, nodeID string) *deltaClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &deltaClient{t: t, node: &core.Node{Id: nodeID}, stream: st, resp: make(chan *discovery.DeltaDiscoveryResponse, 100)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(c.resp)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			c.resp <- r
		}
	}()
	var once sync.Once
	c.close = func() {
		once.Do(func() {
			cancel()
			conn.Close()
			<-done
		})
	}
	t.Cleanup(c.close)
	return c
}

func (c *deltaClient) send(req *discovery.DeltaDiscoveryRequest) {
	c.t.Helper()
	if !c.sent {
		req.Node, c.sent = c.node, true
	}
	if err := c.stream.Send(req); err != nil {
		c.t.Fatal(err)
	}
}

// subscribe subscribes to names of typeURL (none: the legacy wildcard).
func (c *deltaClient) subscribe(typeURL string, names ...string) {
	c.t.Helper()
	c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: typeURL, ResourceNamesSubscribe: names})
}

func (c *deltaClient) next() *discovery.DeltaDiscoveryResponse {
	c.t.Helper()
	select {
	case r, ok := <-c.resp:
		if !ok {
			c.t.Fatal("delta stream ended")
		}
		return r
	case <-time.After(10 * time.Second):
		c.t.Fatal("no delta response within 10s")
	}
	return nil
}

func (c *deltaClient) ack(r *discovery.DeltaDiscoveryResponse) {
	c.t.Helper()
	c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()})
}

func (c *deltaClient) nack(r *discovery.DeltaDiscoveryResponse) {
	c.t.Helper()
	c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(),
		ErrorDetail: &statuspb.Status{Code: 3, Message: "test rejects it"}})
}

// pendingOne returns the next response if one has arrived, else nil.
func (c *adsClient) pendingOne() *discovery.DiscoveryResponse {
	select {
	case r := <-c.resp:
		return r
	default:
		return nil
	}
}

// pendingOne returns the next response if one has arrived, else nil.
func (c *deltaClient) pendingOne() *discovery.DeltaDiscoveryResponse {
	select {
	case r := <-c.resp:
		return r
	default:
		return nil
	}
}

// cached returns what the server serves node id (its current sets), as a snapshot.
// nodeByIDLocked returns a node whose client sent id (nil: none); s.nodesMu is held. The
// tests that use it have one client per id.
func (s *Server) nodeByIDLocked(id string) *nodeState {
	for _, n := range s.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

func (s *Server) cached(id string) (*cache.Snapshot, error) {
	s.nodesMu.Lock()
	var n *nodeState
	for _, x := range s.nodes {
		if x.id != id {
			continue
		}
		if n != nil {
			s.nodesMu.Unlock()
			return nil, fmt.Errorf("node %q has several owners", id)
		}
		n = x
	}
	s.nodesMu.Unlock()
	if n == nil {
		return nil, fmt.Errorf("no node %q", id)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.served {
		return nil, fmt.Errorf("node %q is served nothing yet", id)
	}
	snap := &cache.Snapshot{}
	for i, set := range n.sets {
		snap.Resources[typeSlots[i]] = cache.NewResources(set.Version, set.Items)
	}
	return snap, nil
}

// bookinfoPath is the translator's Bookinfo fixture.
const bookinfoPath = "../testdata/bookinfo.yaml"

// The shared fixtures (xdstest), under the names these tests use.
var (
	loadTopology = xdstest.LoadTopology
	plan         = xdstest.Plan
)
