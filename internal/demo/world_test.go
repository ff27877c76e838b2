package demo

import (
	"context"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/edgeflow/edgeflow/internal/demo/app"
	"github.com/edgeflow/edgeflow/optimizer"
)

func parseTopology(t *testing.T, src string) *optimizer.Topology {
	t.Helper()
	topo, err := optimizer.ParseTopology(strings.NewReader(src), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

// A service without calls needs no xDS server: its pods open no xDS channel.
const twoPodsOnOneNode = `
nodes: [{name: n1, cores: 1}, {name: n2}]
latency: [{from: n1, to: n2, ms: 2}]
services:
  - {name: a, namespace: shop, cpu: 250, pods: [{name: a-0, node: n1}, {name: a-1, node: n1}]}
ingress: [{service: a.shop, rps: 10}]`

// TestClusterWorld: the pods serve their /metrics on their own ports; the node's speed and a
// pod's slowdown, which the topology does not carry, show in the busy time each pod exports
// (its seeded service-time draws × slowdown ÷ speed).
func TestClusterWorld(t *testing.T) {
	t.Parallel()
	const mean = 3 * time.Millisecond
	cfg := Config{Topology: parseTopology(t, twoPodsOnOneNode), Workers: 1, ServiceTime: mean, Seed: 5, XDSServer: "127.0.0.1:1",
		NodeSpeed: map[string]float64{"n1": 0.5}, PodSlowdown: map[string]float64{"a-1": 3}}
	c, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	send, err := c.Ingress()
	if err != nil {
		t.Fatal(err)
	}
	const perPod = 3
	for i := range 2 * perPod { // smooth round-robin: a-0 and a-1 take turns
		if err := send(context.Background(), i); err != nil {
			t.Fatal(err)
		}
	}
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	urls := c.MetricsURLs()
	if len(urls) != 2 {
		t.Fatalf("metrics URLs %v, want one per pod", urls)
	}
	for pod, slowdown := range map[string]float64{"a-0": 1, "a-1": 3} {
		draws := app.NewExponential(mean, cfg.Seed^hash(pod))
		var want time.Duration
		for range perPod {
			d := draws.Draw()
			if slowdown != 1 {
				d = time.Duration(float64(d) * slowdown)
			}
			want += time.Duration(float64(d) / 0.5)
		}
		resp, err := client.Get(urls[pod])
		if err != nil {
			t.Fatal(err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: %v", pod, err)
		}
		var requests float64
		for _, m := range mfs["istio_requests_total"].GetMetric() {
			requests += m.GetCounter().GetValue()
		}
		if requests != perPod {
			t.Errorf("%s: istio_requests_total sums to %v, want %d", pod, requests, perPod)
		}
		cpu := mfs["container_cpu_usage_seconds_total"].GetMetric()
		if len(cpu) != 1 || math.Abs(cpu[0].GetCounter().GetValue()-want.Seconds()) > 1e-8 {
			t.Errorf("%s: container_cpu_usage_seconds_total %v, want %v s (slowdown %v, node speed 0.5)", pod, cpu, want.Seconds(), slowdown)
		}
		if req := mfs["kube_pod_container_resource_requests"].GetMetric(); len(req) != 1 || req[0].GetGauge().GetValue() != 0.25 {
			t.Errorf("%s: CPU request %v, want 0.25 cores", pod, req)
		}
	}
}

func TestStartRejectsUnknownWorld(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		speed, pod map[string]float64
		penalty    map[NodePair]time.Duration
		want       string
	}{
		{"unknown node", map[string]float64{"n9": 2}, nil, nil, `node speed of "n9": no such node`},
		{"bad speed", map[string]float64{"n2": -1}, nil, nil, "node n2: speed must be positive"},
		{"unknown pod", nil, map[string]float64{"b-0": 2}, nil, `slowdown of pod "b-0": no such pod`},
		{"bad slowdown", nil, map[string]float64{"a-0": math.Inf(1)}, nil, `slowdown of pod "a-0": must be positive`},
		{"penalty unknown node", nil, nil, map[NodePair]time.Duration{{"n1", "n9"}: time.Millisecond}, `L7 penalty n1:n9: no node "n9"`},
		{"penalty one node", nil, nil, map[NodePair]time.Duration{{"n1", "n1"}: time.Millisecond}, `L7 penalty n1:n1: a pair of one node`},
		{"penalty not positive", nil, nil, map[NodePair]time.Duration{{"n1", "n2"}: 0}, `L7 penalty n1:n2: 0s, want a positive delay`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Start(Config{Topology: parseTopology(t, twoPodsOnOneNode), Workers: 1, XDSServer: "127.0.0.1:1", NodeSpeed: c.speed, PodSlowdown: c.pod,
				L7Penalty: c.penalty})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Start: %v, want an error naming %q", err, c.want)
			}
		})
	}
}

// TestClusterSetSlowdown: a pod's slowdown changes at run time by its name; an unknown pod or a
// bad slowdown is an error. (TestClosedLoopFollowsASlowdown runs one.)
func TestClusterSetSlowdown(t *testing.T) {
	t.Parallel()
	c, err := Start(Config{Topology: parseTopology(t, twoPodsOnOneNode), Workers: 1, XDSServer: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	if err := c.SetSlowdown("a-1", 3); err != nil {
		t.Errorf("SetSlowdown(a-1, 3): %v", err)
	}
	for _, bad := range []struct {
		pod  string
		f    float64
		want string
	}{
		{"b-0", 2, `slowdown of pod "b-0": no such pod`},
		{"a-0", -1, "pod a-0: slowdown must be positive"},
	} {
		if err := c.SetSlowdown(bad.pod, bad.f); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("SetSlowdown(%s, %v): %v, want an error naming %q", bad.pod, bad.f, err, bad.want)
		}
	}
}
