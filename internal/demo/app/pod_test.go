package app

import (
	"context"
	"math"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

// serve runs pod on a loopback port until the test ends and returns a channel to it.
func serve(t *testing.T, pod *Pod) *grpc.ClientConn {
	t.Helper()
	lis := testkit.Listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pod.Serve(ctx, lis) }()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return conn
}

func newPod(t *testing.T, cfg Config) *Pod {
	t.Helper()
	p, err := NewPod(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPodWorkersBoundConcurrency: 5 requests at once on 2 workers with a fixed 100 ms service
// time finish no earlier than 100, 100, 200, 200 and 300 ms.
func TestPodWorkersBoundConcurrency(t *testing.T) {
	const service = 100 * time.Millisecond
	pod := newPod(t, Config{Name: "p-0", Workers: 2, ServiceTime: Fixed(service)})
	conn := serve(t, pod)
	if _, err := Call(context.Background(), conn, "", ""); err != nil { // connect
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	lat := make([]time.Duration, 5)
	errs := make([]error, 5)
	start := time.Now()
	for i := range lat {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = Call(context.Background(), conn, "", "")
			lat[i] = time.Since(start)
		}()
	}
	// Three wait only until the first two finish (100 ms): checked every millisecond, where the
	// kit's Eventually (up to 50 ms between checks) could miss the moment on a busy machine.
	for deadline := time.Now().Add(10 * time.Second); pod.Stats().Waiting != 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out after 10s waiting for 3 requests queued")
		}
	}
	wg.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	for i, want := range []time.Duration{service, service, 2 * service, 2 * service, 3 * service} {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		// Only the lower bound is a property of the pod: finishing early would mean more than
		// two requests in service at once. Lateness is the machine's (a busy CI host, -race).
		if lat[i] < want {
			t.Errorf("request %d finished after %v, before %v: more than 2 workers busy", i, lat[i], want)
		}
	}
	if st := pod.Stats(); st.Served != 6 || st.Failed != 0 || st.Waiting != 0 || st.MaxWaiting != 3 || st.Received[""] != 6 {
		t.Errorf("stats %+v, want 6 received from outside and served, at most 3 waiting", st)
	}
}

func TestWorkerQueue(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	q := newWorkerQueue(2)
	steps := []struct {
		arrive, service time.Duration
		start, finish   time.Duration
	}{
		{arrive: 0, service: ms(10), start: 0, finish: ms(10)},          // worker A
		{arrive: ms(1), service: ms(4), start: ms(1), finish: ms(5)},    // worker B
		{arrive: ms(2), service: ms(3), start: ms(5), finish: ms(8)},    // waits for B
		{arrive: ms(3), service: ms(1), start: ms(8), finish: ms(9)},    // waits for B again
		{arrive: ms(4), service: ms(1), start: ms(9), finish: ms(10)},   // B frees first (9 < 10)
		{arrive: ms(20), service: ms(2), start: ms(20), finish: ms(22)}, // idle again
		{arrive: ms(20), service: 0, start: ms(20), finish: ms(20)},     // zero service time
	}
	for i, s := range steps {
		start, finish := q.admit(t0.Add(s.arrive), s.service)
		if start.Sub(t0) != s.start || finish.Sub(t0) != s.finish {
			t.Errorf("request %d: start %v finish %v, want %v and %v", i, start.Sub(t0), finish.Sub(t0), s.start, s.finish)
		}
	}
}

func TestPodCallsDownstreamAsItself(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	delays := map[string]int{}
	leaf := newPod(t, Config{Name: "leaf-0", Node: "n2", Workers: 1, Delay: func(from string) time.Duration {
		mu.Lock()
		delays[from]++
		mu.Unlock()
		return time.Millisecond
	}})
	leafConn := serve(t, leaf)
	front := newPod(t, Config{Name: "front-0", Node: "n1", Workers: 1, ServiceTime: Fixed(time.Millisecond),
		Downstream: []Downstream{{Service: "leaf", Rate: 2, Conn: leafConn}}})
	frontConn := serve(t, front)

	for range 3 {
		got, err := Call(context.Background(), frontConn, "", "")
		if err != nil {
			t.Fatal(err)
		}
		if got != "front-0" {
			t.Errorf("served by %q, want front-0", got)
		}
	}
	if got := front.Stats().Received; len(got) != 1 || got[""] != 3 {
		t.Errorf("front received %v, want 3 from outside", got)
	}
	if got := leaf.Stats().Received; len(got) != 1 || got["front-0"] != 6 {
		t.Errorf("leaf received %v, want 6 (rate 2) from front-0", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(delays) != 1 || delays["n1"] != 6 {
		t.Errorf("leaf injected delays for callers on %v, want 6 for node n1", delays)
	}
}

func TestPodInjectsDelayBeforeQueueing(t *testing.T) {
	const delay = 30 * time.Millisecond
	pod := newPod(t, Config{Name: "p-0", Workers: 1, Delay: func(string) time.Duration { return delay }})
	conn := serve(t, pod)
	if _, err := Call(context.Background(), conn, "", ""); err != nil { // connect
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := Call(context.Background(), conn, "x-0", "n9"); err != nil {
		t.Fatal(err)
	}
	if got := time.Since(start); got < delay {
		t.Errorf("call took %v, want ≥ the injected %v", got, delay)
	}
}

// failingConn answers every call with an error, as an overloaded callee would.
type failingConn struct{ grpc.ClientConnInterface }

func (failingConn) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	return status.Error(codes.ResourceExhausted, "queue full")
}

func TestPodPropagatesDownstreamErrors(t *testing.T) {
	t.Parallel()
	pod := newPod(t, Config{Name: "front-0", Workers: 1, Downstream: []Downstream{{Service: "leaf", Rate: 1, Conn: failingConn{}}}})
	conn := serve(t, pod)
	_, err := Call(context.Background(), conn, "", "")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "front-0 → leaf: queue full") {
		t.Errorf("err = %v, want ResourceExhausted naming the route", err)
	}
	if st := pod.Stats(); st.Failed != 1 || st.Served != 0 {
		t.Errorf("stats %+v, want 1 failed", st)
	}
}

func TestPodCancelledWhileQueued(t *testing.T) {
	t.Parallel()
	pod := newPod(t, Config{Name: "p-0", Workers: 1, ServiceTime: Fixed(time.Second)})
	conn := serve(t, pod)
	first, cancelFirst := context.WithCancel(context.Background())
	defer cancelFirst()
	go Call(first, conn, "", "") //nolint:errcheck // holds the only worker for a second
	testkit.Eventually(t, 10*time.Second, "the first request received", func() bool { return pod.Stats().Received[""] == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := Call(ctx, conn, "", "")
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("err = %v, want DeadlineExceeded", err)
	}
	testkit.Eventually(t, 10*time.Second, "the queued request to leave the queue", func() bool { return pod.Stats().Waiting == 0 })
}

func TestServeStopsOnCancel(t *testing.T) {
	t.Parallel()
	pod := newPod(t, Config{Name: "p-0", Workers: 1})
	lis := testkit.Listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pod.Serve(ctx, lis) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve = %v, want nil after cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if _, err := net.Dial("tcp", lis.Addr().String()); err == nil {
		t.Error("listener still open after Serve returned")
	}
}

func TestCallsPerRequest(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{0, 1, 2, 0.25, 1.5} {
		const n = 100_000
		total := 0
		for range n {
			k := calls(rate)
			if k < int(math.Floor(rate)) || k > int(math.Ceil(rate)) {
				t.Fatalf("calls(%v) = %d", rate, k)
			}
			total += k
		}
		if got := float64(total) / n; math.Abs(got-rate) > 0.01 {
			t.Errorf("rate %v: %.4f calls per request on average", rate, got)
		}
	}
}

func TestNewPodValidates(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{
		{Workers: 1},
		{Name: "p", Workers: 0},
		{Name: "p", Workers: 1, Downstream: []Downstream{{Service: "s", Rate: 1}}},
		{Name: "p", Workers: 1, Downstream: []Downstream{{Service: "s", Rate: math.NaN(), Conn: failingConn{}}}},
		{Name: "p", Workers: 1, Downstream: []Downstream{{Service: "s", Rate: -1, Conn: failingConn{}}}},
	} {
		if _, err := NewPod(cfg); err == nil {
			t.Errorf("NewPod(%+v): want an error", cfg)
		}
	}
}

// TestPodSetSlowdown: a slowdown set while the pod serves applies to the requests after it (the
// busy time counts each request's service time × its slowdown), also when set concurrently with
// requests in flight; a slowdown that is not positive and finite is refused and changes nothing.
func TestPodSetSlowdown(t *testing.T) {
	const service = 2 * time.Millisecond
	pod, err := NewPod(Config{Name: "p", Workers: 1, ServiceTime: Fixed(service)})
	if err != nil {
		t.Fatal(err)
	}
	conn := serve(t, pod)
	call := func(n int) {
		t.Helper()
		for range n {
			if _, err := Call(context.Background(), conn, "", ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	call(2)
	if got := pod.BusyTime(); got != 2*service {
		t.Fatalf("busy time %v after two requests, want %v", got, 2*service)
	}
	if err := pod.SetSlowdown(3); err != nil {
		t.Fatal(err)
	}
	call(2)
	if got, want := pod.BusyTime(), 2*service+2*3*service; got != want {
		t.Errorf("busy time %v after two more at slowdown 3, want %v", got, want)
	}
	for _, bad := range []float64{-1, math.NaN(), math.Inf(1)} {
		if err := pod.SetSlowdown(bad); err == nil {
			t.Errorf("SetSlowdown(%v) accepted", bad)
		}
	}
	// Concurrent with requests (the race detector's case); 0 means 1.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, f := range []float64{2, 5, 0} {
			if err := pod.SetSlowdown(f); err != nil {
				t.Error(err)
			}
		}
	}()
	call(3)
	wg.Wait()
	before := pod.BusyTime()
	call(1)
	if got := pod.BusyTime() - before; got != service {
		t.Errorf("a request at slowdown 0 (= 1) took %v of busy time, want %v", got, service)
	}
}

// TestPodRemoteRequestPaysOneLateTimer: a request from a remote node (2 ms of injected delay)
// answers 2 ms later than one from the pod's own node, at the median within 0.25 ms: its
// network delay's timer lateness is not added to its service time's (3 ms, fixed) — each pays
// one late timer. The requests alternate, so both see the same machine; on one so busy that a
// plain 2 ms timer is over a millisecond late at the median, the test skips.
func TestPodRemoteRequestPaysOneLateTimer(t *testing.T) {
	const d = 2 * time.Millisecond
	pod := newPod(t, Config{Name: "p-0", Node: "n1", Workers: 4, ServiceTime: Fixed(3 * time.Millisecond),
		Delay: func(from string) time.Duration {
			if from == "n2" {
				return d
			}
			return 0
		}})
	conn := serve(t, pod)
	ctx := context.Background()
	timed := func(f func() error) time.Duration {
		start := time.Now()
		if err := f(); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	call := func(node string) func() error {
		return func() error { _, err := Call(ctx, conn, "c-0", node); return err }
	}
	for range 20 { // connect, warm up
		timed(call("n1"))
	}
	var near, far, plain []time.Duration
	for range 150 {
		near = append(near, timed(call("n1")))
		far = append(far, timed(call("n2")))
		plain = append(plain, timed(func() error { return sleep(ctx, d) }))
	}
	for _, v := range [][]time.Duration{near, far, plain} {
		slices.Sort(v)
	}
	med := func(v []time.Duration) time.Duration { return v[len(v)/2] }
	t.Logf("median answer from n1 %v, from n2 %v (+%v injected); a plain %v timer %v", med(near), med(far), d, d, med(plain))
	if med(plain)-d > time.Millisecond {
		t.Skipf("machine too busy: a plain timer of %v is late by %v at the median", d, med(plain)-d)
	}
	if diff := med(far) - med(near) - d; diff < -250*time.Microsecond || diff > 250*time.Microsecond {
		t.Errorf("the remote request answers %v later than the local one; want the injected %v ± 0.25 ms", med(far)-med(near), d)
	}
}
