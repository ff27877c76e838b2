package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/internal/ui"
	"github.com/edgeflow/edgeflow/optimizer"
)

// TestServeWebView runs serve with --ui-address and a real grpc-go xDS client, and reads what
// the web view would show from /snapshot.json: the topology, the weights, the plan's cost
// against round-robin's (also on /metrics), the push answered, and a bad file as a degraded input.
func TestServeWebView(t *testing.T) {
	t.Parallel()
	addrs := echoAddrs(testkit.StartEchoes(t, "e-0", "e-1"))
	path := filepath.Join(t.TempDir(), "topology.yaml")
	writeFile(t, path, serveTopology(addrs, 5))

	stderr := startServeProcess(t, "serve", "-f", path, "--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
		"--ui-address", "127.0.0.1:0", "--debounce-quiet", "5ms", "--poll-interval", "10ms").stderr
	var xdsAddr, metricsURL, uiURL string
	re := regexp.MustCompile(`xDS on (\S+), metrics (http://\S+)/metrics`)
	reUI := regexp.MustCompile(`web view on (http://\S+)/\n`)
	testkit.Eventually(t, 15*time.Second, "the listening lines", func() bool {
		m, u := re.FindStringSubmatch(stderr.String()), reUI.FindStringSubmatch(stderr.String())
		if m != nil && u != nil {
			xdsAddr, metricsURL, uiURL = m[1], m[2], u[1]
		}
		return m != nil && u != nil
	})
	snapshot := func() *ui.Snapshot {
		code, body := httpGet(uiURL + "/snapshot.json")
		if code != 200 {
			t.Fatalf("/snapshot.json: %d %s", code, body)
		}
		var s ui.Snapshot
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			t.Fatalf("/snapshot.json: %v", err)
		}
		return &s
	}
	testkit.Eventually(t, 15*time.Second, "publication 1 in the view", func() bool { return snapshot().Publication == 1 })

	// A real xDS client: the push is answered.
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if _, err := echoClient(t, xdsAddr, "c-0").UnaryCall(rctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 15*time.Second, "the view to see the stream", func() bool { return snapshot().Push.Streams >= 1 })

	// e-0 on n1 and e-1 on n2, 5 ms apart: lata keeps each caller on its node.
	s := snapshot()
	if len(s.Nodes) != 2 || s.Nodes[0].Name != "n1" || len(s.Nodes[0].Pods) != 2 {
		t.Errorf("nodes %+v, want n1 and n2 with two pods each", s.Nodes)
	}
	if len(s.Edges) != 1 || s.Edges[0].From != "client" || s.Edges[0].To != "echo" {
		t.Fatalf("edges %+v, want client → echo", s.Edges)
	}
	for _, r := range s.Edges[0].Routes {
		if r.Fraction != 1 || r.LatencyMS != 0 {
			t.Errorf("route %+v, want every caller wholly on its own node", r)
		}
	}
	if s.CostMS != 0 || s.RoundRobinCostMS != 25 { // 10 req/s, half of it across 5 ms
		t.Errorf("cost %v, round-robin %v; want 0 and 25 ms·req/s", s.CostMS, s.RoundRobinCostMS)
	}
	if !s.Push.Converged {
		t.Errorf("push %+v: not answered", s.Push)
	}
	if len(s.Latency) != 2 || s.Latency[0].MS != 5 {
		t.Errorf("latency %+v, want n1↔n2 5 ms", s.Latency)
	}
	_, page := httpGet(metricsURL + "/metrics")
	for label, want := range map[string]float64{"served": 0, "round_robin": 0.025} {
		v := metricValue(page, `edgeflow_plan_latency_cost_seconds{allocation="`+label+`"}`)
		if got, err := strconv.ParseFloat(v, 64); err != nil || math.Abs(got-want) > 1e-9 {
			t.Errorf("edgeflow_plan_latency_cost_seconds{allocation=%q} = %q, want %v", label, v, want)
		}
	}

	// A bad file is a degraded input until a good one comes.
	writeFile(t, path, "nodes: [{name: n1}]\nservices: [{name: echo, pods: [{name: e-0, node: nowhere}]}]\n")
	testkit.Eventually(t, 15*time.Second, "the bad file in the view", func() bool {
		d := snapshot().Degraded
		return len(d) == 1 && d[0].Input == "topology file"
	})
	// e-0 moves to n2 (a membership change, so it is pushed), 7 ms from n1.
	moved := strings.Replace(serveTopology(addrs, 7), "{name: e-0, node: n1", "{name: e-0, node: n2", 1)
	writeFile(t, path, moved)
	testkit.Eventually(t, 15*time.Second, "publication 2 without degraded inputs", func() bool {
		s := snapshot()
		return s.Publication == 2 && len(s.Degraded) == 0 && s.RoundRobinCostMS == 35 && len(s.Nodes[1].Pods) == 3
	})
}

func TestServeWebViewOnlyOnLoopback(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "good.yaml")
	writeFile(t, path, serveTopology(map[string]string{"e-0": "10.0.0.1:80", "e-1": "10.0.0.2:80"}, 5))
	for _, addr := range []string{"0.0.0.0:0", ":0", "edgeflow.example:8080"} {
		code, stdout, stderr := runCLI(t, "", "serve", "-f", path, "--xds-address", "127.0.0.1:0", "--ui-address", addr)
		if code != exitBadInput || stdout != "" || !strings.Contains(stderr, "--ui-address "+addr+" is not a loopback address") {
			t.Errorf("--ui-address %s: exit %d, stdout %q, stderr %q; want exit 2 naming it", addr, code, stdout, stderr)
		}
	}
}

// publishedOnly is an xDS server that has published a topology the follower was never handed
// (in serve's fan-out the follower's Update comes after the server's).
type publishedOnly struct {
	t *optimizer.Topology
	a *optimizer.Allocation
}

func (p publishedOnly) Published() uint64 { return 1 }
func (p publishedOnly) Publication() (uint64, *optimizer.Topology, *optimizer.Allocation) {
	return 1, p.t, p.a
}
func (p publishedOnly) WaitPublished(ctx context.Context, _ uint64) error {
	<-ctx.Done()
	return ctx.Err()
}
func (p publishedOnly) WaitConverged(ctx context.Context, _ uint64) error {
	<-ctx.Done()
	return ctx.Err()
}

// The view of a publication is the topology that publication was planned from, whether or not
// the follower's own Update has come yet (a CI run under load showed an empty node list).
func TestSnapshotIsThePublicationsTopology(t *testing.T) {
	t.Parallel()
	top, err := optimizer.ParseTopology(strings.NewReader(serveTopology(map[string]string{"e-0": "127.0.0.1:1", "e-1": "127.0.0.1:2"}, 5)), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := lataSnapshot(t, top)
	if s.Publication != 1 || len(s.Nodes) != 2 || len(s.Latency) != 2 || s.RoundRobinCostMS != 25 {
		t.Errorf("snapshot: publication %d, nodes %+v, latency %+v, round-robin cost %v; want 1, n1 and n2, n1↔n2, 25",
			s.Publication, s.Nodes, s.Latency, s.RoundRobinCostMS)
	}
}

// TestSnapshotNamesPodsAsRoutesDo: outside the default namespace the plan's routes name pods
// "POD.NAMESPACE"; the snapshot's nodes and services must name them alike, or the page (which
// places a route at its pods' positions by name) draws none of them.
func TestSnapshotNamesPodsAsRoutesDo(t *testing.T) {
	t.Parallel()
	const file = `
nodes: [{name: n1}, {name: n2}]
latency: [{from: n1, to: n2, ms: 5}]
services:
  - {name: a, namespace: shop, pods: [{name: a-0, node: n1}]}
  - {name: b, namespace: shop, pods: [{name: b-0, node: n1}, {name: b-1, node: n2}]}
calls: [{from: a.shop, to: b.shop}]
ingress: [{service: a.shop, rps: 10}]
`
	top, err := optimizer.ParseTopology(strings.NewReader(file), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := lataSnapshot(t, top)
	onNode, inService := map[string]bool{}, map[string]bool{}
	for _, n := range s.Nodes {
		for _, p := range n.Pods {
			onNode[p.Name] = true
		}
	}
	for _, sv := range s.Services {
		for _, p := range sv.Pods {
			inService[p] = true
		}
	}
	var routes int
	for _, e := range s.Edges {
		for _, r := range e.Routes {
			routes++
			for _, pod := range []string{r.Caller, r.Callee} {
				if !onNode[pod] || !inService[pod] {
					t.Errorf("route %s → %s: pod %q is on no node (%v) or in no service (%v) of the snapshot", r.Caller, r.Callee, pod, onNode, inService)
				}
			}
		}
	}
	if routes == 0 || !onNode["b-1.shop"] {
		t.Errorf("snapshot: %d routes, pods on nodes %v; want routes, and b-1.shop on a node", routes, onNode)
	}
}

// lataSnapshot is the web view's snapshot of top's LATA plan, published as serve publishes it.
func lataSnapshot(t *testing.T, top *optimizer.Topology) *ui.Snapshot {
	t.Helper()
	m, err := optimizer.Compile(top, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := optimizer.Plan(m, optimizer.LATA)
	if err != nil {
		t.Fatal(err)
	}
	f, err := newPublicationFollower(publishedOnly{top, a}, prometheus.NewRegistry(), optimizer.LATA, optimizer.Options{}, nil, nil, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	return f.snapshot(time.Now())
}
