package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgeflow/edgeflow/internal/demo/app"
)

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// startPod runs the pod with o until the test ends and returns a client connection to it
// (closed first at cleanup, then the pod stopped and its error checked).
func startPod(t *testing.T, o options) *grpc.ClientConn {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	conn, err := grpc.NewClient("passthrough:///"+o.listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestPodSlowAndMetrics: a pod run with --slow 3 serves /metrics on --metrics-addr, where its
// busy time is three times its seeded service-time draws, and its CPU request is exported.
func TestPodSlowAndMetrics(t *testing.T) {
	o := options{name: "p-0", node: "n1", listen: freeAddr(t), metricsAddr: freeAddr(t), workload: "p", namespace: "ns",
		workers: 1, service: 2 * time.Millisecond, seed: 9, slow: 3, cpuRequest: 0.25}
	conn := startPod(t, o)
	const n = 3
	for range n {
		ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := app.Call(ctx, conn, "", "", grpc.WaitForReady(true))
		stop()
		if err != nil {
			t.Fatal(err)
		}
	}
	draws := app.NewExponential(o.service, o.seed)
	var want time.Duration
	for range n {
		want += time.Duration(float64(draws.Draw()) * o.slow)
	}

	mfs := scrape(t, o.metricsAddr)
	if cpu := mfs["container_cpu_usage_seconds_total"].GetMetric(); len(cpu) != 1 || math.Abs(cpu[0].GetCounter().GetValue()-want.Seconds()) > 1e-8 {
		t.Errorf("container_cpu_usage_seconds_total %v, want %v s (%d draws × 3)", cpu, want.Seconds(), n)
	}
	if req := mfs["kube_pod_container_resource_requests"].GetMetric(); len(req) != 1 || req[0].GetGauge().GetValue() != 0.25 {
		t.Errorf("kube_pod_container_resource_requests %v, want 0.25", req)
	}
	var served float64
	for _, m := range mfs["istio_requests_total"].GetMetric() {
		served += m.GetCounter().GetValue()
	}
	if served != n {
		t.Errorf("istio_requests_total sums to %v, want %d", served, n)
	}
}

// TestPodSlowdownAtRunTime: PUT /slowdown on the metrics address changes the pod's slowdown
// from its next request: the busy time is the first calls' draws plus twice the next calls';
// a factor that is not positive and finite, or another method, is refused and changes nothing.
func TestPodSlowdownAtRunTime(t *testing.T) {
	o := options{name: "p-0", node: "n1", listen: freeAddr(t), metricsAddr: freeAddr(t), workers: 1,
		service: 2 * time.Millisecond, seed: 4, slow: 1}
	conn := startPod(t, o)
	call := func(n int) {
		for range n {
			ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := app.Call(ctx, conn, "", "", grpc.WaitForReady(true))
			stop()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	put := func(body string) int {
		req, err := http.NewRequest(http.MethodPut, "http://"+o.metricsAddr+"/slowdown", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	const n = 3
	call(n)
	for _, bad := range []string{"0", "-2", "NaN", "+Inf", "fast"} {
		if code := put(bad); code != http.StatusBadRequest {
			t.Errorf("PUT /slowdown %q: status %d, want 400", bad, code)
		}
	}
	if resp, err := client.Get("http://" + o.metricsAddr + "/slowdown"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /slowdown: status %d, want 405", resp.StatusCode)
	}
	if code := put("2"); code != http.StatusOK {
		t.Fatalf("PUT /slowdown 2: status %d, want 200", code)
	}
	call(n)
	draws := app.NewExponential(o.service, o.seed)
	var want time.Duration
	for i := range 2 * n {
		d := draws.Draw()
		if i >= n {
			d *= 2
		}
		want += d
	}
	if cpu := scrape(t, o.metricsAddr)["container_cpu_usage_seconds_total"].GetMetric(); len(cpu) != 1 || math.Abs(cpu[0].GetCounter().GetValue()-want.Seconds()) > 1e-8 {
		t.Errorf("container_cpu_usage_seconds_total %v, want %v s (%d draws, then %d × 2)", cpu, want.Seconds(), n, n)
	}
}

// scrape reads the pod's /metrics at addr.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// TestPodsShareNodeCores: two pods of one worker each, run with --node-cpu on one node of 1 core
// at half speed (app.ServeNodeCPU, as the harness serves it), 10 requests sent to each at once:
// every service time takes twice its draw (the node's speed, which only the core server knows),
// and the node's one core serves the two pods one request at a time, so the last answer comes
// no sooner than the two pods' busy time together (alone on their nodes they would overlap).
func TestPodsShareNodeCores(t *testing.T) {
	node, err := app.NewNodeCPU(app.NodeConfig{Name: "n1", Cores: 1, Speed: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "n1.sock")
	stop, err := app.StartNodeCPU(sock, node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("ServeNodeCPU: %v", err)
		}
	})
	pods := [2]options{}
	var conns [2]*grpc.ClientConn
	for i := range pods {
		pods[i] = options{name: fmt.Sprintf("p-%d", i), node: "n1", listen: freeAddr(t), metricsAddr: freeAddr(t), workers: 1,
			service: 4 * time.Millisecond, seed: uint64(3 + i), slow: 1, nodeCPU: sock}
		conns[i] = startPod(t, pods[i])
		ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := app.Call(ctx, conns[i], "", "", grpc.WaitForReady(true)) // connected, and one draw each
		stop()
		if err != nil {
			t.Fatal(err)
		}
	}
	const n = 10
	begin := time.Now()
	errs := make(chan error, 2*n)
	for i := range 2 * n {
		go func() {
			ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
			defer stop()
			_, err := app.Call(ctx, conns[i%2], "", "")
			errs <- err
		}()
	}
	for range 2 * n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(begin)
	var busy [2]float64
	for i, o := range pods {
		draws := app.NewExponential(o.service, o.seed)
		var want time.Duration
		for range n + 1 {
			want += 2 * draws.Draw()
		}
		cpu := scrape(t, o.metricsAddr)["container_cpu_usage_seconds_total"].GetMetric()
		if len(cpu) != 1 || math.Abs(cpu[0].GetCounter().GetValue()-want.Seconds()) > 1e-8 {
			t.Fatalf("pod %s: container_cpu_usage_seconds_total %v, want %v s (%d draws × 2: the node's speed 0.5)", o.name, cpu, want.Seconds(), n+1)
		}
		busy[i] = want.Seconds() - 2*app.NewExponential(o.service, o.seed).Draw().Seconds() // the first call's was before begin
	}
	if sum := time.Duration((busy[0] + busy[1]) * float64(time.Second)); took < sum {
		t.Errorf("the last of %d requests answered %v after the first was sent, sooner than the one core could serve both pods' %v of work", 2*n, took, sum)
	}
}

func TestPodRejectsBadSlow(t *testing.T) {
	for _, slow := range []float64{0, -1, math.Inf(1), math.NaN()} {
		o := options{name: "p-0", listen: "127.0.0.1:0", workers: 1, slow: slow}
		if err := run(context.Background(), o); err == nil {
			t.Errorf("--slow %v: want an error", slow)
		}
	}
}

func TestPodRejectsBadServiceFixed(t *testing.T) {
	for _, fixed := range []time.Duration{-time.Millisecond, 7 * time.Millisecond} {
		o := options{name: "p-0", listen: "127.0.0.1:0", workers: 1, slow: 1, service: 6 * time.Millisecond, serviceFixed: fixed}
		if err := run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "--service-fixed") {
			t.Errorf("--service-fixed %v with --service-time 6ms: %v, want an error naming the flag", fixed, err)
		}
	}
}
