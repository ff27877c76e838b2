package kube

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/edgeflow/edgeflow/internal/kubetest"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
)

// Every informer goroutine a test starts ends when its Source's Run returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// --- objects ---

func node(name, cpu, mem string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}}
}

// managed is a Service in ns carrying the managed label.
func managed(ns, name string, ports ...corev1.ServicePort) *corev1.Service {
	s := unlabelled(ns, name, ports...)
	s.Labels = map[string]string{ManagedLabel: "true"}
	return s
}

func unlabelled(ns, name string, ports ...corev1.ServicePort) *corev1.Service {
	if len(ports) == 0 {
		ports = []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}
	}
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Ports: ports}}
}

// pod is a pod on nodeName requesting cpu and mem per container ("" requests nothing), owned
// by owner when given.
func pod(ns, name, nodeName string, requests []string, owner ...metav1.OwnerReference) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, OwnerReferences: owner},
		Spec: corev1.PodSpec{NodeName: nodeName}}
	for i, r := range requests {
		c := corev1.Container{Name: fmt.Sprintf("c%d", i)}
		if r != "" {
			cpu, mem, _ := strings.Cut(r, "/")
			c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
			if mem != "" {
				c.Resources.Requests[corev1.ResourceMemory] = resource.MustParse(mem)
			}
		}
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
	if len(p.Spec.Containers) == 0 {
		p.Spec.Containers = []corev1.Container{{Name: "c0"}}
	}
	return p
}

// deployed is a pod of Deployment deploy: owned by its ReplicaSet, labelled with the hash.
func deployed(ns, deploy, name, nodeName string, requests ...string) *corev1.Pod {
	p := pod(ns, name, nodeName, requests, controller("ReplicaSet", deploy+"-5f6d8b"))
	p.Labels = map[string]string{"pod-template-hash": "5f6d8b"}
	return p
}

func controller(kind, name string) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{APIVersion: "apps/v1", Kind: kind, Name: name, UID: types.UID("uid-" + name), Controller: &yes}
}

// endpoint is a ready endpoint at ip for podName ("": no targetRef) on nodeName ("": none).
func endpoint(ip, podName, nodeName string) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}
	if podName != "" {
		ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: podName}
	}
	if nodeName != "" {
		ep.NodeName = ptr(nodeName)
	}
	return ep
}

func notReady(ep discoveryv1.Endpoint) discoveryv1.Endpoint {
	ep.Conditions.Ready = ptr(false)
	return ep
}

func ptr[T any](v T) *T { return &v }

// slice is an IPv4 EndpointSlice of service svc with one port per "name:port" in ports
// (default "http:8080").
func slice(ns, svc, name string, ports []string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	if ports == nil {
		ports = []string{"http:8080"}
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
	}
	for _, p := range ports {
		n, port, _ := strings.Cut(p, ":")
		var v int32
		fmt.Sscan(port, &v)
		sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: ptr(n), Port: ptr(v)})
	}
	return sl
}

// --- harness ---

// harness runs a Source on a fake clientset and records what it delivers.
type harness struct {
	t      *testing.T
	client *fake.Clientset
	src    *Source
	reg    *prometheus.Registry

	mu     sync.Mutex
	states []*State
	gate   chan struct{} // when non-nil, deliver waits for it to close
}

func start(t *testing.T, cfg Config, objs ...runtime.Object) *harness {
	t.Helper()
	return startWith(t, cfg, nil, objs...)
}

// startWith is start with a hook on the fake clientset (reactors) before the Source runs.
func startWith(t *testing.T, cfg Config, hook func(*fake.Clientset), objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{t: t, client: kubetest.NewClientset(objs...), reg: prometheus.NewRegistry()}
	if hook != nil {
		hook(h.client)
	}
	cfg.Client = h.client
	cfg.Registerer = h.reg
	cfg.Logger = slog.New(slog.DiscardHandler)
	src, err := NewSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.src = src
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- src.Run(ctx, func(st *State) {
			h.mu.Lock()
			h.states = append(h.states, st)
			gate := h.gate
			h.mu.Unlock()
			if gate != nil {
				<-gate
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		h.release()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10s of cancel")
		}
	})
	return h
}

// hold makes the next deliveries block until release.
func (h *harness) hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gate = make(chan struct{})
}

func (h *harness) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gate != nil {
		close(h.gate)
		h.gate = nil
	}
}

func (h *harness) delivered() []*State {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*State(nil), h.states...)
}

// first waits for the first State.
func (h *harness) first() *State {
	h.t.Helper()
	testkit.Eventually(h.t, 10*time.Second, "the first State", func() bool { return len(h.delivered()) > 0 })
	return h.delivered()[0]
}

// nth waits for the n-th State (1-based).
func (h *harness) nth(n int) *State {
	h.t.Helper()
	testkit.Eventually(h.t, 10*time.Second, fmt.Sprintf("State #%d", n), func() bool { return len(h.delivered()) >= n })
	return h.delivered()[n-1]
}

func (h *harness) rebuilds() float64 { return testutil.ToFloat64(h.src.rebuilds) }
func (h *harness) events() float64   { return testutil.ToFloat64(h.src.events) }

var nodes = []runtime.Object{node("n1", "4", "8Gi"), node("n2", "2", "4Gi")}

var wantNodes = []optimizer.Node{{Name: "n1", CPU: 4000, Memory: 8192}, {Name: "n2", CPU: 2000, Memory: 4096}}

var httpPort = []optimizer.Port{{Name: "http", Port: 80, TargetPort: 8080}}

func weight(w float64) *float64 { return &w }

func TestStateFromCluster(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		objs []runtime.Object
		want *State
	}{{
		name: "endpoints: ready kept, the rest left out and counted",
		cfg:  Config{Selector: DefaultSelector},
		objs: []runtime.Object{
			managed("default", "a"),
			deployed("default", "a", "a-1", "n1"),
			deployed("default", "a", "a-2", "n2"),
			deployed("default", "a", "a-3", "n1"),
			pod("default", "a-4", "n2", nil), // bare pod, node from its spec
			slice("default", "a", "a-x1", nil,
				endpoint("10.0.0.1", "a-1", "n1"),
				endpoint("10.0.0.2", "a-2", "n2"),
				notReady(endpoint("10.0.0.3", "a-3", "n1")),
				endpoint("10.0.0.4", "a-4", ""),
				endpoint("10.0.0.9", "", "n1"),                                                     // no pod: named by its IP
				endpoint("10.0.0.10", "", ""),                                                      // no node at all
				endpoint("10.0.0.11", "", "ghost"),                                                 // unknown node
				discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}, // no address
			),
		},
		want: &State{
			Nodes: wantNodes,
			Services: []optimizer.Service{{Name: "a", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{
				{Name: "a-1", Node: "n1", IP: "10.0.0.1"},
				{Name: "a-2", Node: "n2", IP: "10.0.0.2"},
				{Name: "a-4", Node: "n2", IP: "10.0.0.4"},
				{Name: "ip-10-0-0-9", Node: "n1", IP: "10.0.0.9"},
			}}},
			Workloads: map[Workload][]string{{"a", "default"}: {"a"}, {"a-4", "default"}: {"a"}},
			Skipped:   map[string]int{SkipNotReady: 1, SkipNoNode: 1, SkipUnknownNode: 1, SkipNoAddress: 1},
		},
	}, {
		name: "readiness unknown (nil) counts as ready",
		objs: []runtime.Object{
			managed("default", "a"),
			slice("default", "a", "a-x1", nil, discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, NodeName: ptr("n1")}),
		},
		want: &State{
			Nodes:     wantNodes,
			Services:  []optimizer.Service{{Name: "a", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "ip-10-0-0-1", Node: "n1", IP: "10.0.0.1"}}}},
			Workloads: map[Workload][]string{},
		},
	}, {
		name: "managed services without a ready endpoint left out",
		cfg:  Config{Selector: DefaultSelector},
		objs: []runtime.Object{
			managed("default", "b"),
			slice("default", "b", "b-x1", nil, notReady(endpoint("10.0.0.5", "", "n1"))),
			managed("default", "c"), // no EndpointSlice at all
			managed("default", "d"),
			slice("default", "d", "d-x1", nil, endpoint("10.0.0.6", "", "n2")),
		},
		want: &State{
			Nodes:     wantNodes,
			Services:  []optimizer.Service{{Name: "d", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "ip-10-0-0-6", Node: "n2", IP: "10.0.0.6"}}}},
			Workloads: map[Workload][]string{},
			Skipped:   map[string]int{SkipNotReady: 1, SkipNoReadyPods: 2},
		},
	}, {
		name: "selector: a Service without the label and an ExternalName are ignored",
		cfg:  Config{Selector: DefaultSelector},
		objs: []runtime.Object{
			unlabelled("default", "plain"),
			slice("default", "plain", "plain-x1", nil, endpoint("10.0.0.7", "", "n1")),
			func() *corev1.Service {
				s := managed("default", "ext")
				s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
				return s
			}(),
			managed("default", "d"),
			slice("default", "d", "d-x1", nil, endpoint("10.0.0.6", "", "n2")),
		},
		want: &State{
			Nodes:     wantNodes,
			Services:  []optimizer.Service{{Name: "d", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "ip-10-0-0-6", Node: "n2", IP: "10.0.0.6"}}}},
			Workloads: map[Workload][]string{},
		},
	}, {
		name: "empty selector: every Service",
		objs: []runtime.Object{
			unlabelled("default", "plain"),
			slice("default", "plain", "plain-x1", nil, endpoint("10.0.0.7", "", "n1")),
		},
		want: &State{
			Nodes:     wantNodes,
			Services:  []optimizer.Service{{Name: "plain", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "ip-10-0-0-7", Node: "n1", IP: "10.0.0.7"}}}},
			Workloads: map[Workload][]string{},
		},
	}, {
		name: "namespaces filter",
		cfg:  Config{Selector: DefaultSelector, Namespaces: []string{"ns1"}},
		objs: []runtime.Object{
			managed("ns1", "a"), slice("ns1", "a", "a-x1", nil, endpoint("10.0.1.1", "", "n1")),
			managed("ns2", "a"), slice("ns2", "a", "a-x1", nil, endpoint("10.0.2.1", "", "n1")),
			managed("default", "a"), slice("default", "a", "a-x1", nil, endpoint("10.0.0.1", "", "n1")),
		},
		want: &State{
			Nodes:     wantNodes,
			Services:  []optimizer.Service{{Name: "a", Namespace: "ns1", Ports: httpPort, Pods: []optimizer.Pod{{Name: "ip-10-0-1-1", Node: "n1", IP: "10.0.1.1"}}}},
			Workloads: map[Workload][]string{},
		},
	}, {
		name: "several namespaces, one of them given twice",
		cfg:  Config{Selector: DefaultSelector, Namespaces: []string{"ns2", "ns1", "ns2"}},
		objs: []runtime.Object{
			managed("ns1", "a"), slice("ns1", "a", "a-x1", nil, endpoint("10.0.1.1", "", "n1")),
			managed("ns2", "a"), slice("ns2", "a", "a-x1", nil, endpoint("10.0.2.1", "", "n1")),
			managed("default", "a"), slice("default", "a", "a-x1", nil, endpoint("10.0.0.1", "", "n1")),
		},
		want: &State{
			Nodes: wantNodes,
			Services: []optimizer.Service{
				{Name: "a", Namespace: "ns1", Ports: httpPort, Pods: []optimizer.Pod{{Name: "ip-10-0-1-1", Node: "n1", IP: "10.0.1.1"}}},
				{Name: "a", Namespace: "ns2", Ports: httpPort, Pods: []optimizer.Pod{{Name: "ip-10-0-2-1", Node: "n1", IP: "10.0.2.1"}}},
			},
			Workloads: map[Workload][]string{},
		},
	}, {
		name: "the empty namespace means all",
		cfg:  Config{Selector: DefaultSelector, Namespaces: []string{""}},
		objs: []runtime.Object{
			managed("ns1", "a"), slice("ns1", "a", "a-x1", nil, endpoint("10.0.1.1", "", "n1")),
			managed("default", "a"), slice("default", "a", "a-x1", nil, endpoint("10.0.0.1", "", "n1")),
		},
		want: &State{
			Nodes: wantNodes,
			Services: []optimizer.Service{
				{Name: "a", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "ip-10-0-0-1", Node: "n1", IP: "10.0.0.1"}}},
				{Name: "a", Namespace: "ns1", Ports: httpPort, Pods: []optimizer.Pod{{Name: "ip-10-0-1-1", Node: "n1", IP: "10.0.1.1"}}},
			},
			Workloads: map[Workload][]string{},
		},
	}, {
		name: "weights: CPU request relative to the mean; service CPU and memory are the largest request; each pod's CPU request",
		objs: []runtime.Object{
			managed("default", "a"),
			deployed("default", "a", "a-1", "n1", "100m/64Mi"),
			deployed("default", "a", "a-2", "n1", "200m/256Mi", "100m/64Mi"), // 300m, 320Mi over two containers
			deployed("default", "a", "a-3", "n2"),                            // no request: weight 1
			slice("default", "a", "a-x1", nil, endpoint("10.0.0.1", "a-1", "n1"), endpoint("10.0.0.2", "a-2", "n1"), endpoint("10.0.0.3", "a-3", "n2")),
			managed("default", "equal"),
			deployed("default", "equal", "equal-1", "n1", "250m"),
			deployed("default", "equal", "equal-2", "n2", "250m"),
			slice("default", "equal", "equal-x1", nil, endpoint("10.0.1.1", "equal-1", "n1"), endpoint("10.0.1.2", "equal-2", "n2")),
			managed("default", "none"),
			deployed("default", "none", "none-1", "n1"),
			deployed("default", "none", "none-2", "n2"),
			slice("default", "none", "none-x1", nil, endpoint("10.0.2.1", "none-1", "n1"), endpoint("10.0.2.2", "none-2", "n2")),
		},
		want: &State{
			Nodes: wantNodes,
			Services: []optimizer.Service{
				{Name: "a", Namespace: "default", Ports: httpPort, CPU: 300, Memory: 320, Pods: []optimizer.Pod{
					{Name: "a-1", Node: "n1", IP: "10.0.0.1", Weight: weight(0.5)},
					{Name: "a-2", Node: "n1", IP: "10.0.0.2", Weight: weight(1.5)},
					{Name: "a-3", Node: "n2", IP: "10.0.0.3"},
				}},
				{Name: "equal", Namespace: "default", Ports: httpPort, CPU: 250, Pods: []optimizer.Pod{
					{Name: "equal-1", Node: "n1", IP: "10.0.1.1"},
					{Name: "equal-2", Node: "n2", IP: "10.0.1.2"},
				}},
				{Name: "none", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{
					{Name: "none-1", Node: "n1", IP: "10.0.2.1"},
					{Name: "none-2", Node: "n2", IP: "10.0.2.2"},
				}},
			},
			Workloads: map[Workload][]string{{"a", "default"}: {"a"}, {"equal", "default"}: {"equal"}, {"none", "default"}: {"none"}},
			PodCPU:    []map[string]int64{{"default/a-1": 100, "default/a-2": 300}, {"default/equal-1": 250, "default/equal-2": 250}, nil}, // none for a-3, none-*
		},
	}, {
		name: "a pod's CPU request leaves Istio's sidecar out; its weight does not",
		objs: func() []runtime.Object {
			injected := deployed("default", "a", "a-1", "n1", "250m", "100m")
			injected.Spec.Containers[1].Name = SidecarContainer
			return []runtime.Object{
				managed("default", "a"), injected, deployed("default", "a", "a-2", "n2", "700m"),
				slice("default", "a", "a-x1", nil, endpoint("10.0.0.1", "a-1", "n1"), endpoint("10.0.0.2", "a-2", "n2")),
			}
		}(),
		want: &State{
			Nodes: wantNodes,
			Services: []optimizer.Service{{Name: "a", Namespace: "default", Ports: httpPort, CPU: 700, Pods: []optimizer.Pod{
				{Name: "a-1", Node: "n1", IP: "10.0.0.1", Weight: weight(350.0 / 525)}, // 350m with the sidecar, of a mean of 525m
				{Name: "a-2", Node: "n2", IP: "10.0.0.2", Weight: weight(700.0 / 525)},
			}}},
			Workloads: map[Workload][]string{{"a", "default"}: {"a"}},
			PodCPU:    []map[string]int64{{"default/a-1": 250, "default/a-2": 700}},
		},
	}, {
		name: "CPU limit: the application containers' summed, the least of the pods; the sidecar's left out; 0 when a pod or container has none",
		objs: func() []runtime.Object {
			limited := func(svc, name, node string, limits ...string) *corev1.Pod {
				p := deployed("default", svc, name, node)
				p.Spec.Containers = nil
				for i, l := range limits {
					c := corev1.Container{Name: fmt.Sprintf("c%d", i)}
					if l != "" {
						c.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(l)}
					}
					p.Spec.Containers = append(p.Spec.Containers, c)
				}
				return p
			}
			injected := limited("a", "a-1", "n1", "300m", "")
			injected.Spec.Containers[1].Name = SidecarContainer // no limit: not the application's
			return []runtime.Object{
				managed("default", "a"), injected, limited("a", "a-2", "n2", "200m", "50m"),
				slice("default", "a", "a-x1", nil, endpoint("10.0.0.1", "a-1", "n1"), endpoint("10.0.0.2", "a-2", "n2")),
				managed("default", "b"), limited("b", "b-1", "n1", "100m"), limited("b", "b-2", "n2", "100m", ""),
				slice("default", "b", "b-x1", nil, endpoint("10.0.1.1", "b-1", "n1"), endpoint("10.0.1.2", "b-2", "n2")),
			}
		}(),
		want: &State{
			Nodes: wantNodes,
			Services: []optimizer.Service{
				{Name: "a", Namespace: "default", Ports: httpPort, CPULimit: 250, Pods: []optimizer.Pod{
					{Name: "a-1", Node: "n1", IP: "10.0.0.1"}, {Name: "a-2", Node: "n2", IP: "10.0.0.2"}}},
				{Name: "b", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{ // b-2's second container has none
					{Name: "b-1", Node: "n1", IP: "10.0.1.1"}, {Name: "b-2", Node: "n2", IP: "10.0.1.2"}}},
			},
			Workloads: map[Workload][]string{{"a", "default"}: {"a"}, {"b", "default"}: {"b"}},
		},
	}, {
		name: "ports: a named targetPort resolves through the EndpointSlice",
		objs: []runtime.Object{
			managed("default", "a",
				corev1.ServicePort{Name: "grpc", Port: 80, TargetPort: intstr.FromString("grpc-port")},
				corev1.ServicePort{Name: "metrics", Port: 9100, TargetPort: intstr.FromInt32(9100)}),
			slice("default", "a", "a-x1", []string{"grpc:9090", "metrics:9100"}, endpoint("10.0.0.1", "", "n1")),
		},
		want: &State{
			Nodes: wantNodes,
			Services: []optimizer.Service{{Name: "a", Namespace: "default",
				Ports: []optimizer.Port{{Name: "grpc", Port: 80, TargetPort: 9090}, {Name: "metrics", Port: 9100, TargetPort: 9100}},
				Pods:  []optimizer.Pod{{Name: "ip-10-0-0-1", Node: "n1", IP: "10.0.0.1"}}}},
			Workloads: map[Workload][]string{},
		},
	}, {
		name: "an endpoint in an IPv4 and an IPv6 slice is one pod; FQDN slices are ignored",
		objs: []runtime.Object{
			managed("default", "a"),
			deployed("default", "a", "a-1", "n1"),
			slice("default", "a", "a-v4", nil, endpoint("10.0.0.1", "a-1", "n1")),
			func() *discoveryv1.EndpointSlice {
				s := slice("default", "a", "a-v6", nil, endpoint("fd00::1", "a-1", "n1"))
				s.AddressType = discoveryv1.AddressTypeIPv6
				return s
			}(),
			func() *discoveryv1.EndpointSlice {
				s := slice("default", "a", "a-fqdn", nil, endpoint("a.example.com", "", "n1"))
				s.AddressType = discoveryv1.AddressTypeFQDN
				return s
			}(),
		},
		want: &State{
			Nodes:     wantNodes,
			Services:  []optimizer.Service{{Name: "a", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "a-1", Node: "n1", IP: "10.0.0.1"}}}},
			Workloads: map[Workload][]string{{"a", "default"}: {"a"}},
		},
	}, {
		name: "workload names and the services they back",
		objs: []runtime.Object{
			// A Deployment's pods (ReplicaSet owner with pod-template-hash) back two services.
			managed("default", "web"), managed("default", "web-headless"),
			deployed("default", "web", "web-1", "n1"),
			slice("default", "web", "web-x1", nil, endpoint("10.0.0.1", "web-1", "n1")),
			slice("default", "web-headless", "web-headless-x1", nil, endpoint("10.0.0.1", "web-1", "n1")),
			// A StatefulSet whose pods each back their own service.
			managed("default", "db-0"), managed("default", "db-1"),
			pod("default", "db-0", "n1", nil, controller("StatefulSet", "db")),
			pod("default", "db-1", "n2", nil, controller("StatefulSet", "db")),
			slice("default", "db-0", "db-0-x1", nil, endpoint("10.0.0.2", "db-0", "n1")),
			slice("default", "db-1", "db-1-x1", nil, endpoint("10.0.0.3", "db-1", "n2")),
			// A bare pod; a ReplicaSet without the hash label; an owner that is no controller.
			managed("default", "misc"),
			pod("default", "solo", "n1", nil),
			pod("default", "rs-pod", "n1", nil, controller("ReplicaSet", "plain-rs")),
			pod("default", "owned", "n2", nil, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "cm", UID: "uid-cm"}),
			slice("default", "misc", "misc-x1", nil, endpoint("10.0.0.4", "solo", "n1"), endpoint("10.0.0.5", "rs-pod", "n1"), endpoint("10.0.0.6", "owned", "n2")),
			// Another namespace: the same workload name is another workload.
			managed("ns1", "web"),
			deployed("ns1", "web", "web-1", "n2"),
			slice("ns1", "web", "web-x1", nil, endpoint("10.0.1.1", "web-1", "n2")),
		},
		want: &State{
			Nodes: wantNodes,
			Services: []optimizer.Service{
				{Name: "db-0", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "db-0", Node: "n1", IP: "10.0.0.2"}}},
				{Name: "db-1", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "db-1", Node: "n2", IP: "10.0.0.3"}}},
				{Name: "misc", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{
					{Name: "owned", Node: "n2", IP: "10.0.0.6"},
					{Name: "rs-pod", Node: "n1", IP: "10.0.0.5"},
					{Name: "solo", Node: "n1", IP: "10.0.0.4"},
				}},
				{Name: "web", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "web-1", Node: "n1", IP: "10.0.0.1"}}},
				{Name: "web-headless", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "web-1", Node: "n1", IP: "10.0.0.1"}}},
				{Name: "web", Namespace: "ns1", Ports: httpPort, Pods: []optimizer.Pod{{Name: "web-1", Node: "n2", IP: "10.0.1.1"}}}, // key web.ns1
			},
			Workloads: map[Workload][]string{
				{"web", "default"}:      {"web", "web-headless"},
				{"db", "default"}:       {"db-0", "db-1"},
				{"solo", "default"}:     {"misc"},
				{"plain-rs", "default"}: {"misc"},
				{"owned", "default"}:    {"misc"},
				{"web", "ns1"}:          {"web.ns1"},
			},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := start(t, tt.cfg, append(append([]runtime.Object(nil), nodes...), tt.objs...)...)
			got := h.first()
			// Sidecar (the pod label) is checked in TestSourceFollowsChanges.
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty(), cmpopts.EquateApprox(1e-12, 0), cmpopts.IgnoreFields(optimizer.Pod{}, "Sidecar")); diff != "" {
				t.Errorf("State (-want +got):\n%s", diff)
			}
			for _, r := range []string{SkipNotReady, SkipNoAddress, SkipNoNode, SkipUnknownNode, SkipNoReadyPods} {
				if g, w := testutil.ToFloat64(h.src.skipped.WithLabelValues(r)), float64(tt.want.Skipped[r]); g != w {
					t.Errorf("edgeflow_kube_skipped{reason=%q} = %v, want %v", r, g, w)
				}
			}
			if !h.src.Synced() {
				t.Error("Synced() is false after a delivery")
			}
			if h.src.Current() != got {
				t.Error("Current() is not the State delivered")
			}
		})
	}
}

// A State is delivered after every change, and only then.
func TestSourceFollowsChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sl := slice("default", "a", "a-x1", nil, endpoint("10.0.0.1", "a-1", "n1"), notReady(endpoint("10.0.0.2", "a-2", "n2")))
	a2 := deployed("default", "a", "a-2", "n2")
	a2.Labels[optimizer.SidecarLabel] = optimizer.SidecarLabelValue // Istio's injector labels a sidecar pod so
	h := start(t, Config{Selector: DefaultSelector}, append(append([]runtime.Object(nil), nodes...),
		managed("default", "a"), deployed("default", "a", "a-1", "n1"), a2, sl)...)
	st := h.first()
	if n := len(st.Services[0].Pods); n != 1 || st.Skipped[SkipNotReady] != 1 {
		t.Fatalf("first State: %d pods, skipped %v; want 1 pod, a-2 not ready", n, st.Skipped)
	}

	// The pod becomes ready.
	sl = sl.DeepCopy()
	sl.Endpoints[1].Conditions.Ready = ptr(true)
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	st = h.nth(2)
	no, yes := false, true
	if diff := cmp.Diff([]optimizer.Pod{{Name: "a-1", Node: "n1", IP: "10.0.0.1", Sidecar: &no}, {Name: "a-2", Node: "n2", IP: "10.0.0.2", Sidecar: &yes}}, st.Services[0].Pods); diff != "" {
		t.Errorf("pods after a-2 became ready (-want +got):\n%s", diff)
	}
	if len(st.Skipped) != 0 {
		t.Errorf("skipped after a-2 became ready: %v", st.Skipped)
	}

	// A change to something the Source does not read (an annotation): taken, not rebuilt.
	rebuilds, events := h.rebuilds(), h.events()
	p, err := h.client.CoreV1().Pods("default").Get(ctx, "a-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Annotations = map[string]string{"touched": "yes"}
	if p, err = h.client.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the pod update's event", func() bool { return h.events() > events })
	if r := h.rebuilds(); r != rebuilds {
		t.Errorf("%v rebuilds after an annotation changed, want none", r-rebuilds)
	}

	// A change the Source reads that leaves the State as it was (a label): rebuilt, not
	// delivered.
	p.Labels["tier"] = "web"
	if _, err := h.client.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "a rebuild after the pod update", func() bool { return h.rebuilds() > rebuilds })

	// Then a real change (a node joins): exactly one more delivery.
	if _, err := h.client.CoreV1().Nodes().Create(ctx, node("n3", "1", "1Gi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st = h.nth(3)
	if len(st.Nodes) != 3 {
		t.Errorf("nodes after n3 joined: %v", st.Nodes)
	}
	if n := len(h.delivered()); n != 3 {
		t.Errorf("%d deliveries, want 3 (the unchanged State must not be delivered)", n)
	}

	// The last pod goes: the service is left out.
	if err := h.client.DiscoveryV1().EndpointSlices("default").Delete(ctx, "a-x1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	st = h.nth(4)
	if len(st.Services) != 0 || st.Skipped[SkipNoReadyPods] != 1 {
		t.Errorf("after the slice was deleted: services %v, skipped %v", st.Services, st.Skipped)
	}
}

// Informer callbacks never block: while the Run loop is busy (its delivery held), 500 updates
// are all received, and once it is free they cost one rebuild, whose State is the last one.
func TestSourceCoalescesEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := start(t, Config{}, append(append([]runtime.Object(nil), nodes...),
		managed("default", "a"), slice("default", "a", "a-x1", []string{"http:1"}, endpoint("10.0.0.1", "", "n1")))...)
	h.first()
	h.hold()
	// A change whose delivery the Run loop then waits in.
	if _, err := h.client.CoreV1().Nodes().Create(ctx, node("n3", "1", "1Gi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.nth(2)
	events, rebuilds := h.events(), h.rebuilds()

	const updates = 500
	sl := slice("default", "a", "a-x1", nil, endpoint("10.0.0.1", "", "n1"))
	for i := 1; i <= updates; i++ {
		sl.Ports[0].Port = ptr(int32(i))
		if _, err := h.client.DiscoveryV1().EndpointSlices("default").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 { // the fake clientset's watch buffer holds 100 events
			testkit.Eventually(t, 10*time.Second, fmt.Sprintf("%d events received", i), func() bool { return h.events()-events >= float64(i) })
		}
	}
	testkit.Eventually(t, 10*time.Second, "every event received while the Run loop was busy", func() bool { return h.events()-events >= updates })
	if n := len(h.delivered()); n != 2 {
		t.Fatalf("%d deliveries while the first was held, want 2", n)
	}
	h.release()
	st := h.nth(3)
	if got := st.Services[0].Ports[0].TargetPort; got != updates {
		t.Errorf("target port after %d updates: %d, want %d", updates, got, updates)
	}
	if d := h.rebuilds() - rebuilds; d > 2 {
		t.Errorf("%v rebuilds for %d coalesced updates, want at most 2", d, updates)
	}
}

func TestSourceStopsBeforeSync(t *testing.T) {
	t.Parallel()
	src, err := NewSource(Config{Client: kubetest.NewClientset(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := src.Run(ctx, func(*State) {}); err != nil {
		t.Errorf("Run with a cancelled context: %v, want nil", err)
	}
}

func TestNewSourceErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no client", Config{}, "Config.Client is nil"},
		{"bad selector", Config{Client: kubetest.NewClientset(), Selector: "a in (b"}, `selector "a in (b"`},
		{"metrics twice", Config{Client: kubetest.NewClientset(), Registerer: dupRegistry()}, "registering metrics"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewSource(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewSource: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func dupRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	if _, err := NewSource(Config{Client: kubetest.NewClientset(), Registerer: reg}); err != nil {
		panic(err)
	}
	return reg
}

// TestManagedServicesBounded: beyond Config.MaxServices, the managed services after the first
// MaxServices by namespace, then name, are refused (State.Refused, edgeflow_kube_skipped
// {reason="over_cap"}), whatever their readiness; those kept are served in full. A tenant's new
// service in an earlier namespace takes a place; one deleted gives it back. Before the bound,
// every labelled service was managed.
func TestManagedServicesBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	objs := append([]runtime.Object(nil), nodes...)
	for _, ref := range [][2]string{{"b", "x"}, {"a", "z"}, {"a-b", "y"}, {"c", "w"}} {
		ns, name := ref[0], ref[1]
		objs = append(objs, managed(ns, name, corev1.ServicePort{Name: "http", Port: 80}), deployed(ns, name, name+"-1", "n1"),
			slice(ns, name, name+"-s", []string{"http:80"}, endpoint("10.0.0.1", name+"-1", "n1")))
	}
	h := start(t, Config{Selector: DefaultSelector, MaxServices: 2}, objs...)
	keys := func(st *State) []string {
		var out []string
		for _, s := range st.Services {
			out = append(out, s.Namespace+"/"+s.Name)
		}
		slices.Sort(out) // Services are sorted by Key (NAME.NAMESPACE)
		return out
	}
	st := h.first()
	// By namespace, then name: a, a-b, b, c.
	if got, want := keys(st), []string{"a-b/y", "a/z"}; !slices.Equal(got, want) {
		t.Errorf("services kept %v, want %v", got, want)
	}
	if want := []string{"b/x", "c/w"}; !slices.Equal(st.Refused, want) || st.Skipped[SkipOverCap] != 2 {
		t.Errorf("refused %v (skipped %v), want %v", st.Refused, st.Skipped, want)
	}
	if got := testutil.ToFloat64(h.src.skipped.WithLabelValues(SkipOverCap)); got != 2 {
		t.Errorf("edgeflow_kube_skipped{reason=over_cap} = %v, want 2", got)
	}
	for _, s := range st.Services {
		if len(s.Pods) != 1 || len(s.Ports) != 1 {
			t.Errorf("kept service %s served without its pods or ports: %+v", s.Key(), s)
		}
	}

	// The first service goes: the next by namespace takes its place.
	if err := h.client.CoreV1().Services("a").Delete(ctx, "z", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "b/x managed once a/z is gone", func() bool {
		st = h.src.Current()
		return slices.Equal(keys(st), []string{"a-b/y", "b/x"}) && slices.Equal(st.Refused, []string{"c/w"})
	})
}
