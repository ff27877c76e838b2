package watcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/edgeflow/edgeflow/internal/kubetest"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// Every goroutine a test starts (informers, Prometheus polling, the merge loop) ends with it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newCluster builds a Live source on a fake (never run) Kubernetes source unless cfg has one, with
// its metrics in a fresh registry.
func newCluster(t *testing.T, cfg LiveConfig) (*Live, *prometheus.Registry) {
	t.Helper()
	if cfg.Kube == nil {
		ks, err := kube.NewSource(kube.Config{Client: kubetest.NewClientset()})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Kube = ks
	}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := NewLive(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, reg
}

// metric reads a gauge or counter from reg; labels are name, value pairs.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

// ignoredCalls reads edgeflow_cluster_calls_ignored by reason.
func ignoredCalls(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, r := range []string{CallUnmanaged, CallNoService, CallCycle} {
		if v := metric(t, reg, "edgeflow_cluster_calls_ignored", "reason", r); v != 0 {
			out[r] = v
		}
	}
	return out
}

// loads compiles top (which must compile) and returns each service's Λ by key.
func loads(t *testing.T, top *optimizer.Topology) map[string]float64 {
	t.Helper()
	m, err := optimizer.Compile(top, optimizer.Options{})
	if err != nil {
		t.Fatalf("merged topology does not compile: %v", err)
	}
	out := map[string]float64{}
	for _, s := range m.Services {
		out[s.Name] = s.Load
	}
	return out
}

// service is a managed service of the State: key is NAME or NAME.NAMESPACE, and each pod is
// "POD@NODE".
func service(key string, pods ...string) optimizer.Service {
	name, ns, _ := strings.Cut(key, ".")
	if ns == "" {
		ns = optimizer.DefaultNamespace
	}
	s := optimizer.Service{Name: name, Namespace: ns, Ports: []optimizer.Port{{Name: "http", Port: 80, TargetPort: 8080}}}
	for i, p := range pods {
		pod, node, _ := strings.Cut(p, "@")
		s.Pods = append(s.Pods, optimizer.Pod{Name: pod, Node: node, IP: fmt.Sprintf("10.0.%d.%d", len(name), i+1)})
	}
	return s
}

func state(nodes []string, services ...optimizer.Service) *kube.State {
	st := &kube.State{Workloads: map[kube.Workload][]string{}, Skipped: map[string]int{}}
	for _, n := range nodes {
		st.Nodes = append(st.Nodes, optimizer.Node{Name: n, CPU: 4000, Memory: 8192})
	}
	st.Services = services
	slices.SortFunc(st.Services, func(a, b optimizer.Service) int { return strings.Compare(a.Key(), b.Key()) })
	return st
}

// clusterState is a Kubernetes state under construction.
type clusterState struct{ *kube.State }

// backs records that workload ("NAME" or "NAMESPACE/NAME") backs the services keys.
func (c clusterState) backs(workload string, keys ...string) clusterState {
	c.Workloads[kubeWorkload(workload)] = keys
	return c
}

func kubeWorkload(w string) kube.Workload {
	ns, name, ok := strings.Cut(w, "/")
	if !ok {
		ns, name = optimizer.DefaultNamespace, w
	}
	return kube.Workload{Name: name, Namespace: ns}
}

// rate is a measured call rate between workloads ("NAME" or "NAMESPACE/NAME").
func rate(from, to string, rps float64) prom.CallRate {
	f, tt := kubeWorkload(from), kubeWorkload(to)
	return prom.CallRate{From: prom.Workload{Name: f.Name, Namespace: f.Namespace}, To: prom.Workload{Name: tt.Name, Namespace: tt.Namespace}, RPS: rps}
}

func ms(v float64) *float64 { return &v }

var approx = cmpopts.EquateApprox(1e-9, 1e-9)

func TestMergeLatency(t *testing.T) {
	t.Parallel()
	st := state([]string{"n1", "n2", "n3"}, service("a", "a-1@n1"))
	tests := []struct {
		name           string
		defaultMS      *float64
		meas           *prom.Measurements
		want           map[prom.Pair]float64 // every ordered pair listed
		wantUnmeasured float64
	}{{
		name: "a pair never measured gets the largest measured latency",
		meas: &prom.Measurements{Latency: map[prom.Pair]float64{{From: "n1", To: "n2"}: 4, {From: "n2", To: "n1"}: 5, {From: "n2", To: "n3"}: 10, {From: "n1", To: "n1"}: 0.1}},
		want: map[prom.Pair]float64{
			{From: "n1", To: "n1"}: 0.1,
			{From: "n1", To: "n2"}: 4, {From: "n2", To: "n1"}: 5,
			{From: "n2", To: "n3"}: 10, {From: "n3", To: "n2"}: 10, // one direction measured: both
			{From: "n1", To: "n3"}: 10, {From: "n3", To: "n1"}: 10, // never measured
		},
		wantUnmeasured: 1,
	}, {
		name:      "a pair never measured gets DefaultLatencyMS when set",
		defaultMS: ms(7),
		meas:      &prom.Measurements{Latency: map[prom.Pair]float64{{From: "n1", To: "n2"}: 4, {From: "n2", To: "n3"}: 10}},
		want: map[prom.Pair]float64{
			{From: "n1", To: "n2"}: 4, {From: "n2", To: "n1"}: 4,
			{From: "n2", To: "n3"}: 10, {From: "n3", To: "n2"}: 10,
			{From: "n1", To: "n3"}: 7, {From: "n3", To: "n1"}: 7,
		},
		wantUnmeasured: 1,
	}, {
		name: "a pair naming an unknown node is not used, nor its latency the largest",
		meas: &prom.Measurements{Latency: map[prom.Pair]float64{{From: "n1", To: "n2"}: 4, {From: "n1", To: "gone"}: 500}},
		want: map[prom.Pair]float64{
			{From: "n1", To: "n2"}: 4, {From: "n2", To: "n1"}: 4,
			{From: "n1", To: "n3"}: 4, {From: "n3", To: "n1"}: 4,
			{From: "n2", To: "n3"}: 4, {From: "n3", To: "n2"}: 4,
		},
		wantUnmeasured: 2,
	}, {
		name: "no measurements at all, no default: every pair equal, never 0 ms",
		want: map[prom.Pair]float64{
			{From: "n1", To: "n2"}: 1, {From: "n2", To: "n1"}: 1,
			{From: "n1", To: "n3"}: 1, {From: "n3", To: "n1"}: 1,
			{From: "n2", To: "n3"}: 1, {From: "n3", To: "n2"}: 1,
			{From: "n1", To: "n1"}: 1, {From: "n2", To: "n2"}: 1, {From: "n3", To: "n3"}: 1,
		},
		wantUnmeasured: 3,
	}, {
		name:      "no measurements at all, a default",
		defaultMS: ms(25),
		meas:      &prom.Measurements{},
		want: map[prom.Pair]float64{
			{From: "n1", To: "n2"}: 25, {From: "n2", To: "n1"}: 25,
			{From: "n1", To: "n3"}: 25, {From: "n3", To: "n1"}: 25,
			{From: "n2", To: "n3"}: 25, {From: "n3", To: "n2"}: 25,
		},
		wantUnmeasured: 3,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, reg := newCluster(t, LiveConfig{CallGraph: &CallGraph{}, DefaultLatencyMS: tt.defaultMS})
			top := c.Merge(st, tt.meas)
			got := map[prom.Pair]float64{}
			for _, l := range top.Latency {
				got[prom.Pair{From: l.From, To: l.To}] = l.MS
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("latency (-want +got):\n%s", diff)
			}
			if g := metric(t, reg, "edgeflow_latency_unmeasured_pairs"); g != tt.wantUnmeasured {
				t.Errorf("edgeflow_latency_unmeasured_pairs = %v, want %v", g, tt.wantUnmeasured)
			}
			loads(t, top) // compiles without a default: every pair is listed
		})
	}
}

func TestMergeMeasuredCalls(t *testing.T) {
	t.Parallel()
	nodes := []string{"n1", "n2"}
	// front, mid, back and cache are Deployments of the same names; db is a StatefulSet whose
	// two pods each back their own service; api lives in namespace shop.
	base := func() clusterState {
		return clusterState{state(nodes,
			service("front", "front-1@n1"), service("mid", "mid-1@n1", "mid-2@n2"), service("back", "back-1@n2"),
			service("db-0", "db-0@n1"), service("db-1", "db-1@n2"), service("cache", "cache-1@n1"),
			service("api.shop", "api-1@n2"),
		)}.backs("front", "front").backs("mid", "mid").backs("back", "back").
			backs("db", "db-0", "db-1").backs("cache", "cache").backs("shop/api", "api.shop")
	}
	const gw = "istio-system/istio-ingressgateway" // backs no managed service
	tests := []struct {
		name        string
		st          clusterState
		calls       []prom.CallRate
		wantCalls   []optimizer.Call
		wantIngress []optimizer.Ingress
		// wantLoads is each service's Λ after optimizer.Compile: the measured rate into it
		// (over the calls kept).
		wantLoads   map[string]float64
		wantIgnored map[string]float64
	}{{
		name: "rates by workload become per-request rates; a caller backing no service is ingress",
		st:   base(),
		calls: []prom.CallRate{
			rate(gw, "front", 100), rate("front", "mid", 50), rate("front", "back", 30), rate("mid", "back", 20),
			rate(gw, "shop/api", 8), rate("shop/api", "front", 4),
		},
		wantCalls: []optimizer.Call{
			{From: "api.shop", To: "front", Rate: ms(0.5)},
			{From: "front", To: "back", Rate: ms(0.3 * 100 / 104)},
			{From: "front", To: "mid", Rate: ms(0.5 * 100 / 104)},
			{From: "mid", To: "back", Rate: ms(0.4)},
		},
		wantIngress: []optimizer.Ingress{{Service: "api.shop", RPS: 8}, {Service: "front", RPS: 100}},
		wantLoads:   map[string]float64{"api.shop": 8, "front": 104, "mid": 50, "back": 50, "db-0": 0, "db-1": 0, "cache": 0},
	}, {
		name: "a call to a workload backing no managed service is ignored",
		st:   base(),
		calls: []prom.CallRate{
			rate(gw, "front", 10), rate("front", "mid", 5), rate("front", "payments/stripe-proxy", 3), rate(gw, "default/legacy", 1),
		},
		wantCalls:   []optimizer.Call{{From: "front", To: "mid", Rate: ms(0.5)}},
		wantIngress: []optimizer.Ingress{{Service: "front", RPS: 10}},
		wantLoads:   map[string]float64{"api.shop": 0, "front": 10, "mid": 5, "back": 0, "db-0": 0, "db-1": 0, "cache": 0},
		wantIgnored: map[string]float64{CallUnmanaged: 2},
	}, {
		name:  "a caller with no measured inbound load: its calls are its own ingress",
		st:    base(),
		calls: []prom.CallRate{rate("front", "mid", 40), rate("front", "back", 10), rate("mid", "cache", 20)},
		wantCalls: []optimizer.Call{
			{From: "front", To: "back", Rate: ms(0.25)},
			{From: "front", To: "mid", Rate: ms(1)},
			{From: "mid", To: "cache", Rate: ms(0.5)},
		},
		wantIngress: []optimizer.Ingress{{Service: "front", RPS: 40}},
		wantLoads:   map[string]float64{"api.shop": 0, "front": 40, "mid": 40, "back": 10, "db-0": 0, "db-1": 0, "cache": 20},
	}, {
		name:  "a workload backing two services calls as the first (by key) and is called as each, the rate split equally",
		st:    base(),
		calls: []prom.CallRate{rate(gw, "front", 60), rate("front", "db", 60), rate("db", "cache", 10), rate(gw, "db", 6)},
		wantCalls: []optimizer.Call{
			{From: "db-0", To: "cache", Rate: ms(10.0 / 33)},
			{From: "front", To: "db-0", Rate: ms(0.5)},
			{From: "front", To: "db-1", Rate: ms(0.5)},
		},
		wantIngress: []optimizer.Ingress{{Service: "db-0", RPS: 3}, {Service: "db-1", RPS: 3}, {Service: "front", RPS: 60}},
		wantLoads:   map[string]float64{"api.shop": 0, "front": 60, "mid": 0, "back": 0, "db-0": 33, "db-1": 33, "cache": 10},
	}, {
		name: "a call closing a cycle is dropped and counted; the calls kept carry their measured rates",
		st:   base(),
		calls: []prom.CallRate{
			rate(gw, "front", 10), rate("front", "mid", 10), rate("mid", "front", 4), rate("mid", "back", 6),
			rate("back", "back", 2), // a workload calling itself
		},
		wantCalls: []optimizer.Call{
			{From: "front", To: "mid", Rate: ms(1)},
			{From: "mid", To: "back", Rate: ms(0.6)},
		},
		wantIngress: []optimizer.Ingress{{Service: "front", RPS: 10}},
		wantLoads:   map[string]float64{"api.shop": 0, "front": 10, "mid": 10, "back": 6, "db-0": 0, "db-1": 0, "cache": 0},
		wantIgnored: map[string]float64{CallCycle: 2},
	}, {
		name: "a two-service cycle with no other ingress keeps its load",
		st:   base(),
		calls: []prom.CallRate{
			rate("front", "mid", 10), rate("mid", "front", 5), rate("mid", "back", 2),
		},
		wantCalls: []optimizer.Call{
			{From: "front", To: "mid", Rate: ms(1)},
			{From: "mid", To: "back", Rate: ms(0.2)},
		},
		wantIngress: []optimizer.Ingress{{Service: "front", RPS: 10}},
		wantLoads:   map[string]float64{"api.shop": 0, "front": 10, "mid": 10, "back": 2, "db-0": 0, "db-1": 0, "cache": 0},
		wantIgnored: map[string]float64{CallCycle: 1},
	}, {
		name:  "a call measured at zero from a caller with no inbound load",
		st:    base(),
		calls: []prom.CallRate{rate("front", "mid", 0), rate("mid", "back", 5)},
		wantCalls: []optimizer.Call{
			{From: "front", To: "mid", Rate: ms(0)},
			{From: "mid", To: "back", Rate: ms(1)},
		},
		wantIngress: []optimizer.Ingress{{Service: "front", RPS: 0}, {Service: "mid", RPS: 5}},
		wantLoads:   map[string]float64{"api.shop": 0, "front": 0, "mid": 5, "back": 5, "db-0": 0, "db-1": 0, "cache": 0},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, reg := newCluster(t, LiveConfig{Prom: promStub})
			top := c.Merge(tt.st.State, &prom.Measurements{Calls: tt.calls})
			if diff := cmp.Diff(tt.wantCalls, top.Calls, approx); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantIngress, top.Ingress, approx); diff != "" {
				t.Errorf("ingress (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantLoads, loads(t, top), approx); diff != "" {
				t.Errorf("Λ after Compile (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantIgnored, ignoredCalls(t, reg), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("edgeflow_cluster_calls_ignored (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMergeStaticCallGraph(t *testing.T) {
	t.Parallel()
	// x has no ready pods, so the Kubernetes source left it out.
	st := state([]string{"n1", "n2"}, service("a", "a-1@n1"), service("b", "b-1@n2"), service("c", "c-1@n1"), service("d.shop", "d-1@n2"))
	graph := &CallGraph{
		Calls: []optimizer.Call{
			{From: "a", To: "b", Rate: ms(2)},
			{From: "b.default", To: "c"},
			{From: "a", To: "x"},
			{From: "x", To: "c"},
			{From: "c", To: "a.default"}, // closes a → b → c → a
			{From: "a.default", To: "d.shop", Rate: ms(0.5)},
		},
		Ingress: []optimizer.Ingress{{Service: "a.default", RPS: 10}, {Service: "x", RPS: 5}},
	}
	c, reg := newCluster(t, LiveConfig{CallGraph: graph})
	// Measured call rates are not used when the call graph is given.
	top := c.Merge(st, &prom.Measurements{Calls: []prom.CallRate{rate("c", "d", 100)}})
	wantCalls := []optimizer.Call{{From: "a", To: "b", Rate: ms(2)}, {From: "b", To: "c"}, {From: "a", To: "d.shop", Rate: ms(0.5)}}
	if diff := cmp.Diff(wantCalls, top.Calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]optimizer.Ingress{{Service: "a", RPS: 10}}, top.Ingress); diff != "" {
		t.Errorf("ingress (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{"a": 10, "b": 20, "c": 20, "d.shop": 5}, loads(t, top), approx); diff != "" {
		t.Errorf("Λ after Compile (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{CallNoService: 3, CallCycle: 1}, ignoredCalls(t, reg)); diff != "" {
		t.Errorf("edgeflow_cluster_calls_ignored (-want +got):\n%s", diff)
	}
	if graph.Calls[1].From != "b.default" || graph.Ingress[0].Service != "a.default" {
		t.Error("Merge modified the configured call graph")
	}

	// When x gets ready pods, its calls come back and nothing is ignored but the cycle.
	st = state([]string{"n1", "n2"}, service("a", "a-1@n1"), service("b", "b-1@n2"), service("c", "c-1@n1"), service("d.shop", "d-1@n2"), service("x", "x-1@n2"))
	top = c.Merge(st, nil)
	if len(top.Calls) != 5 || len(top.Ingress) != 2 {
		t.Errorf("with x ready: calls %v, ingress %v", top.Calls, top.Ingress)
	}
	loads(t, top)
	if diff := cmp.Diff(map[string]float64{CallCycle: 1}, ignoredCalls(t, reg)); diff != "" {
		t.Errorf("edgeflow_cluster_calls_ignored with x ready (-want +got):\n%s", diff)
	}
}

// A pod that backs two managed services (a Service and its headless twin select the same
// pods) is listed in both; a topology must still compile, since the optimizer requires unique
// pod names.
func TestMergeSharedPods(t *testing.T) {
	t.Parallel()
	web := service("web", "web-1@n1", "web-2@n2")
	headless := web
	headless.Name, headless.Ports = "web-headless", nil
	st := clusterState{state([]string{"n1", "n2"},
		service("front", "front-1@n1"), web, headless,
		service("web.shop", "web-1@n2"), // another namespace: another pod of the same name
	)}.backs("front", "front").backs("web", "web", "web-headless").backs("shop/web", "web.shop")
	c, _ := newCluster(t, LiveConfig{Prom: promStub})
	top := c.Merge(st.State, &prom.Measurements{Calls: []prom.CallRate{
		rate("istio-system/gw", "front", 10), rate("front", "web", 10), rate("web", "shop/web", 5),
	}})
	l := loads(t, top)
	if diff := cmp.Diff(map[string]float64{"front": 10, "web": 5, "web-headless": 5, "web.shop": 5}, l, approx); diff != "" {
		t.Errorf("Λ after Compile (-want +got):\n%s", diff)
	}
	pods := map[string][]string{}
	for _, s := range top.Services {
		for _, p := range s.Pods {
			pods[s.Key()] = append(pods[s.Key()], p.Name+" "+p.Node+" "+p.IP)
		}
	}
	want := map[string][]string{
		"front":        {"front-1 n1 10.0.5.1"},
		"web":          {"web-1 n1 10.0.3.1", "web-2 n2 10.0.3.2"},
		"web-headless": {"web-1@web-headless n1 10.0.3.1", "web-2@web-headless n2 10.0.3.2"},
		"web.shop":     {"web-1 n2 10.0.3.1"},
	}
	if diff := cmp.Diff(want, pods); diff != "" {
		t.Errorf("pods (name node ip) (-want +got):\n%s", diff)
	}
	if st.Services[2].Pods[0].Name != "web-1" {
		t.Error("Merge modified the Kubernetes state")
	}
}

// One bad item never freezes everything: whatever the Kubernetes and Prometheus sources hold
// (random nodes, services and pods, workloads backing several services or none, call rates
// with cycles, self-calls, zeros and unmanaged ends, latency pairs missing, unknown or huge),
// Merge's topology compiles.
func TestMergeAlwaysCompiles(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 42))
		st, meas, cfg := randomInput(rng)
		c, _ := newCluster(t, cfg)
		top := c.Merge(st, meas)
		m, err := optimizer.Compile(top, optimizer.Options{})
		if err != nil {
			t.Fatalf("seed %d: merged topology does not compile: %v", seed, err)
		}
		for _, s := range m.Services {
			if math.IsNaN(s.Load) || s.Load < 0 {
				t.Fatalf("seed %d: service %s: Λ = %v", seed, s.Name, s.Load)
			}
		}
		if again := c.Merge(st, meas); !cmp.Equal(top, again) {
			t.Fatalf("seed %d: Merge is not deterministic:\n%s", seed, cmp.Diff(top, again))
		}
	}
}

func randomInput(rng *rand.Rand) (*kube.State, *prom.Measurements, LiveConfig) {
	st := &kube.State{Workloads: map[kube.Workload][]string{}, Skipped: map[string]int{}}
	nodes := make([]string, 1+rng.IntN(6))
	for i := range nodes {
		nodes[i] = fmt.Sprintf("n%d", i)
		st.Nodes = append(st.Nodes, optimizer.Node{Name: nodes[i], CPU: rng.Int64N(8000), Memory: rng.Int64N(16384)})
	}
	namespaces := []string{"default", "shop"}
	// Workloads: a few per namespace; each service is backed by one or two of its namespace's.
	var workloads []kube.Workload
	for _, ns := range namespaces {
		for i := range 1 + rng.IntN(4) {
			workloads = append(workloads, kube.Workload{Name: fmt.Sprintf("w%d", i), Namespace: ns})
		}
	}
	ip := 0
	for i := range 1 + rng.IntN(8) {
		s := optimizer.Service{Name: fmt.Sprintf("s%d", i), Namespace: namespaces[rng.IntN(len(namespaces))],
			Ports: []optimizer.Port{{Name: "http", Port: 80, TargetPort: 8080}}}
		for j := range 1 + rng.IntN(4) {
			ip++
			p := optimizer.Pod{Name: fmt.Sprintf("%s-%d", s.Name, j), Node: nodes[rng.IntN(len(nodes))], IP: fmt.Sprintf("10.0.%d.%d", ip/250, ip%250+1)}
			if rng.IntN(3) == 0 {
				w := 0.25 + 4*rng.Float64()
				p.Weight = &w
			}
			s.Pods = append(s.Pods, p)
		}
		// Sometimes the service shares a pod with an earlier one of its namespace.
		for _, o := range st.Services {
			if o.Namespace == s.Namespace && rng.IntN(4) == 0 {
				s.Pods = append(s.Pods, o.Pods[0])
			}
		}
		st.Services = append(st.Services, s)
		for range 1 + rng.IntN(2) {
			w := workloads[rng.IntN(len(workloads))]
			if w.Namespace == s.Namespace && !slices.Contains(st.Workloads[w], s.Key()) {
				st.Workloads[w] = append(st.Workloads[w], s.Key())
			}
		}
	}
	slices.SortFunc(st.Services, func(a, b optimizer.Service) int { return strings.Compare(a.Key(), b.Key()) })
	for w := range st.Workloads {
		slices.Sort(st.Workloads[w])
	}

	var cfg LiveConfig
	if rng.IntN(3) == 0 {
		cfg.DefaultLatencyMS = ms(100 * rng.Float64())
	}
	if rng.IntN(10) == 0 {
		cfg.CallGraph = &CallGraph{}
		return st, nil, cfg
	}
	meas := &prom.Measurements{Latency: map[prom.Pair]float64{}}
	candidates := slices.Concat(nodes, []string{"gone"})
	for range rng.IntN(3 * len(candidates) * len(candidates)) {
		p := prom.Pair{From: candidates[rng.IntN(len(candidates))], To: candidates[rng.IntN(len(candidates))]}
		switch rng.IntN(10) {
		case 0:
			meas.Latency[p] = 0
		case 1:
			meas.Latency[p] = 2 * optimizer.MaxLatencyMS
		default:
			meas.Latency[p] = 300 * rng.Float64()
		}
	}
	ends := append(slices.Clone(workloads), kube.Workload{Name: "istio-ingressgateway", Namespace: "istio-system"}, kube.Workload{Name: "legacy", Namespace: "default"})
	for range rng.IntN(25) {
		from, to := ends[rng.IntN(len(ends))], ends[rng.IntN(len(ends))]
		rps := 1000 * rng.Float64()
		if rng.IntN(8) == 0 {
			rps = 0
		}
		meas.Calls = append(meas.Calls, prom.CallRate{From: prom.Workload(from), To: prom.Workload(to), RPS: rps})
	}
	if rng.IntN(4) == 0 { // a static call graph naming present and missing services, with cycles
		cfg.CallGraph = &CallGraph{}
		keys := []string{"gone", "s9.shop"}
		for _, s := range st.Services {
			keys = append(keys, s.Key())
		}
		seen := map[[2]string]bool{}
		for range rng.IntN(15) {
			e := [2]string{keys[rng.IntN(len(keys))], keys[rng.IntN(len(keys))]}
			if seen[e] {
				continue
			}
			seen[e] = true
			from := e[0]
			if !strings.Contains(from, ".") && rng.IntN(2) == 0 {
				from += ".default"
			}
			cfg.CallGraph.Calls = append(cfg.CallGraph.Calls, optimizer.Call{From: from, To: e[1], Rate: ms(3 * rng.Float64())})
		}
		for range rng.IntN(3) {
			cfg.CallGraph.Ingress = append(cfg.CallGraph.Ingress, optimizer.Ingress{Service: keys[rng.IntN(len(keys))], RPS: 100 * rng.Float64()})
		}
	} else {
		cfg.Prom = promStub
	}
	return st, meas, cfg
}

// promStub stands for a Prometheus source in tests of Merge, which does not use it.
var promStub = func() *prom.Source {
	ps, err := prom.NewSource(prom.Config{URL: "http://prometheus.invalid:9090"})
	if err != nil {
		panic(err)
	}
	return ps
}()

// --- Run, with a fake clientset and a fake Prometheus at the edges ---

func k8sNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}}}
}

func k8sService(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{kube.ManagedLabel: "true"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
}

// k8sPod is a pod of Deployment deploy on nodeName.
func k8sPod(deploy, name, nodeName string) *corev1.Pod {
	yes := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{"pod-template-hash": "7c9d"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: deploy + "-7c9d", UID: "rs", Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "app"}}},
	}
}

// endpoints are "POD@NODE@IP" or, not ready, "!POD@NODE@IP".
func k8sSlice(svc string, endpoints ...string) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}},
	}
	for _, e := range endpoints {
		ready := !strings.HasPrefix(e, "!")
		parts := strings.Split(strings.TrimPrefix(e, "!"), "@")
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{parts[2]},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready)},
			NodeName:   ptr(parts[1]),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: parts[0]},
		})
	}
	return sl
}

func ptr[T any](v T) *T { return &v }

// cluster objects: services a and b on nodes n1 and n2; b-2 not ready yet.
func clusterObjects() []runtime.Object {
	return []runtime.Object{
		k8sNode("n1"), k8sNode("n2"),
		k8sService("a"), k8sPod("a", "a-1", "n1"), k8sSlice("a", "a-1@n1@10.0.0.1"),
		k8sService("b"), k8sPod("b", "b-1", "n1"), k8sPod("b", "b-2", "n2"), k8sSlice("b", "b-1@n1@10.0.1.1", "!b-2@n2@10.0.1.2"),
	}
}

// syncedRecorder records topologies, and whether the Kubernetes caches had synced when each
// arrived.
type syncedRecorder struct {
	recorder
	kube     *kube.Source
	unsynced atomic.Int32
}

func (r *syncedRecorder) Update(t *optimizer.Topology) {
	if !r.kube.Synced() {
		r.unsynced.Add(1)
	}
	r.recorder.Update(t)
}

// runCluster runs c until the test ends; Run must then return nil.
func runCluster(t *testing.T, c *Live, l Listener) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10s of cancel")
		}
	})
}

func kubeSource(t *testing.T, client *fake.Clientset) *kube.Source {
	t.Helper()
	ks, err := kube.NewSource(kube.Config{Client: client, Selector: kube.DefaultSelector, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func podNames(top *optimizer.Topology, key string) []string {
	var out []string
	for _, s := range top.Services {
		if s.Key() == key {
			for _, p := range s.Pods {
				out = append(out, p.Name)
			}
		}
	}
	return out
}

func TestClusterRunFollowsKubernetes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := kubetest.NewClientset(clusterObjects()...)
	ks := kubeSource(t, client)
	c, reg := newCluster(t, LiveConfig{Kube: ks, DefaultLatencyMS: ms(5),
		CallGraph: &CallGraph{Calls: []optimizer.Call{{From: "a", To: "b"}}, Ingress: []optimizer.Ingress{{Service: "a", RPS: 10}}}})
	rec := &syncedRecorder{recorder: recorder{got: make(chan *optimizer.Topology, 16)}, kube: ks}
	runCluster(t, c, rec)

	first := rec.next(t)
	if n := rec.unsynced.Load(); n != 0 {
		t.Errorf("%d topologies delivered before the informer caches synced", n)
	}
	if diff := cmp.Diff([]string{"b-1"}, podNames(first, "b")); diff != "" {
		t.Errorf("first topology: b's pods (-want +got):\n%s", diff)
	}
	if len(first.Calls) != 1 || len(first.Ingress) != 1 || len(first.Latency) != 2 || first.Latency[0].MS != 5 {
		t.Errorf("first topology: calls %v, ingress %v, latency %v", first.Calls, first.Ingress, first.Latency)
	}
	if c.Current() != first {
		t.Error("Current() is not the topology delivered")
	}

	// b-2 becomes ready: a new topology.
	sl := k8sSlice("b", "b-1@n1@10.0.1.1", "b-2@n2@10.0.1.2")
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	second := rec.next(t)
	if diff := cmp.Diff([]string{"b-1", "b-2"}, podNames(second, "b")); diff != "" {
		t.Errorf("after b-2 became ready: b's pods (-want +got):\n%s", diff)
	}

	// A new Kubernetes state that merges into the same topology (a not-ready endpoint more
	// only changes what is skipped): no delivery. A node joining then is the next one.
	sl = k8sSlice("a", "a-1@n1@10.0.0.1", "!a-2@n2@10.0.0.2")
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the Kubernetes source to see a-2", func() bool { return ks.Current().Skipped[kube.SkipNotReady] == 1 })
	if _, err := client.CoreV1().Nodes().Create(ctx, k8sNode("n3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	third := rec.next(t)
	if len(third.Nodes) != 3 {
		t.Errorf("the delivery after an unchanged topology has nodes %v, want n3 among them (was the unchanged one delivered?)", third.Nodes)
	}
	rec.none(t)
	if n := metric(t, reg, "edgeflow_cluster_topologies_total"); n != 3 {
		t.Errorf("edgeflow_cluster_topologies_total = %v, want 3", n)
	}
}

// A topology that fails validation is counted and the last good one stays.
func TestClusterRunRejects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := kubetest.NewClientset(clusterObjects()...)
	ks := kubeSource(t, client)
	errTooBig := errors.New("more than two nodes")
	c, reg := newCluster(t, LiveConfig{Kube: ks, CallGraph: &CallGraph{}, Check: func(t *optimizer.Topology) error {
		if len(t.Nodes) > 2 {
			return errTooBig
		}
		return nil
	}})
	rec := recorder{got: make(chan *optimizer.Topology, 16)}
	runCluster(t, c, rec)
	first := rec.next(t)
	if _, err := client.CoreV1().Nodes().Create(ctx, k8sNode("n3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "a rejected topology", func() bool { return metric(t, reg, "edgeflow_cluster_rejected_topologies_total") == 1 })
	rec.none(t)
	if c.Current() != first {
		t.Error("the last good topology was replaced")
	}
}

func TestClusterRunStops(t *testing.T) {
	t.Parallel()
	t.Run("deadline", func(t *testing.T) {
		c, _ := newCluster(t, LiveConfig{Kube: kubeSource(t, kubetest.NewClientset(clusterObjects()...)), CallGraph: &CallGraph{}})
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel()
		if err := c.Run(ctx, recorder{got: make(chan *optimizer.Topology, 16)}); err != nil {
			t.Errorf("Run after its context's deadline: %v, want nil", err)
		}
	})
	t.Run("a source fails", func(t *testing.T) {
		fp := &fakeProm{}
		ps := fakePromSource(t, fp)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := ps.Run(ctx, func(*prom.Measurements) {}); err != nil { // its one Run
			t.Fatal(err)
		}
		c, _ := newCluster(t, LiveConfig{Kube: kubeSource(t, kubetest.NewClientset(clusterObjects()...)), Prom: ps})
		done := make(chan error, 1)
		go func() { done <- c.Run(context.Background(), recorder{got: make(chan *optimizer.Topology, 16)}) }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "Run called twice") {
				t.Errorf("Run with a failing source: %v, want the source's error", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after its source failed")
		}
	})
}

// fakeProm speaks the instant-query endpoint of the Prometheus HTTP API: the latency query
// (recognised by "probe_icmp") is answered with latency, a pod-load query ("by (namespace,
// pod") with podLoad's answer, any other with calls; each a list of (labels, value).
type fakeProm struct {
	mu      sync.Mutex
	latency []promSample
	calls   []promSample
	status  int    // non-zero: answer with this HTTP status
	fail    string // a query holding this is answered with HTTP 500
	// podLoad answers a pod-load query q evaluated at time at (the time parameter; zero
	// without one); nil: no series.
	podLoad func(q string, at time.Time) []promSample
	delay   time.Duration // each answer is this late
}

type promSample struct {
	labels map[string]string
	value  string
}

func latSample(from, to, seconds string) promSample {
	return promSample{labels: map[string]string{"source_node": from, "target_node": to}, value: seconds}
}

// callSample is a call rate; from and to are "namespace/name".
func callSample(from, to, rps string) promSample {
	fns, fname, _ := strings.Cut(from, "/")
	tns, tname, _ := strings.Cut(to, "/")
	return promSample{labels: map[string]string{
		prom.LabelSourceWorkload: fname, prom.LabelSourceWorkloadNamespace: fns,
		prom.LabelDestinationWorkload: tname, prom.LabelDestinationWorkloadNamespace: tns,
	}, value: rps}
}

func (f *fakeProm) set(fn func(f *fakeProm)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeProm) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/query" {
		http.NotFound(w, r)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	delay := f.delay
	f.mu.Unlock()
	select {
	case <-time.After(delay):
	case <-r.Context().Done():
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.status != 0 {
		http.Error(w, "fake Prometheus is down", f.status)
		return
	}
	if f.fail != "" && strings.Contains(r.Form.Get("query"), f.fail) {
		http.Error(w, "this query fails", http.StatusInternalServerError)
		return
	}
	src := f.calls
	switch q := r.Form.Get("query"); {
	case strings.Contains(q, "probe_icmp"):
		src = f.latency
	case strings.Contains(q, "by (namespace, pod"):
		src = nil
		if f.podLoad != nil {
			var at time.Time
			if ts := r.Form.Get("time"); ts != "" {
				sec, err := strconv.ParseFloat(ts, 64)
				if err != nil {
					http.Error(w, "bad time: "+err.Error(), http.StatusBadRequest)
					return
				}
				at = time.Unix(0, int64(math.Round(sec*1e9))).UTC()
			}
			src = f.podLoad(q, at)
		}
	}
	result := []any{}
	for _, s := range src {
		result = append(result, map[string]any{"metric": s.labels, "value": []any{1.7e9, s.value}})
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"resultType": "vector", "result": result}}); err != nil {
		panic(err)
	}
}

// fakePromSource is a Prometheus source polling fp every 20 ms.
func fakePromSource(t *testing.T, fp *fakeProm, opts ...func(*prom.Config)) *prom.Source {
	t.Helper()
	srv := httptest.NewServer(fp)
	t.Cleanup(srv.Close)
	cfg := prom.Config{URL: srv.URL, RoundTripper: srv.Client().Transport, Interval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		SuccessQuery: prom.DisableSuccess, ProbePins: prom.PinOff} // the fake has no targets API
	for _, o := range opts {
		o(&cfg)
	}
	ps, err := prom.NewSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// Cold start: with Prometheus down, the capacity-weighted plan (every pair equal, never 0 ms)
// is served at once, flagged degraded; the first measurements replace it. Latency labels that
// name no node are reported and never used.
func TestClusterColdStartAndUnmatchedNames(t *testing.T) {
	t.Parallel()
	fp := &fakeProm{status: http.StatusServiceUnavailable}
	logs := &testkit.LogBuffer{}
	ps := fakePromSource(t, fp)
	c, reg := newCluster(t, LiveConfig{Kube: kubeSource(t, kubetest.NewClientset(clusterObjects()...)), Prom: ps,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	rec := recorder{got: make(chan *optimizer.Topology, 16)}
	runCluster(t, c, rec)
	top := rec.next(t)
	equal := []optimizer.Latency{{From: "n1", To: "n1", MS: 1}, {From: "n1", To: "n2", MS: 1}, {From: "n2", To: "n1", MS: 1}, {From: "n2", To: "n2", MS: 1}}
	if diff := cmp.Diff(equal, top.Latency); diff != "" {
		t.Errorf("cold-start latency (-want +got):\n%s", diff)
	}
	if len(top.Services) != 2 {
		t.Errorf("cold start: services %+v, want a and b", top.Services)
	}
	lat := checkNamed(c, "latency")
	if lat.OK || !strings.Contains(lat.Message, "capacity-weighted plan") {
		t.Errorf("latency check on a cold start: %+v", lat)
	}
	if v := metric(t, reg, "edgeflow_watcher_degraded_plan"); v != 1 {
		t.Errorf("edgeflow_watcher_degraded_plan = %v, want 1", v)
	}

	// Prometheus answers with labels that name no node: still the equal plan, and the names
	// are reported.
	fp.set(func(f *fakeProm) {
		f.status = 0
		f.latency = []promSample{latSample("edge-x", "edge-y", "0.002"), latSample("n1", "edge-y", "0.003")}
	})
	testkit.Eventually(t, 10*time.Second, "the unmatched names reported", func() bool {
		return strings.Contains(checkNamed(c, "latency").Message, "edge-x, edge-y")
	})
	if cur := c.Current(); cur == nil || !cmp.Equal(equal, cur.Latency) {
		t.Errorf("a topology built from latencies that matched nothing: %+v", cur.Latency)
	}
	if v := metric(t, reg, "edgeflow_watcher_unmatched_total", "kind", "node"); v != 2 {
		t.Errorf("edgeflow_watcher_unmatched_total{kind=node} = %v, want 2", v)
	}

	// Measurements that match: they replace the equal plan; the unmatched name stays reported.
	fp.set(func(f *fakeProm) { f.latency = append(f.latency, latSample("n1", "n2", "0.004")) })
	top = rec.next(t)
	for top.Latency[0].MS == 1 && len(top.Latency) == 4 {
		top = rec.next(t)
	}
	want := []optimizer.Latency{{From: "n1", To: "n2", MS: 4}, {From: "n2", To: "n1", MS: 4}}
	if diff := cmp.Diff(want, top.Latency, approx); diff != "" {
		t.Errorf("latency once measured (-want +got):\n%s", diff)
	}
	testkit.Eventually(t, 10*time.Second, "the degraded plan flag cleared", func() bool { return metric(t, reg, "edgeflow_watcher_degraded_plan") == 0 })
	if lat := checkNamed(c, "latency"); lat.OK || strings.Contains(lat.Message, "capacity-weighted") || !strings.Contains(lat.Message, "edge-x, edge-y") {
		t.Errorf("latency check with one matched pair and unmatched names: %+v", lat)
	}
	if n := strings.Count(logs.String(), "latency labels name no node"); n != 1 {
		t.Errorf("%d log lines about unmatched names, want 1 (one per change):\n%s", n, logs)
	}
}

// The first topology waits for Prometheus's first round (FirstRoundWait): a Prometheus that
// answers late still makes the first topology a measured one, so that serve never pushes the
// capacity-weighted plan for the moment before the first answer (and, when the measured plan
// then moves too little to pass the damping, keeps it); one that hangs delays the first
// topology by FirstRoundWait only, which then comes without measurements.
func TestClusterFirstTopologyWaitsForPrometheus(t *testing.T) {
	t.Parallel()
	t.Run("late answer", func(t *testing.T) {
		t.Parallel()
		fp := &fakeProm{latency: []promSample{latSample("n1", "n2", "0.004")}, delay: 300 * time.Millisecond}
		c, _ := newCluster(t, LiveConfig{Kube: kubeSource(t, kubetest.NewClientset(clusterObjects()...)), Prom: fakePromSource(t, fp)})
		rec := recorder{got: make(chan *optimizer.Topology, 16)}
		runCluster(t, c, rec)
		want := []optimizer.Latency{{From: "n1", To: "n2", MS: 4}, {From: "n2", To: "n1", MS: 4}}
		if diff := cmp.Diff(want, rec.next(t).Latency, approx); diff != "" {
			t.Errorf("the first topology's latency (-want +got):\n%s", diff)
		}
	})
	t.Run("hanging", func(t *testing.T) {
		t.Parallel()
		fp := &fakeProm{latency: []promSample{latSample("n1", "n2", "0.004")}, delay: time.Minute}
		logs := &testkit.LogBuffer{}
		const wait = 200 * time.Millisecond
		c, _ := newCluster(t, LiveConfig{Kube: kubeSource(t, kubetest.NewClientset(clusterObjects()...)), Prom: fakePromSource(t, fp),
			FirstRoundWait: wait, Logger: slog.New(slog.NewTextHandler(logs, nil))})
		rec := recorder{got: make(chan *optimizer.Topology, 16)}
		start := time.Now()
		runCluster(t, c, rec)
		top := rec.next(t)
		if took := time.Since(start); took < wait {
			t.Errorf("the first topology came %v after Run started, before FirstRoundWait (%v)", took, wait)
		}
		equal := []optimizer.Latency{{From: "n1", To: "n1", MS: 1}, {From: "n1", To: "n2", MS: 1}, {From: "n2", To: "n1", MS: 1}, {From: "n2", To: "n2", MS: 1}}
		if diff := cmp.Diff(equal, top.Latency); diff != "" {
			t.Errorf("the first topology without an answer (-want +got):\n%s", diff)
		}
		if !strings.Contains(logs.String(), "no answer from Prometheus yet") {
			t.Errorf("no log line says the topology went out without Prometheus:\n%s", logs)
		}
	})
}

// --node-match=internal-ip: a probe's instance address identifies the node.
func TestClusterNodeMatchInternalIP(t *testing.T) {
	t.Parallel()
	fp := &fakeProm{latency: []promSample{latSample("10.9.0.1", "10.9.0.2:0", "0.006"), latSample("10.9.0.1", "10.9.9.9", "0.001")}}
	objs := clusterObjects()
	for i, ip := range []string{"10.9.0.1", "10.9.0.2"} {
		objs[i].(*corev1.Node).Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: "h"}}
	}
	c, _ := newCluster(t, LiveConfig{Kube: kubeSource(t, kubetest.NewClientset(objs...)), Prom: fakePromSource(t, fp), NodeMatch: NodeMatchInternalIP})
	rec := recorder{got: make(chan *optimizer.Topology, 16)}
	runCluster(t, c, rec)
	top := rec.next(t)
	for len(top.Latency) != 2 {
		top = rec.next(t)
	}
	want := []optimizer.Latency{{From: "n1", To: "n2", MS: 6}, {From: "n2", To: "n1", MS: 6}}
	if diff := cmp.Diff(want, top.Latency, approx); diff != "" {
		t.Errorf("latency (-want +got):\n%s", diff)
	}
	if lat := checkNamed(c, "latency"); lat.OK || !strings.Contains(lat.Message, "10.9.9.9") {
		t.Errorf("latency check: %+v", lat)
	}
	if _, err := NewLive(LiveConfig{Kube: kubeSource(t, kubetest.NewClientset()), CallGraph: &CallGraph{}, NodeMatch: "hostname"}); err == nil {
		t.Error("NodeMatch hostname accepted")
	}
}

func checkNamed(c *Live, name string) Check {
	for _, ck := range c.Checks() {
		if ck.Name == name {
			return ck
		}
	}
	return Check{Name: name, Message: "absent"}
}

// Prometheus down at startup: the degraded plan, without calls; once it answers, the
// measured call graph is mapped through the pods' workloads.
func TestClusterRunMeasured(t *testing.T) {
	t.Parallel()
	fp := &fakeProm{status: http.StatusServiceUnavailable}
	reg := prometheus.NewRegistry()
	ps := fakePromSource(t, fp, func(c *prom.Config) { c.Registerer = reg })
	client := kubetest.NewClientset(clusterObjects()...)
	ks := kubeSource(t, client)
	c, _ := newCluster(t, LiveConfig{Kube: ks, Prom: ps})
	rec := recorder{got: make(chan *optimizer.Topology, 16)}
	runCluster(t, c, rec)
	if first := rec.next(t); len(first.Calls) != 0 {
		t.Errorf("calls without Prometheus: %+v", first.Calls)
	}
	testkit.Eventually(t, 10*time.Second, "failed Prometheus rounds after the caches synced", func() bool {
		return ks.Synced() && metric(t, reg, "edgeflow_prometheus_queries_total", "query", "latency", "result", "error") >= 3
	})
	if checks := c.Checks(); len(checks) != 3 || !checks[0].OK || checks[1].OK || checks[2].OK {
		t.Errorf("Checks with Prometheus down: %+v", checks)
	}

	fp.set(func(f *fakeProm) {
		f.status = 0
		f.latency = []promSample{latSample("n1", "n2", "0.002")}
		f.calls = []promSample{
			callSample("istio-system/istio-ingressgateway", "default/a", "10"),
			callSample("default/a", "default/b", "20"),
			callSample("default/a", "default/unmanaged", "3"),
		}
	})
	top := rec.next(t)
	for len(top.Calls) == 0 {
		top = rec.next(t)
	}
	if diff := cmp.Diff([]optimizer.Call{{From: "a", To: "b", Rate: ms(2)}}, top.Calls, approx); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{"a": 10, "b": 20}, loads(t, top), approx); diff != "" {
		t.Errorf("Λ after Compile (-want +got):\n%s", diff)
	}
	// The round that delivered the calls may have sent its latency query before the
	// fake came up (the queries of one round run one after another), so that round's
	// check still says down; the next round's must say up.
	testkit.Eventually(t, 10*time.Second, "the prometheus check OK after Prometheus came up", func() bool {
		return checkNamed(c, "prometheus").OK
	})
}

// zoneState is a Kubernetes state of nodes "NAME@REGION/ZONE" (or bare "NAME": no zone).
func zoneState(nodes []string, services ...optimizer.Service) *kube.State {
	st := state(nil, services...)
	for _, n := range nodes {
		name, loc, _ := strings.Cut(n, "@")
		st.Nodes = append(st.Nodes, optimizer.Node{Name: name, CPU: 4000, Memory: 8192, Locality: loc})
	}
	return st
}

func TestMergeLatencyPerZone(t *testing.T) {
	t.Parallel()
	st := zoneState([]string{"a1@r/a", "a2@r/a/s1", "b1@r/b", "b2@r/b", "lone"}, service("api", "api-1@a1", "api-2@b2"))
	meas := &prom.Measurements{Latency: map[prom.Pair]float64{
		// The representatives a1, b1 and lone probe each other; a2 probes b2 too.
		{From: "a1", To: "b1"}: 4, {From: "a2", To: "b2"}: 6, {From: "b1", To: "a1"}: 5,
		{From: "a1", To: "a2"}:    0.4, // inside r/a
		{From: "lone", To: "a1"}:  9,
		{From: "ghost", To: "a1"}: 1, // no such node: not used, named as today
	}}
	c, reg := newCluster(t, LiveConfig{Prom: fakePromSource(t, &fakeProm{}), CallGraph: &CallGraph{}, LatencyGranularity: optimizer.LatencyPerZone})
	top := c.Merge(st, meas)
	if top.LatencyGranularity != optimizer.LatencyPerZone {
		t.Fatalf("granularity %q, want zone", top.LatencyGranularity)
	}
	got := map[prom.Pair]float64{}
	for _, l := range top.Latency {
		got[prom.Pair{From: l.From, To: l.To}] = l.MS
	}
	want := map[prom.Pair]float64{
		{From: "r/a", To: "r/a"}: 0.4,
		{From: "r/a", To: "r/b"}: 5, {From: "r/b", To: "r/a"}: 5, // median of 4 and 6; 5
		{From: "lone", To: "r/a"}: 9, {From: "r/a", To: "lone"}: 9,
		{From: "lone", To: "r/b"}: 9, {From: "r/b", To: "lone"}: 9, // never measured: the largest
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("zone latency (-want +got):\n%s", diff)
	}
	if g := metric(t, reg, "edgeflow_latency_unmeasured_pairs"); g != 1 {
		t.Errorf("edgeflow_latency_unmeasured_pairs = %v, want 1 (lone ↔ r/b)", g)
	}
	if g := metric(t, reg, "edgeflow_watcher_unmatched_total", "kind", "node"); g != 1 {
		t.Errorf("edgeflow_watcher_unmatched_total = %v, want 1 (ghost)", g)
	}
	lat := checkNamed(c, "latency")
	if !strings.Contains(lat.Message, "ghost") || !strings.Contains(lat.Message, "latency per zone (--latency-granularity=zone): 5 nodes, 3 zones") {
		t.Errorf("latency check: %+v", lat)
	}
	m, err := optimizer.Compile(top, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !m.Latency.Zoned() {
		t.Error("the compiled model is not zone-backed")
	}
	a2, _ := m.NodeIndex("a2")
	b2, _ := m.NodeIndex("b2")
	if got := m.Latency.At(a2, b2); got != 5 {
		t.Errorf("a2 → b2 = %v, want its zones' 5", got)
	}

	// Nothing usable: every zone pair, each zone to itself included, equal.
	top = c.Merge(st, &prom.Measurements{})
	for _, l := range top.Latency {
		if l.MS != prom.EqualLatencyMS {
			t.Errorf("cold start: %s → %s = %v, want %v", l.From, l.To, l.MS, prom.EqualLatencyMS)
		}
	}
	if len(top.Latency) != 9 {
		t.Errorf("cold start: %d entries, want 9 (3 zones)", len(top.Latency))
	}
}

func TestLatencyGranularityAuto(t *testing.T) {
	t.Parallel()
	nodes := []string{"a1@r/a", "a2@r/a", "b1@r/b", "b2@r/b"} // 12 ordered pairs
	st := zoneState(nodes, service("api", "api-1@a1"))
	var logs testkit.LogBuffer
	c, _ := newCluster(t, LiveConfig{Prom: fakePromSource(t, &fakeProm{}), CallGraph: &CallGraph{}, MaxNodePairs: 12,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if top := c.Merge(st, &prom.Measurements{}); top.LatencyGranularity != "" || len(top.Latency) != 16 {
		t.Errorf("12 pairs ≤ 12: granularity %q with %d entries, want per node (16)", top.LatencyGranularity, len(top.Latency))
	}
	if lat := checkNamed(c, "latency"); !strings.Contains(lat.Message, "latency per node: 4 nodes, 12 node pairs ≤ --max-node-pairs 12") {
		t.Errorf("latency check: %+v", lat)
	}
	st = zoneState(append(nodes, "c1@r/c"), service("api", "api-1@a1"))
	top := c.Merge(st, &prom.Measurements{})
	if top.LatencyGranularity != optimizer.LatencyPerZone || len(top.Latency) != 9 {
		t.Errorf("20 pairs > 12: granularity %q with %d entries, want per zone (9)", top.LatencyGranularity, len(top.Latency))
	}
	why := "latency per zone: 5 nodes, 20 node pairs > --max-node-pairs 12; 3 zones"
	if lat := checkNamed(c, "latency"); !strings.Contains(lat.Message, why) {
		t.Errorf("latency check: %+v", lat)
	}
	c.Merge(st, &prom.Measurements{})
	if n := strings.Count(logs.String(), "latency per zone"); n != 1 {
		t.Errorf("the switch is logged %d times, want once:\n%s", n, logs.String())
	}
	for _, cfg := range []LiveConfig{{LatencyGranularity: "rack"}, {MaxNodePairs: -1}} {
		cfg.Kube, cfg.CallGraph = kubeSource(t, kubetest.NewClientset()), &CallGraph{}
		if _, err := NewLive(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
	if got := thousands(24995000); got != "24,995,000" {
		t.Errorf("thousands = %q", got)
	}
}

// A contested node pair (two series claiming it) keeps its last trusted latency in the topology
// and shows the latency check degraded, naming it; /readyz stays ready (ReadyHandler: 200).
func TestClusterContestedPairShownDegraded(t *testing.T) {
	t.Parallel()
	fp := &fakeProm{latency: []promSample{latSample("n1", "n2", "0.004")}}
	c, _ := newCluster(t, LiveConfig{Kube: kubeSource(t, kubetest.NewClientset(clusterObjects()...)), Prom: fakePromSource(t, fp)})
	rec := recorder{got: make(chan *optimizer.Topology, 16)}
	runCluster(t, c, rec)
	testkit.Eventually(t, 10*time.Second, "n1→n2 measured", func() bool {
		cur := c.Current()
		return cur != nil && len(cur.Latency) == 2 && cur.Latency[0].MS == 4
	})
	forged := latSample("n1", "n2", "0.500")
	forged.labels["pod"] = "forger"
	fp.set(func(f *fakeProm) { f.latency = append(f.latency, forged) })
	testkit.Eventually(t, 10*time.Second, "the contested pair in the latency check", func() bool {
		return strings.Contains(checkNamed(c, "latency").Message, "contested")
	})
	if lat := checkNamed(c, "latency"); lat.OK || !strings.Contains(lat.Message, "n1→n2") {
		t.Errorf("latency check with a contested pair: %+v; want degraded, naming n1→n2", lat)
	}
	if cur := c.Current(); cur.Latency[0].MS != 4 {
		t.Errorf("contested n1→n2 at %v ms in the topology, want its last trusted 4", cur.Latency[0].MS)
	}
	rr := httptest.NewRecorder()
	ReadyHandler(func() uint64 { return 1 }, c.Checks).ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rr.Code != http.StatusOK || !strings.Contains(rr.Body.String(), "[-]latency") {
		t.Errorf("/readyz with a contested pair: %d %s; want 200, the latency check degraded", rr.Code, rr.Body)
	}
}

// TestUnmatchedNamesBounded: /readyz (served on every address of the metrics listener) and the
// log list at most maxListed of the latency labels that name no node, then how many more —
// a pod that pushes series with 100,000 made-up node names gets neither a 100,000-name
// /readyz answer nor such a log line.
func TestUnmatchedNamesBounded(t *testing.T) {
	t.Parallel()
	fp := &fakeProm{}
	logs := &testkit.LogBuffer{}
	c, _ := newCluster(t, LiveConfig{Kube: kubeSource(t, kubetest.NewClientset(clusterObjects()...)), Prom: fakePromSource(t, fp),
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	var forged []promSample
	for i := range 500 {
		forged = append(forged, latSample(fmt.Sprintf("ghost-%03d", i), "n1", "0.002"))
	}
	fp.set(func(f *fakeProm) { f.latency = forged })
	rec := recorder{got: make(chan *optimizer.Topology, 16)}
	runCluster(t, c, rec)
	// The check's state is set before the log line is written (Live.record): wait for both.
	testkit.Eventually(t, 10*time.Second, "the unmatched names reported and logged", func() bool {
		return strings.Contains(checkNamed(c, "latency").Message, "ghost-000") && strings.Contains(logs.String(), "latency labels name no node")
	})
	msg := checkNamed(c, "latency").Message
	if !strings.Contains(msg, "ghost-009 and 490 more") || strings.Contains(msg, "ghost-010") {
		t.Errorf("latency check lists more than %d unmatched names, or not how many more: %d bytes: %.300s", maxListed, len(msg), msg)
	}
	if l := logs.String(); strings.Contains(l, "ghost-010") || !strings.Contains(l, "count=500") {
		t.Errorf("the log lists more than %d unmatched names, or not their count: %.300s", maxListed, l)
	}
}
