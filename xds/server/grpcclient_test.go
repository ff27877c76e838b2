package server

// Tests with grpc-go's real xDS client (one xDS client and node id per caller pod, all in this
// process) against the real server on loopback, with real gRPC backends.

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/internal/testkit/xdsclient"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// splitRPCs is the number of RPCs per measured split: at 10,000 the binomial standard deviation
// of a share is at most 0.5 percentage points, so the 2-point tolerance is 4σ (grpc-go picks
// localities and weighted clusters at random in proportion to weight).
const (
	splitRPCs    = 10000
	splitTolerPP = 2.0
)

// xdsConn dials xds:///target with its own xDS client whose node id is nodeID; closed at
// cleanup.
func xdsConn(t testing.TB, controlPlane, nodeID, target string) testgrpc.TestServiceClient {
	t.Helper()
	c, cc := dialXDS(t, controlPlane, nodeID, target)
	t.Cleanup(func() { cc.Close() })
	return c
}

// dialXDS is xdsConn for a caller that closes the connection itself.
func dialXDS(t testing.TB, controlPlane, nodeID, target string) (testgrpc.TestServiceClient, *grpc.ClientConn) {
	t.Helper()
	cc := xdsclient.Dial(t, controlPlane, xdsclient.Node{ID: nodeID, Zone: "test"}, target)
	return testgrpc.NewTestServiceClient(cc), cc
}

// realTopology: callers c-0…c-2 call echo (4 pods) and aux (2 pods) on a 4-node line.
func realTopology(bs map[string]*testkit.Echo) *optimizer.Topology {
	l := func(a, b string, ms float64) optimizer.Latency { return optimizer.Latency{From: a, To: b, MS: ms} }
	pod := func(name, node string) optimizer.Pod {
		p := optimizer.Pod{Name: name, Node: node}
		if b := bs[name]; b != nil {
			p.Address = b.Addr
		}
		return p
	}
	return &optimizer.Topology{
		Nodes:   []optimizer.Node{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}, {Name: "n4"}},
		Latency: []optimizer.Latency{l("n1", "n2", 2), l("n1", "n3", 4), l("n1", "n4", 6), l("n2", "n3", 2), l("n2", "n4", 4), l("n3", "n4", 2)},
		Services: []optimizer.Service{
			{Name: "client", Pods: []optimizer.Pod{pod("c-0", "n1"), pod("c-1", "n2"), pod("c-2", "n3")}},
			{Name: "echo", Pods: []optimizer.Pod{pod("e-0", "n1"), pod("e-1", "n2"), pod("e-2", "n3"), pod("e-3", "n4")}},
			{Name: "aux", Pods: []optimizer.Pod{pod("a-0", "n1"), pod("a-1", "n4")}},
		},
		Calls:   []optimizer.Call{{From: "client", To: "echo"}, {From: "client", To: "aux"}},
		Ingress: []optimizer.Ingress{{Service: "client", RPS: 30}},
	}
}

var realPods = []string{"e-0", "e-1", "e-2", "e-3", "a-0", "a-1"}

type rpcRecord struct {
	start time.Time
	pod   string
}

// measure sends n RPCs over 8 concurrent workers and returns the count per serving pod.
func measure(t testing.TB, c testgrpc.TestServiceClient, n int) map[string]int {
	t.Helper()
	counts := map[string]int{}
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				pod, err := call(c)
				if err != nil {
					errc <- err
					return
				}
				mu.Lock()
				counts[pod]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		t.Fatalf("RPC: %v", err)
	}
	return counts
}

func call(c testgrpc.TestServiceClient) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{FillServerId: true}, grpc.WaitForReady(true))
	return r.GetServerId(), err
}

// planned returns caller's fractions to the pods of callee (every pod, zeros included).
func planned(t testing.TB, a *optimizer.Allocation, top *optimizer.Topology, caller, callee string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, s := range top.Services {
		if s.Name == callee {
			for _, p := range s.Pods {
				out[p.Name] = 0
			}
		}
	}
	if caller == "" { // an unknown node: round-robin (the test's pods all have capacity 1)
		for p := range out {
			out[p] = 1 / float64(len(out))
		}
		return out
	}
	for p, f := range a.Call("client", callee).Fractions()[caller] {
		out[p] = f
	}
	return out
}

// checkSplit compares observed shares with the plan and returns the largest deviation (pp).
func checkSplit(t testing.TB, label string, counts map[string]int, want map[string]float64) float64 {
	t.Helper()
	n := 0
	for _, c := range counts {
		n += c
	}
	var worst float64
	var parts []string
	pods := make([]string, 0, len(want))
	for p := range want {
		pods = append(pods, p)
	}
	sort.Strings(pods)
	for p := range counts {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: %d RPCs went to %q, which is not a pod of the callee", label, counts[p], p)
		}
	}
	for _, p := range pods {
		got := 100 * float64(counts[p]) / float64(n)
		dev := got - 100*want[p]
		worst = math.Max(worst, math.Abs(dev))
		parts = append(parts, fmt.Sprintf("%s %.2f%% (plan %.2f%%, %+.2f)", p, got, 100*want[p], dev))
		if math.Abs(dev) > splitTolerPP || (want[p] == 0 && counts[p] > 0) {
			t.Errorf("%s: pod %s got %.2f%% of %d RPCs, plan %.2f%%", label, p, got, n, 100*want[p])
		}
	}
	t.Logf("%s n=%d: %s; max |dev| %.2f pp", label, n, strings.Join(parts, ", "), worst)
	return worst
}

func TestRealClientsFollowThePlan(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real xDS clients: 100k RPCs")
	}
	for _, enc := range []xds.Encoding{xds.EncodingLocality, xds.EncodingWeightedClusters} {
		t.Run(string(enc), func(t *testing.T) {
			bs := testkit.StartEchoes(t, realPods...)
			top := realTopology(bs)
			h := startServer(t, Config{Encoding: enc, DebounceQuiet: -1})
			h.srv.Update(top)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := h.srv.WaitPublished(ctx, 1); err != nil {
				t.Fatal(err)
			}
			alloc := h.srv.Allocation()
			var worst float64
			for _, caller := range []string{"c-0", "c-1", "c-2", ""} {
				id := caller
				if id == "" {
					id = "not-in-the-topology"
				}
				c := xdsConn(t, h.addr, id, "echo")
				measure(t, c, 500) // warm-up: every weighted locality connected
				worst = math.Max(worst, checkSplit(t, fmt.Sprintf("%s %s→echo", enc, id), measure(t, c, splitRPCs), planned(t, alloc, top, caller, "echo")))
			}
			// One caller's second service comes from the same snapshot (its own channel).
			c := xdsConn(t, h.addr, "c-1", "aux")
			measure(t, c, 500)
			worst = math.Max(worst, checkSplit(t, fmt.Sprintf("%s c-1→aux", enc), measure(t, c, splitRPCs), planned(t, alloc, top, "c-1", "aux")))
			t.Logf("%s: largest deviation from the plan over all routes: %.2f pp", enc, worst)
			if got := counter(t, h.srv.m.nacks.WithLabelValues("eds")) + counter(t, h.srv.m.nacks.WithLabelValues("rds")) +
				counter(t, h.srv.m.nacks.WithLabelValues("cds")) + counter(t, h.srv.m.nacks.WithLabelValues("lds")); got != 0 {
				t.Errorf("%v NACKs from grpc-go", got)
			}
		})
	}
}

// probe sends RPCs back to back from one client until stop is closed, recording each; a
// failed RPC (2 s deadline) is recorded and probing goes on.
type probe struct {
	mu     sync.Mutex
	recs   []rpcRecord
	failed []string
}

func (p *probe) run(c testgrpc.TestServiceClient, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		select {
		case <-stop:
			return
		default:
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{FillServerId: true}, grpc.WaitForReady(true))
		cancel()
		p.mu.Lock()
		if err != nil {
			p.failed = append(p.failed, fmt.Sprintf("after %v: %v", time.Since(start).Round(time.Millisecond), err))
		} else {
			p.recs = append(p.recs, rpcRecord{start, r.GetServerId()})
		}
		p.mu.Unlock()
	}
}

// lastTo returns the start of the last RPC served by one of pods.
func (p *probe) lastTo(pods map[string]bool) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var last time.Time
	for _, r := range p.recs {
		if pods[r.pod] && r.start.After(last) {
			last = r.start
		}
	}
	return last
}

// firstTo returns the start of the first RPC served by one of pods.
func (p *probe) firstTo(pods map[string]bool) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.recs {
		if pods[r.pod] {
			return r.start
		}
	}
	return time.Time{}
}

func (p *probe) progress() (int, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.recs) == 0 {
		return 0, time.Time{}
	}
	return len(p.recs), p.recs[len(p.recs)-1].start
}

func TestRealClientsLiveUpdate(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real xDS clients")
	}
	for _, enc := range []xds.Encoding{xds.EncodingLocality, xds.EncodingWeightedClusters} {
		t.Run(string(enc), func(t *testing.T) { liveUpdate(t, enc) })
	}
}

func liveUpdate(t *testing.T, enc xds.Encoding) {
	bs := testkit.StartEchoes(t, realPods...)
	top := realTopology(bs)
	h := startServer(t, Config{Encoding: enc, DebounceQuiet: -1})
	h.srv.Update(top)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	callers := []string{"c-0", "c-1", "c-2"}
	clients := map[string]testgrpc.TestServiceClient{}
	for _, c := range callers {
		clients[c] = xdsConn(t, h.addr, c, "echo")
		measure(t, clients[c], 500)
	}
	if err := h.srv.WaitConverged(ctx, 1); err != nil {
		t.Fatal(err)
	}
	streams := counter(t, h.srv.m.streamsOpened)
	accepts := func() int64 {
		var n int64
		for _, b := range bs {
			n += b.Accepts.Load()
		}
		return n
	}

	// step runs probes on every caller while the topology changes to next, waits until every
	// pushed client ACKed, and returns the change-to-new-split delay: from Update to the last
	// RPC start that a caller still routed by its old weights to a pod its new plan excludes.
	// No RPC may fail during the change (make before break: a removed pod's cluster leaves only
	// once the clients ACKed the routes that no longer name it).
	step := func(label string, next *optimizer.Topology, pub uint64, verifySplit bool) {
		t.Helper()
		old := h.srv.Allocation()
		acc0 := accepts()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		probes := map[string]*probe{}
		for _, c := range callers {
			probes[c] = &probe{}
			wg.Add(1)
			go probes[c].run(clients[c], stop, &wg)
		}
		probing := func(what string, done func(n int, last time.Time) bool) {
			t.Helper()
			testkit.Eventually(t, 10*time.Second, what, func() bool {
				for _, p := range probes {
					if n, last := p.progress(); !done(n, last) {
						return false
					}
				}
				return true
			})
		}
		probing("probes running", func(n int, _ time.Time) bool { return n >= 20 })
		t0 := time.Now()
		h.srv.Update(next)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.srv.WaitConverged(ctx, pub); err != nil {
			t.Fatal(err)
		}
		tAck := time.Since(t0)
		probing("probes past the ACK", func(_ int, last time.Time) bool { return last.Sub(t0) > tAck+50*time.Millisecond })
		close(stop)
		wg.Wait()
		for _, c := range callers {
			if f := probes[c].failed; len(f) > 0 {
				t.Errorf("%s %s: %s: %d of %d probe RPCs failed during the change, first %s", enc, label, c, len(f), len(f)+len(probes[c].recs), f[0])
			}
		}
		alloc := h.srv.Allocation()
		var lastOld, firstNew time.Duration // over callers: the switch lies between them
		newlyUsed := 0
		for _, c := range callers {
			before, after := planned(t, old, top, c, "echo"), planned(t, alloc, next, c, "echo")
			gone, gained := map[string]bool{}, map[string]bool{}
			for p, f := range before {
				if f > 0 && after[p] == 0 {
					gone[p] = true
				}
			}
			for p, f := range after {
				if f > 0 && before[p] == 0 {
					gained[p] = true
					newlyUsed++
				}
			}
			if last := probes[c].lastTo(gone); !last.IsZero() {
				lastOld = max(lastOld, last.Sub(t0))
			}
			if first := probes[c].firstTo(gained); !first.IsZero() {
				firstNew = max(firstNew, first.Sub(t0))
			}
		}
		t.Logf("%s %s: Update → all ACKs %v; change-to-new-split: last RPC by the old weights %v, first RPC by the new weights %v after Update",
			enc, label, tAck.Round(10*time.Microsecond), lastOld.Round(10*time.Microsecond), firstNew.Round(10*time.Microsecond))
		for _, c := range callers {
			if verifySplit {
				checkSplit(t, fmt.Sprintf("%s %s %s→echo", enc, label, c), measure(t, clients[c], splitRPCs), planned(t, alloc, next, c, "echo"))
			}
		}
		if got := counter(t, h.srv.m.streamsOpened); got != streams {
			t.Errorf("%s: ADS streams opened %v → %v: clients reconnected", label, streams, got)
		}
		// New TCP connections only to pods a caller did not use before (its new localities).
		if got := accepts() - acc0; got > int64(newlyUsed) {
			t.Errorf("%s: %d new backend connections, but only %d (caller, pod) pairs are new", label, got, newlyUsed)
		}
		top = next
	}

	// 1. A latency change: n1–n2 becomes slow.
	slow := top.Clone()
	for i, l := range slow.Latency {
		if l.From == "n1" && l.To == "n2" {
			slow.Latency[i].MS = 30
		}
	}
	step("latency n1–n2 2→30 ms", slow, 2, true)

	// 2. A pod removed: e-0 leaves; it receives nothing once the clients ACKed.
	removed := top.Clone()
	removed.Services[1].Pods = removed.Services[1].Pods[1:]
	step("pod e-0 removed", removed, 3, false)
	before := bs["e-0"].Calls.Load()
	for _, c := range callers {
		measure(t, clients[c], 3000)
	}
	if got := bs["e-0"].Calls.Load() - before; got != 0 {
		t.Errorf("removed pod e-0 served %d RPCs after the push", got)
	}
}

// TestRealClientsServerRestart restarts the server under real grpc-go xDS clients that keep
// sending RPCs: every client reconnects, ACKs the same EDS version it held (the plan is the
// same), and not one RPC fails. The clients may reconnect after the new server's first
// publication or before it; the second order is made certain by publishing only once every
// client has reconnected and asked for all four types, naming the versions it holds, which
// the new server cannot know yet.
func TestRealClientsServerRestart(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real xDS clients")
	}
	bs := testkit.StartEchoes(t, realPods...)
	top := realTopology(bs)
	for _, order := range []string{"published first", "reconnected first"} {
		t.Run(order, func(t *testing.T) { testServerRestart(t, bs, top, order == "reconnected first") })
	}
}

func testServerRestart(t *testing.T, bs map[string]*testkit.Echo, top *optimizer.Topology, reconnectFirst bool) {
	h := startServer(t, Config{DebounceQuiet: -1})
	h.srv.Update(top)
	callers := []string{"c-0", "c-1", "c-2", "unknown-caller"}
	clients := map[string]testgrpc.TestServiceClient{}
	for _, c := range callers {
		clients[c] = xdsConn(t, h.addr, c, "echo")
		if _, err := call(clients[c]); err != nil {
			t.Fatal(err)
		}
	}
	acked := func(h *harness) map[string]string {
		h.srv.nodesMu.Lock()
		defer h.srv.nodesMu.Unlock()
		out := map[string]string{}
		for _, n := range h.srv.nodes {
			n.mu.Lock()
			out[n.id] = n.acked[xds.EndpointSet].Version
			n.mu.Unlock()
		}
		return out
	}
	allAcked := func(h *harness, into *map[string]string) func() bool {
		return func() bool {
			*into = acked(h)
			for _, c := range callers {
				if (*into)[c] == "" {
					return false
				}
			}
			return true
		}
	}
	var before map[string]string
	testkit.Eventually(t, 10*time.Second, "ACKs", allAcked(h, &before))

	// Every client sends RPCs one after another through the restart; none may fail.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	for _, c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
				_, err := clients[c].UnaryCall(rctx, &testgrpc.SimpleRequest{FillServerId: true}, grpc.WaitForReady(true))
				rcancel()
				if ctx.Err() != nil {
					return
				}
				sent.Add(1)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%s: %v", c, err))
				}
			}
		}()
	}
	stopLoad := sync.OnceFunc(func() { cancel(); wg.Wait() })
	defer stopLoad()

	h.stop() // the clients lose their ADS streams (and keep their last configuration)
	h2 := startServerOn(t, Config{DebounceQuiet: -1}, h.addr)
	if reconnectFirst {
		testkit.Eventually(t, 30*time.Second, "clients reconnected, asking for every type", func() bool {
			h2.srv.nodesMu.Lock()
			defer h2.srv.nodesMu.Unlock()
			waiting := 0
			for _, n := range h2.srv.nodes {
				n.mu.Lock()
				for _, st := range n.live {
					if st.sotw != nil && !slices.Contains(st.sotw.watch[:], nil) {
						waiting++
					}
				}
				n.mu.Unlock()
			}
			return waiting == len(callers)
		})
	}
	h2.srv.Update(top)
	var after map[string]string
	testkit.Eventually(t, 30*time.Second, "clients reconnected and ACKed", allAcked(h2, &after))
	for _, c := range callers {
		if after[c] != before[c] {
			t.Errorf("%s: EDS version %s before the restart, %s after: weights differ", c, before[c], after[c])
		}
	}
	time.Sleep(200 * time.Millisecond) // RPCs on the configuration the new server sent
	stopLoad()
	t.Logf("versions before and after the restart: %v; %d RPCs through the restart, %d failed", after, sent.Load(), failed.Load())
	if sent.Load() == 0 {
		t.Error("no RPC was sent through the restart")
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d RPCs failed through the restart; the first: %v", n, sent.Load(), firstErr.Load())
	}
	alloc := h2.srv.Allocation()
	checkSplit(t, "after restart c-0→echo", measure(t, clients["c-0"], splitRPCs), planned(t, alloc, top, "c-0", "echo"))
}

// podRemovalRuns is how many times TestPodRemovalNeverFailsRPCs removes a pod in each
// encoding (the encodings alternate run by run); EDGEFLOW_POD_REMOVAL_RUNS sets another count
// (docs/benchmarks/measured.md's 300-run figure).
var podRemovalRuns = func() int {
	if n, err := strconv.Atoi(os.Getenv("EDGEFLOW_POD_REMOVAL_RUNS")); err == nil && n > 0 {
		return n
	}
	return 50
}()

// podRemovalGrace is the removal grace of TestPodRemovalNeverFailsRPCs: shorter than serve's
// default, to keep the runs short, and still far above the time an RPC takes to pick.
// EDGEFLOW_POD_REMOVAL_GRACE sets another (0s: none, docs/benchmarks/measured.md's "before" figure).
var podRemovalGrace = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("EDGEFLOW_POD_REMOVAL_GRACE")); err == nil && d >= 0 {
		return d
	}
	return 300 * time.Millisecond
}()

// podRemovalConcurrency is how many RPCs each client keeps in flight during a removal.
const podRemovalConcurrency = 4

// TestPodRemovalNeverFailsRPCs removes a callee pod while real grpc-go xDS clients send RPCs
// back to back, podRemovalRuns times per encoding (fresh server and clients each run, the
// encodings alternating, a different pod each time): not one RPC may fail. In the weighted-clusters
// encoding the removed pod's cluster must outlive every route that names it (make before
// break); in the locality encoding only its endpoints change.
func TestPodRemovalNeverFailsRPCs(t *testing.T) {
	if testing.Short() {
		t.Skip("real xDS clients")
	}
	bs := testkit.StartEchoes(t, realPods...)
	full := realTopology(bs)
	callers := []string{"c-0", "c-1", "c-2"}
	encodings := []xds.Encoding{xds.EncodingLocality, xds.EncodingWeightedClusters}
	var total, failed [2]int
	var took [2]time.Duration
	for run := range 2 * podRemovalRuns {
		e := run % 2
		gone := (run / 2) % 4 // the echo pod that leaves
		t0 := time.Now()
		func() {
			h := startServer(t, Config{Encoding: encodings[e], DebounceQuiet: -1, RemovalGrace: podRemovalGrace})
			defer h.stop()
			h.srv.Update(full)
			clients := map[string]testgrpc.TestServiceClient{}
			for _, c := range callers {
				client, cc := dialXDS(t, h.addr, c, "echo")
				defer cc.Close()
				clients[c] = client
				if _, err := call(client); err != nil {
					t.Fatalf("run %d: %s: first RPC: %v", run, c, err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := h.srv.WaitConverged(ctx, 1); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			probes := map[string]*probe{}
			for _, c := range callers {
				probes[c] = &probe{}
				for range podRemovalConcurrency {
					wg.Add(1)
					go probes[c].run(clients[c], stop, &wg)
				}
			}
			defer func() { close(stop); wg.Wait() }()
			running := func(min int, after time.Time) func() bool {
				return func() bool {
					for _, p := range probes {
						if n, last := p.progress(); n < min || !last.After(after) {
							return false
						}
					}
					return true
				}
			}
			testkit.Eventually(t, 10*time.Second, "probes running", running(5, t0))
			removed := full.Clone()
			removed.Services[1].Pods = append(removed.Services[1].Pods[:gone:gone], removed.Services[1].Pods[gone+1:]...)
			h.srv.Update(removed)
			if err := h.srv.WaitConverged(ctx, 2); err != nil {
				t.Fatal(err)
			}
			// The removed pod's cluster leaves after the grace, in a step of its own: wait until
			// every node holds its target and has its answers in.
			testkit.Eventually(t, 10*time.Second, "every node at its target after the removal grace", func() bool { return h.srv.allAtTarget() })
			// Every client has applied the last step; RPCs picked before it have finished.
			testkit.Eventually(t, 10*time.Second, "probes past the last ACK", running(0, time.Now().Add(20*time.Millisecond)))
			close(stop)
			wg.Wait()
			stop = make(chan struct{}) // for the deferred close
			for _, c := range callers {
				p := probes[c]
				total[e] += len(p.recs) + len(p.failed)
				if len(p.failed) > 0 {
					failed[e] += len(p.failed)
					t.Errorf("run %d (%s, %s removed): %s: %d of %d RPCs failed, first %s", run, encodings[e],
						full.Services[1].Pods[gone].Name, c, len(p.failed), len(p.recs)+len(p.failed), p.failed[0])
				}
			}
		}()
		took[e] += time.Since(t0)
	}
	for e, enc := range encodings {
		runs := podRemovalRuns
		t.Logf("%s: %d runs, %d of %d probe RPCs failed, %v per run", enc, runs, failed[e], total[e], (took[e] / time.Duration(runs)).Round(time.Millisecond))
	}
}

// allAtTarget reports whether every node holds its publication's sets (no step left, grace
// included) and has no answer outstanding.
func (s *Server) allAtTarget() bool {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	for _, n := range s.nodes {
		n.mu.Lock()
		done := n.target != nil && sameVersions(n.sets, *n.target) && !n.waiting()
		n.mu.Unlock()
		if !done {
			return false
		}
	}
	return true
}

// TestRemovalGraceKeepsThenRemoves: with weighted clusters, a removed pod's cluster stays with
// every node for the removal grace after the routes that named it were ACKed — the
// publication converges meanwhile — and then leaves in a step of its own, which the real
// grpc-go client ACKs; with no grace it is gone at convergence.
func TestRemovalGraceKeepsThenRemoves(t *testing.T) {
	if testing.Short() {
		t.Skip("real xDS clients")
	}
	bs := testkit.StartEchoes(t, realPods...)
	full := realTopology(bs)
	removed := full.Clone()
	gone := removed.Services[1].Pods[2].Name
	removed.Services[1].Pods = append(removed.Services[1].Pods[:2:2], removed.Services[1].Pods[3:]...)
	cluster := full.Services[1].Name + "/" + gone
	holds := func(h *harness, node string) bool {
		h.srv.nodesMu.Lock()
		defer h.srv.nodesMu.Unlock()
		for _, n := range h.srv.nodes {
			if n.id != node {
				continue
			}
			n.mu.Lock()
			defer n.mu.Unlock()
			return setItem(n.sets[xds.ClusterSet], cluster) != nil
		}
		t.Fatalf("no node %s", node)
		return false
	}
	for _, grace := range []time.Duration{0, 700 * time.Millisecond} {
		t.Run(fmt.Sprintf("grace=%v", grace), func(t *testing.T) {
			h := startServer(t, Config{Encoding: xds.EncodingWeightedClusters, DebounceQuiet: -1, RemovalGrace: grace})
			defer h.stop()
			h.srv.Update(full)
			client, cc := dialXDS(t, h.addr, "c-0", "echo")
			defer cc.Close()
			if _, err := call(client); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := h.srv.WaitConverged(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if !holds(h, "c-0") {
				t.Fatalf("c-0 does not hold %s before the removal", cluster)
			}
			h.srv.Update(removed)
			if err := h.srv.WaitConverged(ctx, 2); err != nil {
				t.Fatal(err)
			}
			converged := time.Now()
			if grace == 0 {
				if holds(h, "c-0") {
					t.Errorf("no grace: c-0 still holds %s at convergence", cluster)
				}
				return
			}
			if !holds(h, "c-0") {
				t.Fatalf("grace %v: %s gone at convergence, want it kept", grace, cluster)
			}
			testkit.Eventually(t, 10*time.Second, "the cluster gone and ACKed", func() bool { return !holds(h, "c-0") && h.srv.allAtTarget() })
			if took := time.Since(converged); took < grace/2 || took > grace+2*time.Second {
				t.Errorf("grace %v: the cluster left %v after convergence", grace, took)
			}
			if _, err := call(client); err != nil {
				t.Errorf("RPC after the cluster left: %v", err)
			}
		})
	}
}
