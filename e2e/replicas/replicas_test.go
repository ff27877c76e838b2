// Package replicas runs two `edgeflow serve` processes side by side, as two replicas behind one
// Kubernetes Service, and kills one of them in the middle of a publication.
package replicas

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/proto"

	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/internal/testkit/xdsclient"
	"github.com/edgeflow/edgeflow/xds"
)

const (
	clients    = 100 // grpc-go xDS clients, one caller pod each
	echoPods   = 4
	rpcTimeout = 2 * time.Second
	// callInterval is each client's time between RPCs: 500 RPCs/s in all, which the race
	// detector's 2-core run keeps up with.
	callInterval = 200 * time.Millisecond
	// moveBound is how long every client may take to reach the survivor (the target of issue 20).
	moveBound = 5 * time.Second
)

// TestMain removes the edgeflow binary testkit.Binary built (when EDGEFLOW_BIN is unset) and
// fails the run if a process a test started is still running.
func TestMain(m *testing.M) {
	code := m.Run()
	testkit.RemoveBuilt()
	if kids := testbed.Children(); code == 0 && len(kids) > 0 {
		fmt.Fprintf(os.Stderr, "replicas: processes left running: %s\n", strings.Join(kids, ", "))
		code = 1
	}
	os.Exit(code)
}

// startEcho starts the callee pods e-0…e-3 (each answers with its name) and returns their
// addresses, in that order.
func startEcho(t *testing.T) []string {
	var pods, addrs []string
	for i := range echoPods {
		pods = append(pods, fmt.Sprintf("e-%d", i))
	}
	echoes := testkit.StartEchoes(t, pods...)
	for _, p := range pods {
		addrs = append(addrs, echoes[p].Addr)
	}
	return addrs
}

// topology is a file topology: callers c-0…c-99 on 4 nodes calling echo's pods; scale
// multiplies the latencies (a publication that moves weights).
func topology(echoAddrs []string, scale float64) string {
	var b strings.Builder
	b.WriteString("nodes:\n")
	for i := 1; i <= 4; i++ {
		fmt.Fprintf(&b, "  - {name: n%d}\n", i)
	}
	b.WriteString("latency:\n")
	for _, l := range []struct {
		a, b string
		ms   float64
	}{{"n1", "n2", 4}, {"n1", "n3", 8}, {"n1", "n4", 12}, {"n2", "n3", 6}, {"n2", "n4", 10}, {"n3", "n4", 4}} {
		ms := l.ms
		if l.a == "n1" {
			ms *= scale
		}
		fmt.Fprintf(&b, "  - {from: %s, to: %s, ms: %g}\n", l.a, l.b, ms)
	}
	b.WriteString("services:\n  - name: client\n    pods:\n")
	for i := range clients {
		fmt.Fprintf(&b, "      - {name: c-%d, node: n%d}\n", i, i%4+1)
	}
	b.WriteString("  - name: echo\n    pods:\n")
	for i, a := range echoAddrs {
		fmt.Fprintf(&b, "      - {name: e-%d, node: n%d, address: %q}\n", i, i%4+1, a)
	}
	b.WriteString("calls:\n  - {from: client, to: echo}\ningress:\n  - {service: client, rps: 100}\n")
	return b.String()
}

// replica is one `edgeflow serve` process.
type replica struct {
	name    string
	cmd     *exec.Cmd
	xds     string // its xDS address
	metrics string
	addrs   chan []string // the xDS and metrics addresses, once printed
	done    chan struct{}
	log     *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) add(s string) { l.mu.Lock(); l.b.WriteString(s + "\n"); l.mu.Unlock() }
func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// announced matches the line edgeflow serve prints once it serves: the addresses it bound.
var announced = regexp.MustCompile(`^edgeflow serve: xDS on (\S+), metrics http://(\S+)/metrics`)

func startReplica(t *testing.T, name, file string) *replica {
	r := &replica{name: name, addrs: make(chan []string, 1), done: make(chan struct{}), log: &lockedBuffer{}}
	// Port 0: the process binds its own ports and prints them (no port picked here and taken
	// by another in between).
	r.cmd = exec.Command(testkit.Binary(t), "serve", "-f", file, "--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
		"--poll-interval", "1h", "--debounce-quiet", "10ms", "--debounce-max", "50ms")
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := r.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stdout = r.cmd.Stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			r.log.add(sc.Text())
			if m := announced.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case r.addrs <- m[1:]:
				default:
				}
			}
		}
		_ = r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
		if t.Failed() {
			t.Logf("%s log:\n%s", r.name, r.log.String())
		}
	})
	select {
	case a := <-r.addrs:
		r.xds, r.metrics = a[0], a[1]
	case <-r.done:
		t.Fatalf("%s exited before it served", name)
	case <-time.After(20 * time.Second):
		t.Fatalf("%s printed no addresses within 20s", name)
	}
	testkit.Eventually(t, 20*time.Second, name+" ready", func() bool { return r.metric(t, "edgeflow_xds_publications_total") >= 1 })
	return r
}

// metric reads a counter or gauge without labels from the replica's /metrics (-1: unreachable).
func (r *replica) metric(t *testing.T, name string) float64 {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return 0
}

// service stands for the Kubernetes Service in front of the replicas (kube-proxy): each new
// connection goes to the next replica that accepts it.
type service struct {
	l        net.Listener
	backends []string
	next     atomic.Uint64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

func startService(t *testing.T, backends ...string) *service {
	l := testkit.Listen(t)
	s := &service{l: l, backends: backends, conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() { defer s.wg.Done(); s.proxy(c) }()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *service) track(c net.Conn, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.conns[c] = true
	} else {
		delete(s.conns, c)
	}
}

func (s *service) proxy(c net.Conn) {
	s.track(c, true)
	defer func() { c.Close(); s.track(c, false) }()
	// Round robin over the backends, each tried once: a connection that finds one dead goes to
	// the next (as a Service does once its EndpointSlice has dropped the dead pod). The start is
	// taken once per connection, so concurrent connections cannot both land on the same dead
	// backend twice.
	var up net.Conn
	start := int(s.next.Add(1))
	for i := range s.backends {
		addr := s.backends[(start+i)%len(s.backends)]
		var err error
		if up, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			break
		}
	}
	if up == nil {
		return
	}
	s.track(up, true)
	defer func() { up.Close(); s.track(up, false) }()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

// caller is a grpc-go xDS client (node id = its pod) calling echo through the Service.
type caller struct {
	cc     *grpc.ClientConn
	client testgrpc.TestServiceClient
	ok     atomic.Int64
	failed atomic.Int64
	mu     sync.Mutex
	errs   []string
}

func newCaller(t *testing.T, xdsAddr, pod string) *caller {
	t.Helper()
	cc := xdsclient.Dial(t, xdsAddr, xdsclient.Node{ID: pod}, "echo")
	return &caller{cc: cc, client: testgrpc.NewTestServiceClient(cc)}
}

// loop calls every interval until ctx ends.
func (c *caller) loop(ctx context.Context, interval time.Duration, wg *sync.WaitGroup) {
	defer wg.Done()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
		_, err := c.client.UnaryCall(cctx, &testgrpc.SimpleRequest{})
		cancel()
		if err != nil {
			c.failed.Add(1)
			c.mu.Lock()
			if len(c.errs) < 3 {
				c.errs = append(c.errs, time.Now().Format("15:04:05.000")+" "+err.Error())
			}
			c.mu.Unlock()
		} else {
			c.ok.Add(1)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// fetch is a raw SOTW ADS client: it subscribes to every type with the names a proxyless
// client asks for, and returns each type's version and resources as bytes.
func fetch(t *testing.T, addr, node string) map[string]string {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	names := map[string][]string{resource.ListenerType: {"echo"}}
	for _, typ := range []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType} {
		if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: typ, ResourceNames: names[typ]}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: %s: %v", addr, typ, err)
		}
		var body strings.Builder
		var next []string
		for _, a := range resp.GetResources() {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(a)
			if err != nil {
				t.Fatal(err)
			}
			body.Write(b)
			next = append(next, resourceNamesIn(t, typ, a.GetValue())...)
		}
		out[typ] = resp.GetVersionInfo() + " " + fmt.Sprintf("%x", body.String())
		switch typ {
		case resource.ListenerType:
			names[resource.RouteType] = next
		case resource.RouteType:
			names[resource.ClusterType] = next
		case resource.ClusterType:
			names[resource.EndpointType] = next
		}
		// ACK, so the next type's request is not taken for a NACK.
		if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: typ, VersionInfo: resp.GetVersionInfo(),
			ResponseNonce: resp.GetNonce(), ResourceNames: names[typ]}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestReplicasServeTheSameVersions: two processes given the same file serve every type with the
// same version and the same bytes (versions are content hashes): a client that moves from one
// to the other already holds what the other would send.
func TestReplicasServeTheSameVersions(t *testing.T) {
	t.Parallel()
	echoAddrs := startEcho(t)
	file := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(file, []byte(topology(echoAddrs, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	a, b := startReplica(t, "replica-a", file), startReplica(t, "replica-b", file)
	for _, node := range []string{"c-0", "c-57", "not-a-pod"} {
		va, vb := fetch(t, a.xds, node), fetch(t, b.xds, node)
		for typ, got := range va {
			if vb[typ] != got {
				t.Errorf("node %s, %s: replica-a and replica-b differ:\n%.120s\n%.120s", node, typ, got, vb[typ])
			}
		}
		if len(va) != 4 {
			t.Errorf("node %s: %d types, want 4", node, len(va))
		}
	}
}

// TestReplicaKilledMidPush: 100 grpc-go xDS clients reach two replicas through one Service
// address, sending RPCs throughout; both replicas get a new topology (a callee pod leaves) and one is
// killed with SIGKILL as it publishes. No RPC fails, and within 5 s every client's stream is on
// the survivor; a client moving over already holds the versions the survivor serves for what
// did not change, so the survivor's answer is the publication's change only.
func TestReplicaKilledMidPush(t *testing.T) {
	echoAddrs := startEcho(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(file, []byte(topology(echoAddrs, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	a, b := startReplica(t, "replica-a", file), startReplica(t, "replica-b", file)
	svc := startService(t, a.xds, b.xds)

	callers := make([]*caller, clients)
	for i := range callers {
		callers[i] = newCaller(t, svc.l.Addr().String(), fmt.Sprintf("c-%d", i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, c := range callers {
		wg.Add(1)
		go c.loop(ctx, callInterval, &wg)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			wg.Wait()
		}
	}
	defer stop()
	testkit.Eventually(t, 60*time.Second, "every caller's first RPC", func() bool {
		for _, c := range callers {
			if c.ok.Load() == 0 {
				return false
			}
		}
		return true
	})
	// Failures while the 100 clients connected are not what this test is about.
	for _, c := range callers {
		c.failed.Store(0)
		c.mu.Lock()
		c.errs = nil
		c.mu.Unlock()
	}
	onA, onB := a.metric(t, "edgeflow_xds_connected_clients"), b.metric(t, "edgeflow_xds_connected_clients")
	t.Logf("streams before the kill: replica-a %v, replica-b %v", onA, onB)
	if onA < 1 || onB < 1 {
		t.Fatalf("the Service did not spread the clients: replica-a %v, replica-b %v streams", onA, onB)
	}
	pushesB := b.metric(t, "edgeflow_xds_publications_total")

	// A publication on both (the file changes: e-3 leaves; SIGHUP), and replica-a dies as it
	// publishes.
	if err := os.WriteFile(file+".new", []byte(topology(echoAddrs[:echoPods-1], 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".new", file); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Process.Signal(syscall.SIGHUP)
	_ = b.cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(5 * time.Millisecond)
	killed := time.Now()
	if err := syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.done
	testkit.Eventually(t, 10*time.Second, "replica-b published the change", func() bool {
		return b.metric(t, "edgeflow_xds_publications_total") > pushesB
	})
	var onSurvivor []string
	testkit.Eventually(t, 60*time.Second, "every client's stream on replica-b", func() bool {
		n := b.metric(t, "edgeflow_xds_connected_clients")
		onSurvivor = append(onSurvivor, fmt.Sprintf("%.1fs:%v", time.Since(killed).Seconds(), n))
		return n >= clients
	})
	moved := time.Since(killed)
	// grpc-go restarts a stream that had received a response at once, but a restart that fails
	// (it raced the dying replica's listener) waits its reconnect backoff, 1 s × 1.6ⁿ ± 20 %:
	// most clients move within half a second, a few take one or two backoffs more (1 s, 2.6 s);
	// a third (5.2 s) would break the 5 s.
	if moved > moveBound {
		t.Errorf("every client on replica-b only %v after the kill, want ≤ %v; streams on replica-b over time: %v", moved, moveBound, onSurvivor)
	}
	time.Sleep(2 * time.Second) // RPCs keep going on the survivor
	stop()
	var ok, failed int64
	for i, c := range callers {
		ok += c.ok.Load()
		if n := c.failed.Load(); n > 0 {
			failed += n
			t.Errorf("c-%d: %d RPCs failed: %v", i, n, c.errs)
		}
	}
	half := "never"
	for _, p := range onSurvivor {
		at, n, _ := strings.Cut(p, "s:")
		if v, _ := strconv.ParseFloat(n, 64); v >= clients*0.9 {
			half = at + "s"
			break
		}
	}
	t.Logf("after the kill: 90 %% of the clients on replica-b after %s, all after %v; %d RPCs in all, %d failed", half, moved.Round(time.Millisecond), ok, failed)
}

// resourceNamesIn returns what a resource of type typ names of the next type a proxyless
// client asks for: a Listener's RDS route configuration, a RouteConfiguration's clusters, an
// EDS Cluster's assignment.
func resourceNamesIn(t *testing.T, typ string, b []byte) []string {
	switch typ {
	case resource.ListenerType:
		l := &listener.Listener{}
		if err := proto.Unmarshal(b, l); err != nil {
			t.Fatal(err)
		}
		return xds.RouteConfigRefs(l)
	case resource.RouteType:
		rc := &route.RouteConfiguration{}
		if err := proto.Unmarshal(b, rc); err != nil {
			t.Fatal(err)
		}
		named := map[string]bool{}
		xds.ClusterRefs(rc, named)
		var out []string
		for n := range named {
			out = append(out, n)
		}
		slices.Sort(out)
		return out
	case resource.ClusterType:
		c := &cluster.Cluster{}
		if err := proto.Unmarshal(b, c); err != nil {
			t.Fatal(err)
		}
		if n := xds.EDSName(c); n != "" {
			return []string{n}
		}
	}
	return nil
}
