package kubeapi

import (
	"context"
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// ManagedLabel is edgeflow's label of managed Services (kube.ManagedLabel; repeated here so
// the harness does not import the product).
const ManagedLabel = "edgeflow.io/managed"

// Kubelet plays the kubelet and the EndpointSlice controller for a test, in one namespace: it
// creates ready nodes, Services whose target port is the given port, pods bound to nodes with
// their IP and readiness, and keeps one EndpointSlice per Service with each pod's readiness.
// Every call fails the test on error.
type Kubelet struct {
	t      testing.TB
	ns     string
	ctx    context.Context
	cs     kubernetes.Interface
	port   int32
	ready  map[string]map[string]bool // service → pod → ready
	term   map[string]bool            // pods in graceful deletion
	uids   map[string]types.UID
	ips    map[string]string
	nodeOf map[string]string
}

func NewKubelet(t testing.TB, ctx context.Context, cs kubernetes.Interface, namespace string, port int32) *Kubelet {
	return &Kubelet{t: t, ctx: ctx, cs: cs, ns: namespace, port: port, ready: map[string]map[string]bool{}, term: map[string]bool{}, uids: map[string]types.UID{}, ips: map[string]string{}, nodeOf: map[string]string{}}
}

func (k *Kubelet) must(err error) {
	k.t.Helper()
	if err != nil {
		k.t.Fatal(err)
	}
}

// Node registers a Ready node with 4 CPUs, 8Gi and 110 pods allocatable (see CreateNode).
func (k *Kubelet) Node(name string) {
	_, err := CreateNode(k.ctx, k.cs, NodeSpec{Name: name})
	k.must(err)
}

func (k *Kubelet) Service(name string, managed bool) {
	labels := map[string]string{}
	if managed {
		labels[ManagedLabel] = "true"
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.ns, Labels: labels},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "grpc", Port: 9000, TargetPort: intstr.FromInt32(k.port)}}}}
	_, err := k.cs.CoreV1().Services(k.ns).Create(k.ctx, svc, metav1.CreateOptions{})
	k.must(err)
	k.ready[name] = map[string]bool{}
}

// pod creates a pod of service svc, binds it to node (as the scheduler), and sets its IP and
// readiness (as the Kubelet), then updates the service's EndpointSlice.
func (k *Kubelet) Pod(svc, name, node, ip string, ready bool) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.ns, Labels: map[string]string{"app": svc}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}}}}}}
	created, err := k.cs.CoreV1().Pods(k.ns).Create(k.ctx, p, metav1.CreateOptions{})
	k.must(err)
	k.uids[name] = created.UID
	k.must(k.cs.CoreV1().Pods(k.ns).Bind(k.ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.ns},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{}))
	k.ips[name], k.nodeOf[name] = ip, node
	k.SetReady(svc, name, ready)
}

func (k *Kubelet) SetReady(svc, name string, ready bool) {
	p, err := k.cs.CoreV1().Pods(k.ns).Get(k.ctx, name, metav1.GetOptions{})
	k.must(err)
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = k.ips[name]
	p.Status.PodIPs = []corev1.PodIP{{IP: k.ips[name]}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
	_, err = k.cs.CoreV1().Pods(k.ns).UpdateStatus(k.ctx, p, metav1.UpdateOptions{})
	k.must(err)
	k.ready[svc][name] = ready
	k.syncSlice(svc)
}

func (k *Kubelet) DeletePod(svc, name string) {
	k.must(k.cs.CoreV1().Pods(k.ns).Delete(k.ctx, name, metav1.DeleteOptions{}))
	delete(k.ready[svc], name)
	delete(k.term, name)
	k.syncSlice(svc)
}

// Terminate starts a graceful deletion of the pod (a 5-minute grace period that nothing ends:
// the pod stays, with its deletionTimestamp) and marks its endpoint as the EndpointSlice
// controller does for a terminating pod that still serves: ready false, serving true,
// terminating true.
func (k *Kubelet) Terminate(svc, name string) {
	k.must(k.cs.CoreV1().Pods(k.ns).Delete(k.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(300))}))
	k.term[name] = true
	k.syncSlice(svc)
}

// syncSlice writes the service's EndpointSlice as the EndpointSlice controller would.
func (k *Kubelet) syncSlice(svc string) {
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: svc + "-slice", Namespace: k.ns,
		Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("grpc"), Port: ptr(k.port)}}}
	for _, pod := range slices.Sorted(maps.Keys(k.ready[svc])) {
		cond := discoveryv1.EndpointConditions{Ready: ptr(k.ready[svc][pod]), Serving: ptr(k.ready[svc][pod])}
		if k.term[pod] {
			cond.Ready, cond.Terminating = ptr(false), ptr(true)
		}
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{k.ips[pod]},
			Conditions: cond,
			NodeName:   ptr(k.nodeOf[pod]),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: k.ns, Name: pod, UID: k.uids[pod]}})
	}
	cur, err := k.cs.DiscoveryV1().EndpointSlices(k.ns).Get(k.ctx, sl.Name, metav1.GetOptions{})
	if err == nil {
		sl.ResourceVersion = cur.ResourceVersion
		_, err = k.cs.DiscoveryV1().EndpointSlices(k.ns).Update(k.ctx, sl, metav1.UpdateOptions{})
	} else {
		_, err = k.cs.DiscoveryV1().EndpointSlices(k.ns).Create(k.ctx, sl, metav1.CreateOptions{})
	}
	k.must(err)
}

// deploymentPod creates a ready pod owned by the service's Deployment (its ReplicaSet), so
// that Istio's workload name for it is the service's name.
func (k *Kubelet) DeploymentPod(svc, name, node, ip string) {
	k.Pod(svc, name, node, ip, true)
	p, err := k.cs.CoreV1().Pods(k.ns).Get(k.ctx, name, metav1.GetOptions{})
	k.must(err)
	p.Labels["pod-template-hash"] = "5d8f9"
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: svc + "-5d8f9",
		UID: types.UID("rs-" + svc), Controller: ptr(true)}}
	_, err = k.cs.CoreV1().Pods(k.ns).Update(k.ctx, p, metav1.UpdateOptions{})
	k.must(err)
}

// Namespace creates the Kubelet's namespace.
func (k *Kubelet) Namespace() {
	_, err := k.cs.CoreV1().Namespaces().Create(k.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: k.ns}}, metav1.CreateOptions{})
	k.must(err)
}

func ptr[T any](v T) *T { return &v }
