package main

import (
	"context"
	"math"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

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

// TestPodSlowAndMetrics: a pod run with --slow 3 serves /metrics on --metrics-addr, where its
// busy time is three times its seeded service-time draws, and its CPU request is exported.
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

	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + o.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
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
	resp, err := client.Get("http://" + o.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if cpu := mfs["container_cpu_usage_seconds_total"].GetMetric(); len(cpu) != 1 || math.Abs(cpu[0].GetCounter().GetValue()-want.Seconds()) > 1e-8 {
		t.Errorf("container_cpu_usage_seconds_total %v, want %v s (%d draws, then %d × 2)", cpu, want.Seconds(), n, n)
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
