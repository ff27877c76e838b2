package kubeapi

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// FakeKubeletOptions configures RunFakeKubelet. Zero fields take defaults.
type FakeKubeletOptions struct {
	// Namespaces are the namespaces whose pods it runs (all if empty).
	Namespaces []string
	// PodCIDR is where pod IPs come from (default 198.18.2.0/24; its first and last
	// addresses are not used). An IP is freed when its pod is gone.
	PodCIDR string
	// Ready says whether a running pod is ready (nil: every pod is). It is asked again when
	// the pod changes or after Resync, on the FakeKubelet's goroutine. SetReady overrides it
	// for one pod.
	Ready func(*corev1.Pod) bool
	// LeaseInterval is how often every node's Lease in kube-node-lease is renewed (default
	// 5 s; negative: never), as the kubelet's heartbeat. Without it kube-controller-manager's
	// node-lifecycle controller taints the nodes unreachable after 50 s and evicts their pods.
	LeaseInterval time.Duration
	// Runtime, if set, runs the pods (PodCIDR is then unused): see PodRuntime.
	Runtime PodRuntime
}

// PodRuntime runs pods for a FakeKubelet, as a container runtime does: e.g. each pod as a
// process in its node's network namespace.
type PodRuntime interface {
	// Start runs a pod bound to a node and returns its IP once it serves; the pod is reported
	// Running (and asked about readiness) only then. It is called once per pod (by UID), from
	// the FakeKubelet's goroutine; an error is retried with back-off.
	Start(ctx context.Context, pod *corev1.Pod) (netip.Addr, error)
	// Stop stops the pod (it is terminating or gone). It may be called more than once, also for
	// a pod whose Start failed.
	Stop(pod *corev1.Pod)
}

// FakeKubelet plays the kubelet (and container runtime) of every node for pods bound to a node:
// it marks them Running with an IP, a start time, running containers and the PodScheduled,
// Initialized, ContainersReady and Ready conditions; deletes pods that are terminating with
// grace period 0 (as the kubelet does once the containers stopped); and renews the nodes'
// Leases. It runs until its context ends or Stop; RunFakeKubelet stops it in t.Cleanup.
type FakeKubelet struct {
	t       testing.TB
	cs      kubernetes.Interface
	opts    FakeKubeletOptions
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	queue   workqueue.TypedRateLimitingInterface[string]
	factory informers.SharedInformerFactory
	pods    cache.Indexer
	nodes   cache.Indexer
	stopped sync.Once
	kick    chan struct{} // a node was added: renew Leases now

	mu       sync.Mutex
	cidr     netip.Prefix
	next     netip.Addr
	ipOf     map[types.UID]netip.Addr
	used     map[netip.Addr]bool
	override map[string]bool // namespace/name → ready
}

// RunFakeKubelet starts a FakeKubelet and waits until it has seen the existing pods and nodes.
// It fails the test if it cannot start.
func RunFakeKubelet(ctx context.Context, t testing.TB, cs kubernetes.Interface, opts FakeKubeletOptions) *FakeKubelet {
	t.Helper()
	if opts.PodCIDR == "" {
		opts.PodCIDR = "198.18.2.0/24"
	}
	if opts.LeaseInterval == 0 {
		opts.LeaseInterval = 5 * time.Second
	}
	cidr, err := netip.ParsePrefix(opts.PodCIDR)
	if err != nil || !cidr.Addr().Is4() {
		t.Fatalf("kubeapi: FakeKubelet PodCIDR %q: want an IPv4 prefix (%v)", opts.PodCIDR, err)
	}
	cidr = cidr.Masked()
	ctx, cancel := context.WithCancel(ctx)
	k := &FakeKubelet{t: t, cs: cs, opts: opts, cancel: cancel, cidr: cidr, next: cidr.Addr().Next(),
		ipOf: map[types.UID]netip.Addr{}, used: map[netip.Addr]bool{}, override: map[string]bool{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "fakekubelet"}),
		factory: informers.NewSharedInformerFactory(cs, 0), kick: make(chan struct{}, 1)}
	t.Cleanup(k.Stop)

	podInf := k.factory.Core().V1().Pods().Informer()
	nodeInf := k.factory.Core().V1().Nodes().Informer()
	k.pods, k.nodes = podInf.GetIndexer(), nodeInf.GetIndexer()
	enqueue := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && k.watched(p.Namespace) {
			if key, err := cache.MetaNamespaceKeyFunc(p); err == nil {
				k.queue.Add(key)
			}
		}
	}
	_, err = podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				k.release(p)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) {
		select {
		case k.kick <- struct{}{}:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	k.factory.Start(ctx.Done())
	for typ, ok := range k.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			k.Stop()
			t.Fatalf("kubeapi: FakeKubelet: %v cache did not sync", typ)
		}
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		for k.work(ctx) {
		}
	}()
	if opts.LeaseInterval > 0 {
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			k.heartbeat(ctx)
		}()
	}
	return k
}

// Stop stops the FakeKubelet and waits for its goroutines. It is safe to call more than once.
func (k *FakeKubelet) Stop() {
	k.stopped.Do(func() {
		k.cancel()
		k.queue.ShutDown()
		k.wg.Wait()
		k.factory.Shutdown()
	})
}

// SetReady makes the pod ready or not, overriding Options.Ready, and updates its status.
func (k *FakeKubelet) SetReady(namespace, name string, ready bool) {
	key := namespace + "/" + name
	k.mu.Lock()
	k.override[key] = ready
	k.mu.Unlock()
	k.queue.Add(key)
}

// Resync has the pod's status computed again (e.g. after Options.Ready changed its answer).
func (k *FakeKubelet) Resync(namespace, name string) { k.queue.Add(namespace + "/" + name) }

func (k *FakeKubelet) watched(ns string) bool {
	return len(k.opts.Namespaces) == 0 || slices.Contains(k.opts.Namespaces, ns)
}

func (k *FakeKubelet) work(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	err := k.sync(ctx, key)
	switch {
	case err == nil || apierrors.IsNotFound(err):
		k.queue.Forget(key)
	case ctx.Err() != nil:
	default:
		if !apierrors.IsConflict(err) {
			k.t.Logf("kubeapi: FakeKubelet: pod %s: %v (retrying)", key, err)
		}
		k.queue.AddRateLimited(key)
	}
	return true
}

func (k *FakeKubelet) sync(ctx context.Context, key string) error {
	obj, exists, err := k.pods.GetByKey(key)
	if err != nil || !exists {
		return err
	}
	pod := obj.(*corev1.Pod)
	if pod.DeletionTimestamp != nil {
		if k.opts.Runtime != nil {
			k.opts.Runtime.Stop(pod)
		}
		// The containers "stopped": finish the graceful deletion as the kubelet does.
		zero := int64(0)
		err := k.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if apierrors.IsConflict(err) { // a newer pod of the same name
			return nil
		}
		return err
	}
	if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	var ip netip.Addr
	if k.opts.Runtime != nil {
		ip, err = k.start(ctx, pod)
	} else {
		ip, err = k.allocate(pod)
	}
	if err != nil {
		return err
	}
	k.mu.Lock()
	ready, set := k.override[key]
	k.mu.Unlock()
	if !set {
		ready = k.opts.Ready == nil || k.opts.Ready(pod)
	}
	p := pod.DeepCopy()
	k.desired(p, ip, ready)
	if equality.Semantic.DeepEqual(p.Status, pod.Status) {
		return nil
	}
	_, err = k.cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}

// desired sets p's status to what a kubelet reports for it running with ip.
func (k *FakeKubelet) desired(p *corev1.Pod, ip netip.Addr, ready bool) {
	now := metav1.Now()
	s := &p.Status
	s.Phase = corev1.PodRunning
	s.PodIP, s.PodIPs = ip.String(), []corev1.PodIP{{IP: ip.String()}}
	if s.StartTime == nil {
		s.StartTime = &now
	}
	if obj, ok, _ := k.nodes.GetByKey(p.Spec.NodeName); ok {
		for _, a := range obj.(*corev1.Node).Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				s.HostIP, s.HostIPs = a.Address, []corev1.HostIP{{IP: a.Address}}
				break
			}
		}
	}
	status := func(b bool) corev1.ConditionStatus {
		if b {
			return corev1.ConditionTrue
		}
		return corev1.ConditionFalse
	}
	setCond := func(typ corev1.PodConditionType, st corev1.ConditionStatus) {
		for i := range s.Conditions {
			if c := &s.Conditions[i]; c.Type == typ {
				if c.Status != st {
					c.Status, c.LastTransitionTime, c.Reason, c.Message = st, now, "", ""
				}
				return
			}
		}
		s.Conditions = append(s.Conditions, corev1.PodCondition{Type: typ, Status: st, LastTransitionTime: now})
	}
	setCond(corev1.PodScheduled, corev1.ConditionTrue)
	setCond(corev1.PodReadyToStartContainers, corev1.ConditionTrue)
	setCond(corev1.PodInitialized, corev1.ConditionTrue)
	setCond(corev1.ContainersReady, status(ready))
	setCond(corev1.PodReady, status(ready))
	var cs []corev1.ContainerStatus
	for _, c := range p.Spec.Containers {
		started := *s.StartTime
		for _, old := range s.ContainerStatuses {
			if old.Name == c.Name && old.State.Running != nil {
				started = old.State.Running.StartedAt
			}
		}
		cs = append(cs, corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: "fake://" + c.Image,
			ContainerID: "fake://" + string(p.UID) + "/" + c.Name, Ready: ready, Started: ptr(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}})
	}
	s.ContainerStatuses = cs
}

// allocate returns the pod's IP: the one it has, or the next free one of the CIDR.
func (k *FakeKubelet) allocate(pod *corev1.Pod) (netip.Addr, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ip, ok := k.ipOf[pod.UID]; ok {
		return ip, nil
	}
	if ip, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
		k.ipOf[pod.UID], k.used[ip] = ip, true
		return ip, nil
	}
	for range 1 << (32 - k.cidr.Bits()) {
		ip := k.next
		k.next = ip.Next()
		if !k.cidr.Contains(k.next) || !k.cidr.Contains(k.next.Next()) {
			k.next = k.cidr.Addr().Next() // skip the broadcast address, wrap around
		}
		if !k.used[ip] {
			k.ipOf[pod.UID], k.used[ip] = ip, true
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("pod CIDR %s exhausted", k.cidr)
}

// start returns the pod's IP from Options.Runtime, starting the pod there the first time.
func (k *FakeKubelet) start(ctx context.Context, pod *corev1.Pod) (netip.Addr, error) {
	k.mu.Lock()
	ip, ok := k.ipOf[pod.UID]
	k.mu.Unlock()
	if ok {
		return ip, nil
	}
	ip, err := k.opts.Runtime.Start(ctx, pod)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("runtime: %w", err)
	}
	k.mu.Lock()
	k.ipOf[pod.UID] = ip
	k.mu.Unlock()
	return ip, nil
}

func (k *FakeKubelet) release(pod *corev1.Pod) {
	if k.opts.Runtime != nil {
		k.opts.Runtime.Stop(pod)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if ip, ok := k.ipOf[pod.UID]; ok {
		delete(k.used, ip)
		delete(k.ipOf, pod.UID)
	}
	delete(k.override, pod.Namespace+"/"+pod.Name)
}

// heartbeat renews every node's Lease in kube-node-lease, as the kubelet does every 10 s, and
// creates a new node's Lease as soon as the node appears.
func (k *FakeKubelet) heartbeat(ctx context.Context) {
	tick := time.NewTicker(k.opts.LeaseInterval)
	defer tick.Stop()
	failing := map[string]bool{}
	for {
		for _, obj := range k.nodes.List() {
			n := obj.(*corev1.Node)
			err := k.renewLease(ctx, n)
			if ctx.Err() != nil {
				return
			}
			if err != nil && !failing[n.Name] {
				k.t.Logf("kubeapi: FakeKubelet: lease of node %s: %v", n.Name, err)
			}
			failing[n.Name] = err != nil
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-k.kick:
		}
	}
}

func (k *FakeKubelet) renewLease(ctx context.Context, n *corev1.Node) error {
	leases := k.cs.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, n.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: corev1.NamespaceNodeLease,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr(n.Name), LeaseDurationSeconds: ptr(int32(40)), RenewTime: &now}}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil // renewed by someone else; next tick
	}
	return err
}
