// Package live holds edgeflow's tests against real servers: a real kube-apiserver and etcd
// (e2e/kubeapi), a real Prometheus and blackbox-exporter in a network-namespace testbed with
// real delay (e2e/testbed), and real grpc-go xDS clients receiving the weights.
package live

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/xds"
)

const ns = "shop"

// kubelet plays the kubelet and the EndpointSlice controller for the test: it creates pods
// bound to nodes, and keeps one EndpointSlice per service with each pod's readiness.
type kubelet struct {
	t      *testing.T
	ctx    context.Context
	cs     kubernetes.Interface
	port   int32
	ready  map[string]map[string]bool // service → pod → ready
	ips    map[string]string
	nodeOf map[string]string
}

func newKubelet(t *testing.T, ctx context.Context, cs kubernetes.Interface, port int32) *kubelet {
	return &kubelet{t: t, ctx: ctx, cs: cs, port: port, ready: map[string]map[string]bool{}, ips: map[string]string{}, nodeOf: map[string]string{}}
}

func (k *kubelet) must(err error) {
	k.t.Helper()
	if err != nil {
		k.t.Fatal(err)
	}
}

func (k *kubelet) node(name string) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	n, err := k.cs.CoreV1().Nodes().Create(k.ctx, n, metav1.CreateOptions{})
	k.must(err)
	n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}}
	_, err = k.cs.CoreV1().Nodes().UpdateStatus(k.ctx, n, metav1.UpdateOptions{})
	k.must(err)
}

func (k *kubelet) service(name string, managed bool) {
	labels := map[string]string{}
	if managed {
		labels[kube.ManagedLabel] = "true"
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "grpc", Port: 9000, TargetPort: intstr.FromInt32(k.port)}}}}
	_, err := k.cs.CoreV1().Services(ns).Create(k.ctx, svc, metav1.CreateOptions{})
	k.must(err)
	k.ready[name] = map[string]bool{}
}

// pod creates a pod of service svc, binds it to node (as the scheduler), and sets its IP and
// readiness (as the kubelet), then updates the service's EndpointSlice.
func (k *kubelet) pod(svc, name, node, ip string, ready bool) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": svc}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}}}}}}
	_, err := k.cs.CoreV1().Pods(ns).Create(k.ctx, p, metav1.CreateOptions{})
	k.must(err)
	k.must(k.cs.CoreV1().Pods(ns).Bind(k.ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{}))
	k.ips[name], k.nodeOf[name] = ip, node
	k.setReady(svc, name, ready)
}

func (k *kubelet) setReady(svc, name string, ready bool) {
	p, err := k.cs.CoreV1().Pods(ns).Get(k.ctx, name, metav1.GetOptions{})
	k.must(err)
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = k.ips[name]
	p.Status.PodIPs = []corev1.PodIP{{IP: k.ips[name]}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
	_, err = k.cs.CoreV1().Pods(ns).UpdateStatus(k.ctx, p, metav1.UpdateOptions{})
	k.must(err)
	k.ready[svc][name] = ready
	k.syncSlice(svc)
}

func (k *kubelet) deletePod(svc, name string) {
	k.must(k.cs.CoreV1().Pods(ns).Delete(k.ctx, name, metav1.DeleteOptions{}))
	delete(k.ready[svc], name)
	k.syncSlice(svc)
}

// syncSlice writes the service's EndpointSlice as the EndpointSlice controller would.
func (k *kubelet) syncSlice(svc string) {
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: svc + "-slice", Namespace: ns,
		Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("grpc"), Port: ptr(k.port)}}}
	for _, pod := range sortedKeys(k.ready[svc]) {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{k.ips[pod]},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(k.ready[svc][pod])},
			NodeName:   ptr(k.nodeOf[pod]),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod}})
	}
	cur, err := k.cs.DiscoveryV1().EndpointSlices(ns).Get(k.ctx, sl.Name, metav1.GetOptions{})
	if err == nil {
		sl.ResourceVersion = cur.ResourceVersion
		_, err = k.cs.DiscoveryV1().EndpointSlices(ns).Update(k.ctx, sl, metav1.UpdateOptions{})
	} else {
		_, err = k.cs.DiscoveryV1().EndpointSlices(ns).Create(k.ctx, sl, metav1.CreateOptions{})
	}
	k.must(err)
}

func ptr[T any](v T) *T { return &v }

// TestKubernetesPodsDriveWeights: a real kube-apiserver, edgeflow's informers, the xDS server
// and a real grpc-go xDS client. A pod becoming ready gets traffic (and the time from the
// EndpointSlice update to its first RPC is measured), a deleted pod gets none, and not-ready
// pods and a managed service without ready pods never block the others.
func TestKubernetesPodsDriveWeights(t *testing.T) {
	testbed.RequireRoot(t)
	c := kubeapi.Start(t, kubeapi.Options{})
	ctx := kubeapi.Context(t)
	podNS := testbed.NewNamespace(t, "198.18.1.0/24")
	backends, port := startBackends(t, podNS, "api-0", "api-1", "api-2", "api-3")
	k := newKubelet(t, ctx, c.Client, port)
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	k.must(err)
	for _, n := range []string{"n1", "n2", "n3"} {
		k.node(n)
	}
	k.service("web", true)
	k.service("api", true)
	k.service("ghost", true)      // managed, never a ready pod
	k.service("unmanaged", false) // not labelled: ignored
	k.pod("web", "web-0", "n1", podIP(100), true)
	k.pod("api", "api-0", "n1", backends["api-0"].ip, true)
	k.pod("api", "api-1", "n2", backends["api-1"].ip, true)
	k.pod("api", "api-2", "n3", backends["api-2"].ip, false)
	k.pod("ghost", "ghost-0", "n3", podIP(101), false)
	k.pod("unmanaged", "u-0", "n3", podIP(102), true)

	reg := prometheus.NewRegistry()
	ks, err := kube.NewSource(kube.Config{Client: c.Client, Namespaces: []string{ns}, Selector: kube.DefaultSelector, Registerer: reg})
	k.must(err)
	defaultMS := 10.0
	cl, err := watcher.NewCluster(watcher.ClusterConfig{Kube: ks, DefaultLatencyMS: &defaultMS, Check: xds.CheckTopology, Registerer: reg,
		CallGraph: &watcher.CallGraph{
			Calls:   []optimizer.Call{{From: "web.shop", To: "api.shop"}, {From: "web.shop", To: "ghost.shop"}, {From: "web.shop", To: "unmanaged.shop"}},
			Ingress: []optimizer.Ingress{{Service: "web.shop", RPS: 100}}}})
	k.must(err)
	srv, addr := xdsServer(t, xds.Config{Registerer: reg}, cl.Run)
	web := newCaller(t, podNS, addr, "web-0.shop", "api.shop")

	// Two ready pods: each gets half (LATA's balance constraint with one caller pod).
	eventually(t, 30*time.Second, "first publication", func() bool { return srv.Published() > 0 })
	got := share(t, ctx, web, 2000)
	t.Logf("api-2 not ready: %s", fmtShare(got))
	if got["api-2"] != 0 || math.Abs(got["api-0"]-0.5) > 0.05 || math.Abs(got["api-1"]-0.5) > 0.05 {
		t.Fatalf("before api-2 is ready: shares %s, want api-0 and api-1 0.5 each", fmtShare(got))
	}
	if n := gaugeValue(t, reg, "edgeflow_kube_skipped", "not_ready"); n < 1 {
		t.Errorf("edgeflow_kube_skipped{reason=not_ready} = %v, want ≥ 1", n)
	}
	if n := gaugeValue(t, reg, "edgeflow_kube_skipped", "no_ready_pods"); n != 1 {
		t.Errorf("edgeflow_kube_skipped{reason=no_ready_pods} = %v, want 1 (ghost)", n)
	}

	// api-2 becomes ready: traffic reaches it; measure from the EndpointSlice update.
	loopCtx, stop := context.WithCancel(ctx)
	wait := web.loop(loopCtx, 2*time.Millisecond)
	start := time.Now()
	k.setReady("api", "api-2", true)
	eventually(t, 10*time.Second, "first RPC on api-2", func() bool { return backends["api-2"].served.Load() > 0 })
	readyToRPC := time.Unix(0, backends["api-2"].first.Load()).Sub(start)
	stop()
	wait()
	t.Logf("pod ready → first RPC on it: %v (target ≤ 1 s)", readyToRPC.Round(time.Millisecond))
	if readyToRPC > time.Second {
		t.Errorf("pod ready → first RPC took %v, want ≤ 1 s", readyToRPC)
	}
	got = share(t, ctx, web, 3000)
	t.Logf("api-2 ready: %s", fmtShare(got))
	for _, p := range []string{"api-0", "api-1", "api-2"} {
		if math.Abs(got[p]-1.0/3) > 0.05 {
			t.Errorf("after api-2 is ready: %s got %.2f, want 1/3", p, got[p])
		}
	}

	// A not-ready newcomer never blocks the others: api-3 not ready, then api-1 deleted.
	k.pod("api", "api-3", "n2", backends["api-3"].ip, false)
	pub := srv.Published()
	k.deletePod("api", "api-1")
	eventually(t, 10*time.Second, "publication after the deletion", func() bool { return srv.Published() > pub })
	before := backends["api-1"].served.Load()
	got = share(t, ctx, web, 2000)
	t.Logf("api-1 deleted, api-3 not ready: %s", fmtShare(got))
	if n := backends["api-1"].served.Load() - before; n != 0 {
		t.Errorf("deleted pod api-1 served %d RPCs after the push", n)
	}
	if got["api-3"] != 0 {
		t.Errorf("not-ready pod api-3 got %.2f of the traffic", got["api-3"])
	}
	if math.Abs(got["api-0"]-0.5) > 0.05 || math.Abs(got["api-2"]-0.5) > 0.05 {
		t.Errorf("after deletion: %s, want api-0 and api-2 0.5 each", fmtShare(got))
	}
	if f := web.failed.Load(); f != 0 {
		t.Errorf("%d of %d RPCs failed", f, web.sent.Load())
	}
	top := cl.Current()
	for _, s := range top.Services {
		if s.Name == "ghost" || s.Name == "unmanaged" {
			t.Errorf("service %s is in the topology", s.Key())
		}
	}
}

// gaugeValue reads one labelled gauge (reason=…) from the registry.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if reason == "" && len(m.GetLabel()) == 0 {
				return m.GetGauge().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return math.NaN()
}
