package live

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime/metrics"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/xds"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// The scale of the real-path test: 5,000 pods on 500 nodes, in 100 services (half managed).
const (
	scaleNodes    = 500
	scaleServices = 100
	scalePerSvc   = 50
	scaleNS       = "scale"
	// podReadyBound is make bench-watch's pod-ready target (p99 ≤ 50 ms) doubled: the real
	// path must confirm the benchmark's figure within 2×.
	podReadyBound = 100 * time.Millisecond
	churnRate     = 100 // pod events per second
	churnFor      = 60 * time.Second
)

// TestWatchAtScale runs the watcher on a real kube-apiserver holding 5,000 pods on 500 nodes,
// with the xDS server and a real grpc-go xDS client sending RPCs throughout.
//
//   - pod-ready: a pod becomes ready (its status, then its EndpointSlice, as the kubelet and
//     the EndpointSlice controller write them) → the watcher's State holds it; p99 within 2× of
//     the benchmark's target (make bench-watch measures the same on client-go's fake API).
//   - churn: 100 pod events/s for 60 s (readiness flips in the managed services), while the
//     client calls api.shop every 2 ms: no RPC fails, the publications are bounded by the
//     debounce (one per DebounceMax while events never pause for DebounceQuiet, plus one per
//     pause), and the process's live heap is flat (the mean of the last 20 s within 5 % of the
//     first 20 s).
//
// Not parallel: its latencies and event rate are timed.
func TestWatchAtScale(t *testing.T) {
	if raceEnabled {
		t.Skip("timing test: runs without the race detector (make unit's last pass)")
	}
	// The caller and its callee, with real backends; ctx covers the setup and a minute of churn.
	lw := newWorld(t, worldOptions{kube: true, kubeNodes: []string{"n1", "n2"}, services: []string{"web", "api"},
		backends: []string{"api-0", "api-1"}})
	lw.pod("web", "web-0", "n1", true)
	lw.pod("api", "api-0", "n1", true)
	lw.pod("api", "api-1", "n2", true)
	c, ctx := lw.cluster, lw.ctx
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS, cfg.Burst = 5000, 10000 // the test plays every kubelet and controller at once
	cs, err := kubernetes.NewForConfig(cfg)
	must(t, err)

	w := newRealWorld(t, ctx, cs)
	t.Logf("created %d nodes, %d services, %d pods in %v", scaleNodes, scaleServices, len(w.pods), w.took.Round(time.Millisecond))

	reg := prometheus.NewRegistry()
	inf, err := kube.NewInformers(kube.InformersConfig{Client: c.Client, EndpointSlices: true})
	must(t, err)
	ks, err := kube.NewSource(kube.Config{Informers: inf, Selector: kube.DefaultSelector, Registerer: reg})
	must(t, err)
	defaultMS := 10.0
	opts := optimizer.Options{DefaultLatencyMS: &defaultMS}
	cl, err := watcher.NewLive(watcher.LiveConfig{Kube: ks, DefaultLatencyMS: &defaultMS, Options: opts, Check: xds.CheckTopology, Registerer: reg,
		CallGraph: &watcher.CallGraph{Calls: []optimizer.Call{{From: "web.shop", To: "api.shop"}}, Ingress: []optimizer.Ingress{{Service: "web.shop", RPS: 100}}}})
	must(t, err)
	srvCtx, stopInf := context.WithCancel(ctx)
	inf.Start(srvCtx)
	t.Cleanup(func() { stopInf(); inf.Stop() })
	xcfg := xdsserver.Config{Options: opts, Registerer: prometheus.NewRegistry()}
	srv, addr := xdsServer(t, xcfg, cl.Run)
	web := newCaller(t, lw.podNS, addr, "web-0.shop", "api.shop")
	testkit.Eventually(t, 2*time.Minute, "the first publication", func() bool { return srv.Published() > 0 })
	if st := ks.Current(); st == nil || len(st.Services) < scaleServices/2 {
		t.Fatalf("the watcher's State lacks the managed services")
	}
	if got := share(t, ctx, web, 200); got["api-0"]+got["api-1"] < 0.999 {
		t.Fatalf("api.shop before the churn: %s", fmtShare(got))
	}

	t.Run("pod-ready", func(t *testing.T) {
		// 300 flips: the p99 is the third-slowest, so one stall of the machine (CI's of
		// 2026-12-05: 173 ms, when this test's median was 1 ms) that delays the one or two
		// events in flight is not the p99 it reports; a watch that is slow is slow for many.
		var lat []time.Duration
		for i := range 300 {
			p := w.notReady[i%len(w.notReady)]
			at := w.flip(t, ctx, p, true)
			for !w.holds(ks.Current(), p, true) {
				if time.Since(at) > 30*time.Second {
					t.Fatalf("pod %s ready never in the State", w.pods[p].name)
				}
				time.Sleep(200 * time.Microsecond)
			}
			lat = append(lat, time.Since(at))
			w.flip(t, ctx, p, false)
			time.Sleep(50 * time.Millisecond)
		}
		p50, p99 := pct(lat, 0.5), pct(lat, 0.99)
		t.Logf("watch: scenario=pod-ready-real pods=%d nodes=%d event_p50_ms=%.1f event_p99_ms=%.1f (from the EndpointSlice write to the State)",
			len(w.pods), scaleNodes, ms(p50), ms(p99))
		if p99 > podReadyBound {
			t.Errorf("pod-ready p99 on the real API server %v, over %v (2× the benchmark's target)", p99, podReadyBound)
		}
	})

	t.Run("churn", func(t *testing.T) {
		heap := make(chan []float64, 1)
		sampleCtx, stopSample := context.WithCancel(ctx)
		go func() { heap <- sampleLiveHeap(sampleCtx, time.Second) }()
		loopCtx, stopLoop := context.WithCancel(ctx)
		wait := web.loop(loopCtx, 2*time.Millisecond)
		pub := srv.Published()
		sent, failed := web.sent.Load(), web.failed.Load()
		events, gaps := w.churn(t, ctx, churnRate, churnFor, xdsserver.DefaultDebounceQuiet)
		pushes := srv.Published() - pub
		stopLoop()
		wait()
		stopSample()
		samples := <-heap
		rpcs, fails := web.sent.Load()-sent, web.failed.Load()-failed
		bound := uint64(churnFor/xdsserver.DefaultDebounceMax) + uint64(gaps) + 2
		first, last := mean(samples[:min(20, len(samples))]), mean(samples[max(0, len(samples)-20):])
		if events < churnRate*int(churnFor/time.Second)*9/10 {
			t.Errorf("the API server took %d pod events in %v, under 90 %% of %d/s: the churn did not run at its rate", events, churnFor, churnRate)
		}
		t.Logf("churn: %d pod events in %v (%d pauses ≥ %v); %d RPCs, %d failed; %d publications (bound %d); live heap first 20 s %.1f MiB, last 20 s %.1f MiB (%+.1f %%)",
			events, churnFor, gaps, xdsserver.DefaultDebounceQuiet, rpcs, fails, pushes, bound, first/(1<<20), last/(1<<20), 100*(last-first)/first)
		if fails != 0 {
			t.Errorf("%d of %d RPCs failed during the churn (last error %v)", fails, rpcs, web.lastErr.Load())
		}
		if rpcs == 0 {
			t.Error("no RPC was sent during the churn")
		}
		if pushes > bound {
			t.Errorf("%d publications during the churn, over the debounce's bound %d", pushes, bound)
		}
		if pushes == 0 {
			t.Error("no publication during the churn: the events never reached the server")
		}
		if len(samples) < 50 {
			t.Fatalf("%d heap samples, want one a second", len(samples))
		}
		// Flat means no growth: a live heap that shrinks (the informers' and the server's first
		// allocations settling; -7.1 % in one CI run) is not a leak.
		if d := (last - first) / first; d > 0.05 {
			t.Errorf("live heap grew %+.1f %% between the first and the last 20 s of the churn, want at most +5 %%", 100*d)
		}
	})
}

// realWorld is the test's cluster on the real API server: 500 nodes, 100 services of 50 pods,
// each service with one EndpointSlice; in each managed service one pod starts not ready.
type realWorld struct {
	pods     []realPod
	slices   []*discoveryv1.EndpointSlice // by service
	mu       []sync.Mutex                 // by service: one writer of its slice at a time
	notReady []int
	managed  []int // ready pods of managed services
	took     time.Duration
	cs       kubernetes.Interface
}

type realPod struct {
	name, node, ip string
	svc            int
	ready          bool
	uid            string
}

func newRealWorld(t *testing.T, ctx context.Context, cs kubernetes.Interface) *realWorld {
	start := time.Now()
	w := &realWorld{cs: cs, slices: make([]*discoveryv1.EndpointSlice, scaleServices), mu: make([]sync.Mutex, scaleServices)}
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scaleNS}}, metav1.CreateOptions{})
	must(t, err)
	parallel(t, scaleNodes, func(i int) error {
		_, err := kubeapi.CreateNode(ctx, cs, kubeapi.NodeSpec{Name: fmt.Sprintf("node-%03d", i)})
		return err
	})
	for s := range scaleServices {
		for k := range scalePerSvc {
			i := len(w.pods)
			managed := s%2 == 0
			ready := !(managed && k == 0)
			w.pods = append(w.pods, realPod{name: fmt.Sprintf("svc-%03d-%02d", s, k), node: fmt.Sprintf("node-%03d", (s*scalePerSvc+k*7)%scaleNodes),
				ip: fmt.Sprintf("10.%d.%d.%d", 100+i/65536, (i/256)%256, i%256), svc: s, ready: ready})
			switch {
			case managed && ready:
				w.managed = append(w.managed, i)
			case managed:
				w.notReady = append(w.notReady, i)
			}
		}
	}
	parallel(t, scaleServices, func(s int) error {
		labels := map[string]string{}
		if s%2 == 0 {
			labels[kube.ManagedLabel] = "true"
		}
		_, err := cs.CoreV1().Services(scaleNS).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%03d", s), Labels: labels},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": fmt.Sprintf("svc-%03d", s)},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
		return err
	})
	parallel(t, len(w.pods), func(i int) error {
		p := &w.pods[i]
		created, err := cs.CoreV1().Pods(scaleNS).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: map[string]string{"app": fmt.Sprintf("svc-%03d", p.svc)}},
			Spec: corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "app", Image: "app",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}}}, metav1.CreateOptions{})
		if err == nil {
			p.uid = string(created.UID)
		}
		return err
	})
	// Every pod has the status its kubelet would have written: the churn then changes values,
	// never the shape of an object in the informers' caches (a pod's first status patch adds
	// its status and a managedFields entry, ~1 KiB, which read as heap growth).
	parallel(t, len(w.pods), func(i int) error { return w.status(ctx, i, w.pods[i].ready) })
	parallel(t, scaleServices, func(s int) error {
		sl := w.slice(s)
		created, err := cs.DiscoveryV1().EndpointSlices(scaleNS).Create(ctx, sl, metav1.CreateOptions{})
		w.slices[s] = created
		return err
	})
	w.took = time.Since(start)
	return w
}

// slice is service s's EndpointSlice as the EndpointSlice controller writes it.
func (w *realWorld) slice(s int) *discoveryv1.EndpointSlice {
	name := fmt.Sprintf("svc-%03d", s)
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-abcde", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}}}
	if old := w.slices[s]; old != nil {
		sl.ResourceVersion = old.ResourceVersion
	}
	for i := s * scalePerSvc; i < (s+1)*scalePerSvc; i++ {
		p := w.pods[i]
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(p.ready), Serving: ptr(p.ready), Terminating: ptr(false)},
			NodeName:   ptr(p.node), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: scaleNS, Name: p.name, UID: types.UID(p.uid)}})
	}
	return sl
}

// flip sets pod i ready or not: its status (the kubelet), then its slice (the EndpointSlice
// controller). It returns when the slice was written.
func (w *realWorld) flip(t *testing.T, ctx context.Context, i int, ready bool) time.Time {
	t.Helper()
	at, err := w.write(ctx, i, ready)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// write is flip for any goroutine: the error is returned.
func (w *realWorld) write(ctx context.Context, i int, ready bool) (time.Time, error) {
	p := &w.pods[i]
	if err := w.status(ctx, i, ready); err != nil {
		return time.Time{}, err
	}
	w.mu[p.svc].Lock()
	defer w.mu[p.svc].Unlock()
	p.ready = ready
	updated, err := w.cs.DiscoveryV1().EndpointSlices(scaleNS).Update(ctx, w.slice(p.svc), metav1.UpdateOptions{})
	if err != nil {
		return time.Time{}, fmt.Errorf("slice of %s: %w", p.name, err)
	}
	w.slices[p.svc] = updated
	return time.Now(), nil
}

// status writes pod i's status as its kubelet does: Running, its IP, and Ready or not.
func (w *realWorld) status(ctx context.Context, i int, ready bool) error {
	p := &w.pods[i]
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	patch := fmt.Sprintf(`{"status":{"phase":"Running","podIP":%q,"podIPs":[{"ip":%q}],"conditions":[{"type":"Ready","status":%q}]}}`, p.ip, p.ip, st)
	if _, err := w.cs.CoreV1().Pods(scaleNS).Patch(ctx, p.name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("pod %s status: %w", p.name, err)
	}
	return nil
}

// holds says whether st has pod i ready (true) or left out (false).
func (w *realWorld) holds(st *kube.State, i int, ready bool) bool {
	if st == nil {
		return false
	}
	p := w.pods[i]
	key := optimizer.QualifiedName(fmt.Sprintf("svc-%03d", p.svc), scaleNS)
	for _, s := range st.Services {
		if s.Key() == key {
			return slices.ContainsFunc(s.Pods, func(q optimizer.Pod) bool { return q.Name == p.name }) == ready
		}
	}
	return !ready
}

// churn flips the readiness of random pods of the managed services at rate events/s for d
// (one writer per service at a time, several services at once). It returns the events sent
// and the pauses of at least quiet between two of them.
func (w *realWorld) churn(t *testing.T, ctx context.Context, rate int, d, quiet time.Duration) (events, gaps int) {
	const workers = 50 // one per managed service: the rate holds while each write waits
	var mu sync.Mutex
	var done []time.Time
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for k := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// This worker's pods: those of every workers-th managed service (one writer per
			// slice).
			var mine []int
			for _, i := range w.managed {
				if (w.pods[i].svc/2)%workers == k { // the managed services are the even ones
					mine = append(mine, i)
				}
			}
			r := rand.New(rand.NewPCG(uint64(k), 7))
			tick := time.NewTicker(time.Second * workers / time.Duration(rate))
			defer tick.Stop()
			for time.Now().Before(end) {
				<-tick.C
				i := mine[r.IntN(len(mine))]
				at, err := w.write(ctx, i, !w.pods[i].ready)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				done = append(done, at)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(done, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(done); i++ {
		if done[i].Sub(done[i-1]) >= quiet {
			gaps++
		}
	}
	return len(done), gaps
}

func parallel(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	const workers = 16
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for k := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < n; i += workers {
				if err := f(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// sampleLiveHeap reads the Go runtime's live heap (the heap marked live by the last GC)
// every interval until ctx is done.
func sampleLiveHeap(ctx context.Context, every time.Duration) []float64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	var out []float64
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		metrics.Read(s)
		out = append(out, float64(s[0].Value.Uint64()))
	}
}

func pct(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

func ptr[T any](v T) *T { return &v }
