package reproduce

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeflow/edgeflow/internal/demo/app"
	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// loopApp is the closed loop's application: front's pods call back's. Each pod has one worker
// and requests one core, so the utilisation law on its CPU request (the estimator's) measures
// the truth, workers / (mean service time × slowdown).
var loopApp = App{Name: "loop", Components: []Component{
	{Name: "front", Replicas: 3, CPU: "1", Calls: []string{"back"}},
	{Name: "back", Replicas: 3, CPU: "1"},
}}

// The closed loop on the testbed, as a user runs it. The figures are docs/closed-loop-testbed.md's.
const (
	loopService = 5 * time.Millisecond // mean exponential service time: 200 req/s a pod
	loopRate    = 330.0                // req/s: front 110 a pod (ρ 0.55); back 0.55 balanced, the slow pod 0.83 under round-robin
	loopSlow    = 1.5                  // back's slow pod, from the start (B), and the pod slowed mid-run (D)
	// loopWindow is serve's --prometheus-window: two of the pods' scrapes (podScrapeInterval),
	// the fewest increase() needs. serve's default, 4 × the probe job's scrape interval, is
	// 4 s here (the probes are scraped every second), shorter than one pod scrape: no pod load
	// would ever be measured.
	loopWindow = 2 * podScrapeInterval
	// loopQuery is serve's --prometheus-interval in the harness (Serve) and loopDebounce its
	// --debounce-max default: how late a round and its push may come after a window ends.
	loopQuery    = 2 * time.Second
	loopDebounce = time.Second
	// loopTolerance: a pod's estimated capacity against the truth (the issue's ±10 %).
	loopTolerance = 0.10
	// loopQuiet is how long serve must publish nothing for the plan to count as converged: two
	// estimator rounds that changed nothing.
	loopQuiet = 2 * loopWindow
	// loopObserve is how long the converged loop is watched for pushes: at most one in it.
	loopObserve = time.Minute
	// loopShareDrop is how far the pod slowed mid-run must lose planned share: one damping
	// threshold of back's traffic (xds/server's default Damping, 1 %), more than a push that
	// is not the loop's answer to the slowdown would move.
	loopShareDrop = 0.01
)

// TestClosedLoopOnTestbed runs the live loop as a user runs it, on the netns testbed: pods as
// processes in their node's namespace exporting a mesh's telemetry (Istio's request metrics,
// cAdvisor's CPU usage as the simulated busy time, the CPU request), a real Prometheus scraping
// them every 5 s with Istio's sample kubernetes-pods job (Kubernetes service discovery against
// the real kube-apiserver), `edgeflow serve --kubeconfig --prometheus-url --policy closed-loop`
// with the pod-load queries at their defaults, and real grpc-go clients: the load generator's
// open-loop requests to front, front's xDS clients calling back. One pod of back is 1.5× slower
// from the start; nothing tells edgeflow. It checks, reading what serve exposes
// (edgeflow_closed_loop_pod_capacity_rps, the web view's snapshot of the plan in force,
// edgeflow_xds_publications_total):
//
//	(a) once the plan has converged, every pod's estimated capacity is within ±10 % of the
//	    truth, 1 / (mean service time × slowdown), and its lower bound is at most the estimate;
//	(b) the slow pod's planned share of back's traffic is below each of its peers';
//	(d) the converged loop pushes at most once in the following minute;
//	(D) a fast pod of back slowed 1.5× mid-run (PUT /slowdown on the pod, hidden from edgeflow)
//	    loses planned share within 3 estimator windows plus the hold-down window (a window in
//	    which the plan in force changed keeps the capacities in force, watcher/capacity.go),
//	    counted from the end of the window in progress when it slowed;
//	(e) the callers' grpc-go exports its attempt metric by locality (grpc-go's OpenTelemetry
//	    plugin in the pods, scraped by Prometheus), and serve holds no latency penalty on this
//	    testbed, where none is hidden, that (D)'s step entered (those held before it are
//	    logged: an open defect).
func TestClosedLoopOnTestbed(t *testing.T) {
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	h := NewHarness(t, ctx, "flat", t.Output())
	h.rt.SlowNext("back", loopSlow)
	h.Deploy(loopApp, Workload{Workers: 1, ServiceTime: loopService, Metrics: true})
	slow := h.rt.Slowed("back")
	if slow == "" {
		t.Fatal("no pod of back was started slow")
	}
	s := h.Serve(loopApp, Policy{Name: "closed-loop", Allocation: "closed-loop", LB: "bands"}, loopRate,
		"--prometheus-window", loopWindow.String())
	front, back := h.podsOf("front"), h.podsOf("back")
	pods := append(slices.Clone(front), back...)
	truth := map[string]float64{}
	for _, p := range pods {
		truth[p] = 1 / loopService.Seconds()
	}
	truth[slow] /= loopSlow
	t.Logf("set up in %v: pods %v, back's slow pod %s (%.0f req/s; the others %.0f)", time.Since(begin).Round(time.Second),
		pods, slow, truth[slow], 1/loopService.Seconds())

	loadStart := time.Now()
	load := h.startLoad(t, loopApp, loopRate)
	read := func() loopState {
		st, err := readLoop(s, back)
		if err != nil {
			t.Logf("reading serve: %v", err)
		}
		return st
	}

	// (b) The plan with every pod's capacity measured spares the slow pod. Four estimator
	// rounds (the first sets the counters' base, then the estimator's 3 windows), a few more
	// for the first scrapes and the step limit's first push.
	var st loopState
	t.Cleanup(func() {
		if t.Failed() { // say what serve and Prometheus had
			t.Logf("at the failure: capacities %s; shares %s; %g publications", st.capacities(pods, truth), st.shares(back), st.publications)
			if snap, err := snapshot(s.ui); err == nil {
				b, _ := json.Marshal(snap.Edges)
				t.Logf("serve's plan in force (publication %d, %s): %.2000s", snap.Publication, snap.Policy, b)
			}
			for _, q := range []string{`up{job="kubernetes-pods"}`, `sum by (namespace, pod) (increase(istio_requests_total{reporter="destination"}[10s]))`,
				`sum by (namespace, pod) (increase(container_cpu_usage_seconds_total{container!="",container!="istio-proxy"}[10s]))`} {
				t.Logf("Prometheus: %s: %s", q, h.promQuery(q))
			}
		}
	})
	progress := time.Now()
	h.eventually(16*loopWindow, "every pod's capacity estimated and the slow pod's planned share below its peers'", func() bool {
		st = read()
		if time.Since(progress) >= loopWindow {
			progress = time.Now()
			t.Logf("%v of load: capacities %s; shares %s; %g publications", time.Since(loadStart).Round(time.Second),
				st.capacities(pods, truth), st.shares(back), st.publications)
		}
		return st.estimated(pods) && st.below(slow, back)
	})
	t.Logf("after %v of load: capacities %s; shares %s", time.Since(loadStart).Round(time.Second), st.capacities(pods, truth), st.shares(back))

	// Converged: serve published nothing for loopQuiet.
	lastPub, lastChange := st.publications, time.Now()
	h.eventually(12*loopWindow, fmt.Sprintf("the plan converged (no publication for %v)", loopQuiet), func() bool {
		st = read()
		if st.publications != lastPub {
			lastPub, lastChange = st.publications, time.Now()
		}
		return time.Since(lastChange) >= loopQuiet
	})
	t.Logf("converged after %v of load (%g publications): capacities %s; shares %s", time.Since(loadStart).Round(time.Second),
		st.publications, st.capacities(pods, truth), st.shares(back))

	// (a) Capacities within ±10 % of the truth.
	for _, p := range pods {
		est, lower := st.estimate[p], st.lower[p]
		if math.Abs(est-truth[p]) > loopTolerance*truth[p] {
			t.Errorf("(a) %s: estimated %.1f req/s, truth %.1f: off by %+.1f %%, more than ±%.0f %%", p, est, truth[p],
				100*(est/truth[p]-1), 100*loopTolerance)
		}
		if !(lower > 0 && lower <= est) {
			t.Errorf("(a) %s: lower bound %.1f req/s, estimate %.1f: want 0 < lower ≤ estimate", p, lower, est)
		}
	}
	// (b) still, on the converged plan.
	if !st.below(slow, back) {
		t.Errorf("(b) the converged plan gives the slow pod %s a share not below its peers': %s", slow, st.shares(back))
	}

	// (d) No oscillation: at most one push in the minute after convergence.
	from, converged := st.publications, time.Now()
	var pushedAt []string // when each publication was seen, after convergence
	for time.Since(converged) < loopObserve && !t.Failed() {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(time.Second):
		}
		prev := st.publications
		st = read()
		if st.publications != prev {
			pushedAt = append(pushedAt, fmt.Sprintf("+%v (shares %s)", time.Since(converged).Round(time.Second), st.shares(back)))
		}
	}
	if pushes := st.publications - from; pushes > 1 {
		t.Errorf("(d) %g publications in the %v after convergence, at %s; want at most 1", pushes, loopObserve, strings.Join(pushedAt, ", "))
	} else {
		t.Logf("(d) %g publications in the %v after convergence %s", pushes, loopObserve, strings.Join(pushedAt, ", "))
	}

	// (e) Latency penalties where none is hidden. Those held before (D) are logged, not
	// failed: some remote pairs here read a steady excess of 2–4 ms beyond ICMP and the
	// baseline in some runs, an open defect of the corrector (docs/closed-loop-testbed.md): the
	// CI run of c492244 held 1.91 ms on n1 → n4, a run after it 4.34 ms, one of seven runs here
	// on 2026-12-07 2.50 ms on n1 → n2 before (D). A penalty entered after (D) fails: the CI run
	// of 0a7606c held a false 4.14 ms on n3 → n1 that entered after (D) ((d) saw no push in the
	// minute before it), whose step in a band's inbound time read as ±4–9 ms of excess on the
	// pairs into it before the corrector's Steps rule.
	penalties := func(when string) map[string]float64 {
		m, err := metrics(s.metrics)
		if err != nil {
			t.Errorf("(e) serve's metrics %s: %v", when, err)
			return nil
		}
		held := map[string]float64{}
		var list []string
		for k, v := range m {
			if strings.HasPrefix(k, "edgeflow_closed_loop_latency_penalty_seconds{") && v > 0 {
				held[k] = v
				list = append(list, fmt.Sprintf("%s %.2f ms", k, 1000*v))
			}
		}
		slices.Sort(list)
		t.Logf("(e) latency penalties in force %s: %d %v", when, len(list), list)
		return held
	}
	heldBefore := penalties("before (D)")

	// (D) A fast pod of back slows 1.5× mid-run.
	victim := ""
	for _, p := range back {
		if p != slow {
			victim = p
			break
		}
	}
	before := st.share[victim]
	slowedAt := time.Now()
	h.setSlowdown(victim, loopSlow)
	// The slowed requests reach Prometheus at the next scrape; the window in progress then ends,
	// then 3 windows and the hold-down window; the round is queried and pushed up to loopQuery
	// and loopDebounce later.
	limit := podScrapeInterval + loopWindow + 3*loopWindow + loopWindow + loopQuery + loopDebounce
	h.eventually(limit, fmt.Sprintf("(D) %s's planned share to fall below %.3f − %.2f after it slowed %g× (3 windows and the hold-down)",
		victim, before, loopShareDrop, loopSlow), func() bool {
		st = read()
		return st.share[victim] > 0 && st.share[victim] < before-loopShareDrop
	})
	took := time.Since(slowedAt)
	t.Logf("(D) %s slowed %g×: planned share %.3f → %.3f after %v (%.1f windows; limit %v); its capacity estimate %.1f, lower %.1f req/s",
		victim, loopSlow, before, st.share[victim], took.Round(time.Second), took.Seconds()/loopWindow.Seconds(), limit,
		st.estimate[victim], st.lower[victim])

	// (e) The attempt metric by locality reaches Prometheus; no penalty where there is none.
	attempts := h.promQuery(`sum by (pod, grpc_target, grpc_lb_locality) (increase(grpc_client_attempt_duration_seconds_count{grpc_lb_locality!=""}[30s]))`)
	t.Logf("(e) Prometheus: the callers' attempts in 30 s by pod, target and locality: %s", attempts)
	if !strings.Contains(attempts, "edgeflow/band") {
		t.Errorf("(e) no grpc_client_attempt_duration_seconds series with a band locality in Prometheus: %s", attempts)
	}
	for k, v := range penalties("after (D)") {
		if _, ok := heldBefore[k]; !ok {
			t.Errorf("(e) a latency penalty entered after (D) on a testbed without one: %s = %.2f ms", k, 1000*v)
		}
	}

	sent, failed := load()
	t.Logf("load: %d requests in %v at %.0f req/s, %d failed; test %v", sent, time.Since(loadStart).Round(time.Second), loopRate, failed,
		time.Since(begin).Round(time.Second))
	if float64(failed) > smokeErrorShare*float64(sent) {
		t.Errorf("%d of %d requests failed, more than %.0f %%", failed, sent, 100*smokeErrorShare)
	}
}

// loopState is what serve exposes of the closed loop at one time.
type loopState struct {
	estimate, lower map[string]float64 // edgeflow_closed_loop_pod_capacity_rps by pod
	publications    float64            // edgeflow_xds_publications_total
	share           map[string]float64 // the plan in force: each back pod's share of back's planned req/s
}

// readLoop reads serve's metrics and its web view's snapshot; the callee pods are backPods.
func readLoop(s *proc, backPods []string) (loopState, error) {
	st := loopState{estimate: map[string]float64{}, lower: map[string]float64{}, share: map[string]float64{}}
	m, err := metrics(s.metrics)
	if err != nil {
		return st, err
	}
	st.estimate, st.lower = podCapacities(m)
	st.publications = m["edgeflow_xds_publications_total"]
	snap, err := snapshot(s.ui)
	if err != nil {
		return st, err
	}
	rps := map[string]float64{} // by callee pod; the plan names pods POD.NAMESPACE
	for _, e := range snap.Edges {
		for _, r := range e.Routes {
			rps[strings.TrimSuffix(r.Callee, "."+ns)] += r.RPS
		}
	}
	var total float64
	for _, p := range backPods {
		total += rps[p]
	}
	for _, p := range backPods {
		if total > 0 {
			st.share[p] = rps[p] / total
		}
	}
	return st, nil
}

// estimated says whether every pod has an estimate.
func (st loopState) estimated(pods []string) bool {
	for _, p := range pods {
		if _, ok := st.estimate[p]; !ok {
			return false
		}
	}
	return true
}

// below says whether pod's planned share is below each other pod's of pods.
func (st loopState) below(pod string, pods []string) bool {
	for _, p := range pods {
		if p != pod && !(st.share[pod] < st.share[p]) {
			return false
		}
	}
	return len(st.share) > 0
}

func (st loopState) capacities(pods []string, truth map[string]float64) string {
	var parts []string
	for _, p := range pods {
		est, ok := st.estimate[p]
		if !ok {
			parts = append(parts, p+" none")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.1f (lower %.1f; truth %.1f, %+.1f %%)", p, est, st.lower[p], truth[p], 100*(est/truth[p]-1)))
	}
	return strings.Join(parts, ", ")
}

func (st loopState) shares(pods []string) string {
	var parts []string
	for _, p := range pods {
		parts = append(parts, fmt.Sprintf("%s %.3f", p, st.share[p]))
	}
	return strings.Join(parts, ", ")
}

// podsOf returns the names of component's pods, sorted.
func (h *Harness) podsOf(component string) []string {
	l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{LabelSelector: "app=" + component})
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, p := range l.Items {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// setSlowdown slows pod by factor from its next request (the pod's PUT /slowdown, from the
// monitor namespace: the testbed's hand, not edgeflow's).
func (h *Harness) setSlowdown(pod string, factor float64) {
	p, err := h.cs.CoreV1().Pods(ns).Get(h.ctx, pod, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: h.tb.DialMonitor}}
	defer client.CloseIdleConnections()
	url := "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(podMetricsPort)) + "/slowdown"
	req, err := http.NewRequestWithContext(h.ctx, http.MethodPut, url, strings.NewReader(strconv.FormatFloat(factor, 'g', -1, 64)))
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		h.t.Fatalf("slowing %s: %v", pod, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("slowing %s: PUT %s: %s", pod, url, resp.Status)
	}
}

// startLoad sends open-loop load at rate to the application's entry pods from the monitor
// namespace, as Load does, until the returned function (or the test's cleanup) stops it; that
// function returns how many requests were sent and how many failed.
func (h *Harness) startLoad(t *testing.T, a App, rate float64) func() (sent, failed int64) {
	eps := h.endpoints(a.Entry())
	if len(eps) == 0 {
		t.Fatalf("no ready pod of %s", a.Entry())
	}
	r := manual.NewBuilderWithScheme("closedloop")
	var addrs []resolver.Address
	for _, e := range eps {
		addrs = append(addrs, resolver.Address{Addr: e})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	conn, err := grpc.NewClient("closedloop:///"+a.Entry(), grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return h.tb.DialMonitor(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	conn.Connect()
	loadCtx, cancel := context.WithCancel(h.ctx)
	var sent, failed atomic.Int64
	done := make(chan struct{})
	go func() { // ends when stop cancels loadCtx
		defer close(done)
		_, _ = loadgen.Run(loadCtx, loadgen.Config{Rate: rate, Duration: time.Hour, Timeout: 5 * time.Second},
			func(ctx context.Context, _ int) error {
				sent.Add(1)
				_, err := app.Call(ctx, conn, "", "")
				if err != nil && loadCtx.Err() == nil { // not cut short by stop
					failed.Add(1)
				}
				return err
			})
	}()
	var once sync.Once
	stop := func() (int64, int64) {
		once.Do(func() {
			cancel()
			<-done
			conn.Close()
		})
		return sent.Load(), failed.Load()
	}
	t.Cleanup(func() { stop() })
	return stop
}

// promQuery runs an instant query on the testbed's Prometheus and returns its answer's data as
// text (or the error), for a failure's report.
func (h *Harness) promQuery(q string) string {
	resp, err := metricsClient.Get(h.promURL + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<10))
	return string(b)
}
