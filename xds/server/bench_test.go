package server

// Push fan-out benchmarks: edgeflow's end-to-end path (Update → solve → translate →
// SetSnapshot → every affected client's ACK) side by side with the bare go-control-plane
// SnapshotCache push (build + SetSnapshot → every client's ACK, as e2e/pushbench/bare), same N
// fake ADS clients (one gRPC connection each, EDS only, loopback), same K endpoints.
//
//	go test ./xds/server -run '^$' -bench 'BenchmarkPush' -benchtime 7x -timeout 60m
//
// Each benchmark iteration is one push round; besides ns/op (the mean), p50-ms is the median
// round, and B/sidecar is the heap growth per connected fake sidecar (server and client side
// both live in this process, for both variants alike).

import (
	"context"
	"fmt"
	"math/rand"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	gcpserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// benchK is the number of endpoints per ClusterLoadAssignment (as e2e/pushbench's calleePods).
const benchK = 50

// fleet is N fake ADS clients, each on its own gRPC connection, subscribed to EDS names.
// A round sets per-client target versions; the round is done when every targeted client has
// received (and ACKed) its target.
type fleet struct {
	conns   []*grpc.ClientConn
	targets []atomic.Pointer[string]
	left    atomic.Int64
	done    atomic.Pointer[chan struct{}]
	bytes   atomic.Int64
	wg      sync.WaitGroup
	cancel  context.CancelFunc
}

// newFleet makes a fleet of n clients; connect starts them (after the first expect, so no
// response can arrive before its target is set).
func newFleet(n int) *fleet {
	return &fleet{targets: make([]atomic.Pointer[string], n), cancel: func() {}}
}

func (f *fleet) connect(b *testing.B, addr string, ids []string, names []string) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	for i, id := range ids {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		f.conns = append(f.conns, conn)
		st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			b.Fatal(err)
		}
		node := &core.Node{Id: id}
		if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: names}); err != nil {
			b.Fatal(err)
		}
		f.wg.Add(1)
		go func(i int) {
			defer f.wg.Done()
			for {
				resp, err := st.Recv()
				if err != nil {
					return
				}
				f.bytes.Add(int64(proto.Size(resp)))
				_ = st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: names,
					VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
				f.arrived(i, resp.GetVersionInfo())
			}
		}(i)
	}
}

func (f *fleet) arrived(i int, version string) {
	t := f.targets[i].Load()
	if t == nil || *t != version || !f.targets[i].CompareAndSwap(t, nil) {
		return
	}
	if f.left.Add(-1) == 0 {
		close(*f.done.Load())
	}
}

// expect starts a round: client i must receive version want[i] ("" = not awaited). It returns
// the channel closed when all awaited clients have it, and how many are awaited.
func (f *fleet) expect(want []string) (<-chan struct{}, int) {
	ch := make(chan struct{})
	n := 0
	for _, v := range want {
		if v != "" {
			n++
		}
	}
	f.done.Store(&ch)
	f.left.Store(int64(n) + 1) // +1 until every target is set
	for i, v := range want {
		if v != "" {
			v := v
			f.targets[i].Store(&v)
		}
	}
	if f.left.Add(-1) == 0 {
		close(ch)
	}
	return ch, n
}

func (f *fleet) close() {
	f.cancel()
	for _, c := range f.conns {
		c.Close()
	}
	f.wg.Wait()
}

func waitRound(b *testing.B, done <-chan struct{}, n int) {
	b.Helper()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		b.Fatalf("round did not converge (%d clients awaited)", n)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func reportRounds(b *testing.B, rounds []time.Duration, n int, memBefore, memAfter uint64) {
	b.Helper()
	b.ReportMetric(float64(median(rounds).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(int64(memAfter)-int64(memBefore))/float64(n), "B/sidecar")
}

// BenchmarkPush compares edgeflow's server with the bare go-control-plane push.
func BenchmarkPush(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		b.Run(fmt.Sprintf("bare/N=%d", n), func(b *testing.B) { benchBare(b, n) })
		b.Run(fmt.Sprintf("edgeflow/N=%d", n), func(b *testing.B) { benchEdgeflow(b, n) })
	}
	b.Run("edgeflow-grpc/N=100", func(b *testing.B) { benchRealClients(b, 100) })
	b.Run("one-service-bare/N=1000", func(b *testing.B) { benchOneServiceBare(b, 1000) })
	b.Run("one-service/N=1000", func(b *testing.B) { benchOneService(b, 1000) })
}

// benchCLA is the bare push's ClusterLoadAssignment: K endpoints with random weights.
func benchCLA(k int, r *rand.Rand) *endpoint.ClusterLoadAssignment {
	eps := make([]*endpoint.LbEndpoint, k)
	for i := range eps {
		eps[i] = &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
					Address: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), PortSpecifier: &core.SocketAddress_PortValue{PortValue: 8080}}}}}},
			LoadBalancingWeight: wrapperspb.UInt32(uint32(1 + r.Intn(1000))),
		}
	}
	return &endpoint.ClusterLoadAssignment{ClusterName: "callee", Endpoints: []*endpoint.LocalityLbEndpoints{{LbEndpoints: eps}}}
}

func serveGRPC(b *testing.B, register func(*grpc.Server)) (string, func()) {
	b.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer(grpc.MaxConcurrentStreams(1000000))
	register(gs)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	return lis.Addr().String(), func() { gs.Stop(); <-done }
}

func benchBare(b *testing.B, n int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	snap := cache.NewSnapshotCache(true, cache.IDHash{}, nil)
	addr, stop := serveGRPC(b, func(gs *grpc.Server) {
		discovery.RegisterAggregatedDiscoveryServiceServer(gs, gcpserver.NewServer(ctx, snap, nil))
	})
	defer stop()
	r := rand.New(rand.NewSource(1))
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("node-", i)
	}
	set := func(v int) {
		for i := 0; i < n; i++ {
			s, err := cache.NewSnapshot(fmt.Sprint(v), map[resource.Type][]types.Resource{resource.EndpointType: {benchCLA(benchK, r)}})
			if err != nil {
				b.Fatal(err)
			}
			if err := snap.SetSnapshot(ctx, ids[i], s); err != nil {
				b.Fatal(err)
			}
		}
	}
	want := func(v int) []string {
		w := make([]string, n)
		for i := range w {
			w[i] = fmt.Sprint(v)
		}
		return w
	}
	mem0 := heapInUse()
	set(0)
	fl := newFleet(n)
	done, k := fl.expect(want(0))
	fl.connect(b, addr, ids, []string{"callee"})
	defer fl.close()
	waitRound(b, done, k)
	mem1 := heapInUse()
	var rounds []time.Duration
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		done, k := fl.expect(want(i))
		t0 := time.Now()
		set(i)
		waitRound(b, done, k)
		rounds = append(rounds, time.Since(t0))
	}
	b.StopTimer()
	reportRounds(b, rounds, n, mem0, mem1)
}

// flipTopology places n callers on 10 caller nodes and k callee pods on 10 callee nodes;
// flipped mirrors the caller-to-callee latencies, so nearly every caller's best pods change.
func flipTopology(n, k int, flipped bool, services ...string) *optimizer.Topology {
	top := &optimizer.Topology{}
	for i := 0; i < 10; i++ {
		top.Nodes = append(top.Nodes, optimizer.Node{Name: fmt.Sprintf("c%d", i)}, optimizer.Node{Name: fmt.Sprintf("a%d", i)}, optimizer.Node{Name: fmt.Sprintf("b%d", i)})
	}
	for i := 0; i < 10; i++ {
		for j := 0; j < 10; j++ {
			d := i - j
			if flipped {
				d = i - (9 - j)
			}
			if d < 0 {
				d = -d
			}
			top.Latency = append(top.Latency,
				optimizer.Latency{From: fmt.Sprintf("c%d", i), To: fmt.Sprintf("a%d", j), MS: float64(1 + d)},
				optimizer.Latency{From: fmt.Sprintf("c%d", i), To: fmt.Sprintf("b%d", j), MS: float64(1 + abs(i-j))})
		}
	}
	callers := optimizer.Service{Name: "caller"}
	for i := 0; i < n; i++ {
		callers.Pods = append(callers.Pods, optimizer.Pod{Name: fmt.Sprintf("caller-%d", i), Node: fmt.Sprintf("c%d", i%10)})
	}
	top.Services = append(top.Services, callers)
	for si, svc := range services {
		prefix := "a"
		if si == 1 {
			prefix = "b"
		}
		s := optimizer.Service{Name: svc}
		for j := 0; j < k; j++ {
			s.Pods = append(s.Pods, optimizer.Pod{Name: fmt.Sprintf("%s-%d", svc, j), Node: fmt.Sprintf("%s%d", prefix, j%10),
				Address: fmt.Sprintf("10.%d.%d.%d:8080", si, j>>8&255, j&255)})
		}
		top.Services = append(top.Services, s)
		top.Calls = append(top.Calls, optimizer.Call{From: "caller", To: svc})
	}
	top.Ingress = []optimizer.Ingress{{Service: "caller", RPS: float64(n)}}
	return top
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

var benchOptions = optimizer.Options{DefaultLatencyMS: func() *float64 { v := 50.0; return &v }()}

// expectedEDS precomputes, per caller pod, its EDS version under top (content-addressed, so
// the server will publish exactly these).
func expectedEDS(b *testing.B, top *optimizer.Topology, ids []string) []string {
	b.Helper()
	m, err := optimizer.Compile(top, benchOptions)
	if err != nil {
		b.Fatal(err)
	}
	a, err := optimizer.Plan(m, optimizer.LATA)
	if err != nil {
		b.Fatal(err)
	}
	tr, err := xds.Translate(top, a, xds.EncodingLocality)
	if err != nil {
		b.Fatal(err)
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = tr.Pods[id].Sets[xds.EndpointSet].Version
	}
	return out
}

// edgeflowRounds runs b.N pushes alternating between tops[0] and tops[1] (tops[0] is already
// published) and reports the rounds, the clients affected per round and server-side timings.
func edgeflowRounds(b *testing.B, h *harness, fl *fleet, tops [2]*optimizer.Topology, want [2][]string, n int, mem0, mem1 uint64) {
	var rounds, publish []time.Duration
	affected := 0
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		cur, prev := want[i%2], want[(i+1)%2]
		diff := make([]string, len(cur))
		for j := range cur {
			if cur[j] != prev[j] {
				diff[j] = cur[j]
			}
		}
		done, k := fl.expect(diff)
		affected = k
		t0 := time.Now()
		h.srv.Update(tops[i%2])
		if err := h.srv.WaitPublished(context.Background(), uint64(i+1)); err != nil {
			b.Fatal(err)
		}
		publish = append(publish, time.Since(t0))
		waitRound(b, done, k)
		rounds = append(rounds, time.Since(t0))
	}
	b.StopTimer()
	reportRounds(b, rounds, n, mem0, mem1)
	b.ReportMetric(float64(affected), "affected")
	b.ReportMetric(float64(median(publish).Microseconds())/1000, "publish-p50-ms")
}

func benchEdgeflow(b *testing.B, n int) {
	tops := [2]*optimizer.Topology{flipTopology(n, benchK, false, "callee"), flipTopology(n, benchK, true, "callee")}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("caller-%d", i)
	}
	want := [2][]string{expectedEDS(b, tops[0], ids), expectedEDS(b, tops[1], ids)}
	mem0 := heapInUse()
	h := startServer(b, Config{Options: benchOptions, DebounceQuiet: -1})
	defer h.stop()
	fl := newFleet(n)
	fl.connect(b, h.addr, ids, []string{"callee"})
	defer fl.close()
	// Every client registered, then the first publication reaches them all.
	testkit.Eventually(b, time.Minute, "all nodes registered", func() bool { return counter(b, h.srv.m.nodes) == float64(n) })
	done, k := fl.expect(want[0])
	h.srv.Update(tops[0])
	waitRound(b, done, k)
	mem1 := heapInUse()
	edgeflowRounds(b, h, fl, tops, want, n, mem0, mem1)
}

// benchOneService: every sidecar calls two services; a change moves only one service's
// weights, for (nearly) all sidecars.
func benchOneService(b *testing.B, n int) {
	tops := [2]*optimizer.Topology{flipTopology(n, 10, false, "s1", "s2"), flipTopology(n, 10, true, "s1", "s2")}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("caller-%d", i)
	}
	want := [2][]string{expectedEDS(b, tops[0], ids), expectedEDS(b, tops[1], ids)}
	mem0 := heapInUse()
	h := startServer(b, Config{Options: benchOptions, DebounceQuiet: -1})
	defer h.stop()
	fl := newFleet(n)
	fl.connect(b, h.addr, ids, []string{"s1", "s2"})
	defer fl.close()
	testkit.Eventually(b, time.Minute, "all nodes registered", func() bool { return counter(b, h.srv.m.nodes) == float64(n) })
	done, k := fl.expect(want[0])
	h.srv.Update(tops[0])
	waitRound(b, done, k)
	mem1 := heapInUse()
	pushes := counter(b, h.srv.m.pushes.WithLabelValues("eds"))
	edgeflowRounds(b, h, fl, tops, want, n, mem0, mem1)
	b.ReportMetric((counter(b, h.srv.m.pushes.WithLabelValues("eds"))-pushes)/float64(b.N), "eds-pushes/op")
}

// benchOneServiceBare is the bare library pushing what benchOneService pushes: per node two
// assignments of 10 endpoints, one of which changes every round.
func benchOneServiceBare(b *testing.B, n int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	snap := cache.NewSnapshotCache(true, cache.IDHash{}, nil)
	addr, stop := serveGRPC(b, func(gs *grpc.Server) {
		discovery.RegisterAggregatedDiscoveryServiceServer(gs, gcpserver.NewServer(ctx, snap, nil))
	})
	defer stop()
	r := rand.New(rand.NewSource(1))
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("node-", i)
	}
	named := func(c *endpoint.ClusterLoadAssignment, name string) *endpoint.ClusterLoadAssignment {
		c.ClusterName = name
		return c
	}
	s2 := named(benchCLA(10, r), "s2")
	set := func(v int) {
		for i := 0; i < n; i++ {
			s, err := cache.NewSnapshot(fmt.Sprint(v), map[resource.Type][]types.Resource{resource.EndpointType: {named(benchCLA(10, r), "s1"), s2}})
			if err != nil {
				b.Fatal(err)
			}
			if err := snap.SetSnapshot(ctx, ids[i], s); err != nil {
				b.Fatal(err)
			}
		}
	}
	want := func(v int) []string {
		w := make([]string, n)
		for i := range w {
			w[i] = fmt.Sprint(v)
		}
		return w
	}
	mem0 := heapInUse()
	set(0)
	fl := newFleet(n)
	done, k := fl.expect(want(0))
	fl.connect(b, addr, ids, []string{"s1", "s2"})
	defer fl.close()
	waitRound(b, done, k)
	mem1 := heapInUse()
	var rounds []time.Duration
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		done, k := fl.expect(want(i))
		t0 := time.Now()
		set(i)
		waitRound(b, done, k)
		rounds = append(rounds, time.Since(t0))
	}
	b.StopTimer()
	reportRounds(b, rounds, n, mem0, mem1)
}

// benchRealClients: N grpc-go xDS clients (each its own xDS client and ADS stream) dialing
// xds:///callee, with K real backends; a round ends when the server has every pushed client's
// ACK (WaitConverged).
func benchRealClients(b *testing.B, n int) {
	k := 10 // real backends: the clients connect to their priority-0 pods
	pods := make([]string, k)
	for j := range pods {
		pods[j] = fmt.Sprintf("callee-%d", j)
	}
	bs := testkit.StartEchoes(b, pods...)
	withAddrs := func(t *optimizer.Topology) *optimizer.Topology {
		for i := range t.Services[1].Pods {
			t.Services[1].Pods[i].Address = bs[t.Services[1].Pods[i].Name].Addr
		}
		return t
	}
	tops := [2]*optimizer.Topology{withAddrs(flipTopology(n, k, false, "callee")), withAddrs(flipTopology(n, k, true, "callee"))}
	h := startServer(b, Config{Options: benchOptions, DebounceQuiet: -1})
	defer h.stop()
	h.srv.Update(tops[0])
	for i := 0; i < n; i++ {
		c := xdsConn(b, h.addr, fmt.Sprintf("caller-%d", i), "callee")
		if _, err := call(c); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	var rounds []time.Duration
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		t0 := time.Now()
		h.srv.Update(tops[i%2])
		if err := h.srv.WaitConverged(ctx, uint64(i+1)); err != nil {
			b.Fatal(err)
		}
		rounds = append(rounds, time.Since(t0))
	}
	b.StopTimer()
	b.ReportMetric(float64(median(rounds).Microseconds())/1000, "p50-ms")
}

// BenchmarkPublishSteps times the server's publication steps on the push benchmark's input.
func BenchmarkPublishSteps(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		top := flipTopology(n, benchK, false, "callee")
		b.Run(fmt.Sprintf("solve/N=%d", n), func(b *testing.B) {
			for b.Loop() {
				m, err := optimizer.Compile(top, benchOptions)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := optimizer.Plan(m, optimizer.LATA); err != nil {
					b.Fatal(err)
				}
			}
		})
		m, _ := optimizer.Compile(top, benchOptions)
		a, _ := optimizer.Plan(m, optimizer.LATA)
		b.Run(fmt.Sprintf("translate/N=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := xds.Translate(top, a, xds.EncodingLocality); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNodeState measures what edgeflow itself keeps per connected node (node state,
// snapshot, the node's share of the translation), without gRPC: N nodes are registered as
// streams would register them, then one publication reaches them all.
func BenchmarkNodeState(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			top := flipTopology(n, benchK, false, "callee")
			var perNode float64
			for b.Loop() {
				srv, err := New(Config{Options: benchOptions, DebounceQuiet: -1, Damping: -1, Logger: testLogger(b)})
				if err != nil {
					b.Fatal(err)
				}
				mem0 := heapInUse()
				for i := 0; i < n; i++ {
					if _, err := srv.openStream(streamKey{id: int64(i + 1)}, &streamOpen{owner: "bench"}, &core.Node{Id: fmt.Sprintf("caller-%d", i)}); err != nil {
						b.Fatal(err)
					}
				}
				srv.Update(top)
				srv.publish()
				if srv.Published() != 1 {
					b.Fatal("not published")
				}
				mem1 := heapInUse()
				perNode = float64(int64(mem1)-int64(mem0)) / float64(n)
				runtime.KeepAlive(srv)
			}
			b.ReportMetric(perNode, "B/node")
		})
	}
}

// BenchmarkKindResources measures the first Resources call for every caller of a publication
// (what a publication to N connected xds.Envoy or Istio nodes costs on top of xds.Translate), and the
// memory it keeps per node.
func BenchmarkKindResources(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		top := flipTopology(n, benchK, false, "callee")
		top.Services[1].Ports = []optimizer.Port{{Name: "http", Port: 80, TargetPort: 8080}}
		m, err := optimizer.Compile(top, benchOptions)
		if err != nil {
			b.Fatal(err)
		}
		a, err := optimizer.Plan(m, optimizer.LATA)
		if err != nil {
			b.Fatal(err)
		}
		for _, kind := range []xds.NodeKind{xds.Envoy, xds.IstioSidecar} {
			b.Run(fmt.Sprintf("%s/N=%d", kind, n), func(b *testing.B) {
				b.ReportAllocs()
				var mem0, mem1 uint64
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					tr, err := xds.Translate(top, a, xds.EncodingLocality)
					if err != nil {
						b.Fatal(err)
					}
					mem0 = heapInUse()
					b.StartTimer()
					for p := 0; p < n; p++ {
						tr.Resources(fmt.Sprintf("caller-%d", p), kind)
					}
					b.StopTimer()
					mem1 = heapInUse()
					runtime.KeepAlive(tr)
					b.StartTimer()
				}
				b.ReportMetric(float64(int64(mem1)-int64(mem0))/float64(n), "heap-B/node")
			})
		}
	}
}
