package kube

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
)

func withUID(p *corev1.Pod, uid string) *corev1.Pod {
	p.UID = types.UID(uid)
	return p
}

func withPodIPs(p *corev1.Pod, ips ...string) *corev1.Pod {
	p.Status.PodIP = ips[0]
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

func refUID(ep discoveryv1.Endpoint, uid string) discoveryv1.Endpoint {
	ep.TargetRef.UID = types.UID(uid)
	return ep
}

func terminating(ep discoveryv1.Endpoint, serving bool) discoveryv1.Endpoint {
	ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(serving), Terminating: ptr(true)}
	return ep
}

func v6(sl *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	sl.AddressType = discoveryv1.AddressTypeIPv6
	return sl
}

// EndpointSlice conditions, address family, targetRef.uid and pod names, as the rules say.
func TestEndpointTruth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		objs []runtime.Object
		want *State
	}{{
		name: "terminating pods get no traffic, even while serving or read as ready (publishNotReadyAddresses)",
		objs: []runtime.Object{
			managed("default", "a"),
			slice("default", "a", "a-x1", nil,
				endpoint("10.0.0.1", "a-1", "n1"),
				terminating(endpoint("10.0.0.2", "a-2", "n2"), true),
				func() discoveryv1.Endpoint { // ready stays true under publishNotReadyAddresses
					ep := endpoint("10.0.0.3", "a-3", "n2")
					ep.Conditions.Terminating = ptr(true)
					return ep
				}()),
		},
		want: &State{
			Nodes:     wantNodes,
			Services:  []optimizer.Service{{Name: "a", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "a-1", Node: "n1", IP: "10.0.0.1"}}}},
			Workloads: map[Workload][]string{},
			Skipped:   map[string]int{SkipTerminating: 2},
		},
	}, {
		name: "dual stack: each pod's primary family, whatever the slices' names",
		objs: []runtime.Object{
			managed("default", "a"),
			withPodIPs(pod("default", "a-4", "n1", nil), "10.0.0.4", "fd00::4"),
			withPodIPs(pod("default", "a-6", "n2", nil), "fd00::6", "10.0.0.6"),
			v6(slice("default", "a", "a-0", nil, endpoint("fd00::4", "a-4", "n1"), endpoint("fd00::6", "a-6", "n2"))),
			slice("default", "a", "a-1", nil, endpoint("10.0.0.4", "a-4", "n1"), endpoint("10.0.0.6", "a-6", "n2")),
		},
		want: &State{
			Nodes: wantNodes,
			Services: []optimizer.Service{{Name: "a", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{
				{Name: "a-4", Node: "n1", IP: "10.0.0.4"}, {Name: "a-6", Node: "n2", IP: "fd00::6"}}}},
			Workloads: map[Workload][]string{{"a-4", "default"}: {"a"}, {"a-6", "default"}: {"a"}},
		},
	}, {
		name: "--ip-family IPv6 overrides the pods' primary family",
		cfg:  Config{IPFamily: corev1.IPv6Protocol},
		objs: []runtime.Object{
			managed("default", "a"),
			withPodIPs(pod("default", "a-4", "n1", nil), "10.0.0.4", "fd00::4"),
			v6(slice("default", "a", "a-0", nil, endpoint("fd00::4", "a-4", "n1"))),
			slice("default", "a", "a-1", nil, endpoint("10.0.0.4", "a-4", "n1")),
		},
		want: &State{
			Nodes:     wantNodes,
			Services:  []optimizer.Service{{Name: "a", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "a-4", Node: "n1", IP: "fd00::4"}}}},
			Workloads: map[Workload][]string{{"a-4", "default"}: {"a"}},
		},
	}, {
		name: "pods found by targetRef.uid: a recreated pod of the same name is not the endpoint's",
		objs: []runtime.Object{
			managed("default", "a"),
			withUID(deployed("default", "a", "a-1", "n1"), "uid-new"),
			slice("default", "a", "a-x1", nil, refUID(endpoint("10.0.0.1", "a-1", ""), "uid-old")),
			managed("default", "b"),
			withUID(deployed("default", "b", "b-1", "n2"), "uid-b1"),
			slice("default", "b", "b-x1", nil, refUID(endpoint("10.0.0.2", "b-1", ""), "uid-b1")),
		},
		want: &State{
			Nodes: wantNodes,
			// a-1's endpoint names an old incarnation: no node from the pod, so it is left out.
			Services:  []optimizer.Service{{Name: "b", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "b-1", Node: "n2", IP: "10.0.0.2"}}}},
			Workloads: map[Workload][]string{{"b", "default"}: {"b"}},
			Skipped:   map[string]int{SkipNoNode: 1, SkipNoReadyPods: 1},
		},
	}, {
		// Pod "x.shop" in default and pod "x" in shop would both have the key "x.shop".
		name: "pod keys stay unambiguous: a dotted pod name in default is left out; bad names too",
		objs: []runtime.Object{
			managed("default", "a"), managed("shop", "a"),
			pod("default", "x.shop", "n1", nil), pod("shop", "x", "n2", nil), pod("shop", "y.z", "n2", nil),
			slice("default", "a", "a-x1", nil, endpoint("10.0.0.1", "x.shop", "n1"), endpoint("10.0.0.3", "Bad_Name", "n1"), endpoint("10.0.0.4", "d-1", "n1")),
			slice("shop", "a", "a-x1", nil, endpoint("10.0.1.1", "x", "n2"), endpoint("10.0.1.2", "y.z", "n2")),
		},
		want: &State{
			Nodes: wantNodes,
			Services: []optimizer.Service{
				{Name: "a", Namespace: "default", Ports: httpPort, Pods: []optimizer.Pod{{Name: "d-1", Node: "n1", IP: "10.0.0.4"}}},
				// Dots are fine outside default: the key's last label is the namespace.
				{Name: "a", Namespace: "shop", Ports: httpPort, Pods: []optimizer.Pod{{Name: "x", Node: "n2", IP: "10.0.1.1"}, {Name: "y.z", Node: "n2", IP: "10.0.1.2"}}},
			},
			Workloads: map[Workload][]string{{"x", "shop"}: {"a.shop"}, {"y.z", "shop"}: {"a.shop"}},
			Skipped:   map[string]int{SkipAmbiguousName: 1, SkipBadName: 1},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := start(t, tt.cfg, append(append([]runtime.Object(nil), nodes...), tt.objs...)...)
			got := h.first()
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty(), cmpopts.IgnoreFields(State{}, "NodeAddresses"), cmpopts.IgnoreFields(optimizer.Pod{}, "Sidecar")); diff != "" {
				t.Errorf("State (-want +got):\n%s", diff)
			}
			for _, r := range skipReasons {
				if g, w := testutil.ToFloat64(h.src.skipped.WithLabelValues(r)), float64(tt.want.Skipped[r]); g != w {
					t.Errorf("edgeflow_kube_skipped{reason=%q} = %v, want %v", r, g, w)
				}
			}
			keys := map[string]bool{}
			for i := range got.Services {
				for j := range got.Services[i].Pods {
					k := got.Services[i].PodKey(&got.Services[i].Pods[j])
					if keys[k] && got.Services[i].Name != "web-headless" {
						t.Errorf("pod key %s twice", k)
					}
					keys[k] = true
				}
			}
		})
	}
	if _, err := NewSource(Config{Client: nil}); err == nil {
		t.Error("NewSource without a client: no error")
	}
}

// A failing watch is reported with the time it began, and cleared when the informer hears
// from the API server again.
func TestWatchFailuresReported(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true) // the list works, every pod watch fails
	h := startWith(t, Config{}, func(c *fake.Clientset) {
		c.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
			if failing.Load() {
				return true, nil, errors.New("pods is forbidden: the RBAC rule went away")
			}
			return false, nil, nil
		})
	}, append(append([]runtime.Object(nil), nodes...), managed("default", "a"))...)
	h.first()
	testkit.Eventually(t, 10*time.Second, "the failing pod watch reported", func() bool {
		f := h.src.WatchFailures()
		return len(f) == 1 && f[0].Informer == "pods in all namespaces" && strings.Contains(f[0].Err.Error(), "forbidden") && !f[0].Since.IsZero()
	})
	failing.Store(false)
	_, err := h.client.CoreV1().Pods("default").Create(context.Background(), pod("default", "p-1", "n1", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the failure cleared", func() bool { return len(h.src.WatchFailures()) == 0 })
}

// The API server check ticks on Config.Clock every HealthInterval: a fake clock stepped by
// the interval runs it at once, and the failure is stamped with the clock's time.
func TestAPIServerCheckTicksOnClock(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := testkit.NewFakeClock(at)
	h := startWith(t, Config{Clock: clk, HealthInterval: time.Hour}, func(c *fake.Clientset) {
		c.PrependReactor("get", "version", func(k8stesting.Action) (bool, runtime.Object, error) {
			if failing.Load() {
				return true, nil, errors.New("connection refused")
			}
			return false, nil, nil
		})
	}, nodes...)
	h.first()
	testkit.Eventually(t, 10*time.Second, "the API server check armed a ticker on Config.Clock", clk.HasWaiters)
	if f := h.src.WatchFailures(); len(f) != 0 {
		t.Fatalf("failures before the first check: %v", f)
	}
	clk.Step(time.Hour)
	testkit.Eventually(t, 10*time.Second, "the API server reported down", func() bool {
		f := h.src.WatchFailures()
		return len(f) == 1 && f[0].Informer == apiServerCheck && f[0].Since.Equal(at.Add(time.Hour))
	})
	failing.Store(false)
	clk.Step(time.Hour)
	testkit.Eventually(t, 10*time.Second, "the API server reported up", func() bool { return len(h.src.WatchFailures()) == 0 })
}

// Pods that have ended are not even listed: the pod list and watch carry ActivePods as their
// field selector (the API server applies it; the fake client only records it), and no other
// resource carries one.
func TestEndedPodsNotListed(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	selectors := map[string]string{} // resource → field selector of its list
	h := startWith(t, Config{}, func(c *fake.Clientset) {
		c.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if l, ok := a.(k8stesting.ListAction); ok {
				mu.Lock()
				selectors[a.GetResource().Resource] = l.GetListRestrictions().Fields.String()
				mu.Unlock()
			}
			return false, nil, nil
		})
	}, append(append([]runtime.Object(nil), nodes...), managed("default", "a"))...)
	h.first()
	mu.Lock()
	defer mu.Unlock()
	want := map[string]string{"pods": fields.ParseSelectorOrDie(ActivePods).String(), "nodes": "", "services": "", "endpointslices": ""}
	if diff := cmp.Diff(want, selectors); diff != "" {
		t.Errorf("field selectors of the lists (-want +got):\n%s", diff)
	}
}
