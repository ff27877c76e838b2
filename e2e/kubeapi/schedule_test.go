package kubeapi

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

// The ground a pod rebalancer stands on: a Deployment's pods are created by the ReplicaSet
// controller, placed by kube-scheduler and made ready by the FakeKubelet; the disruption
// controller opens a PodDisruptionBudget; an eviction is allowed once and refused (429) while
// the budget is spent, and the replacement is placed and ready; a pod held by a scheduling gate
// is not placed, takes a node affinity while gated and lands on exactly that node once ungated.
func TestDeploymentSchedules(t *testing.T) {
	begin := time.Now()
	c := Start(t, Options{Scheduler: true, ControllerManager: true})
	step := func(what string, since time.Time) { t.Logf("%-48s %6.2f s", what, time.Since(since).Seconds()) }
	step("control plane up (etcd, apiserver, scheduler, kcm)", begin)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	waitFor := func(what string, cond func() (bool, error)) {
		t.Helper()
		if err := testkit.WaitContext(ctx, cond); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}
	cs := c.Client
	const ns = "rebalance"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	leaks := goleak.IgnoreCurrent()
	fk := RunFakeKubelet(ctx, t, cs, FakeKubeletOptions{Namespaces: []string{ns}})
	for i, n := range []NodeSpec{{Name: "n1", CPU: "1", Memory: "2Gi"}, {Name: "n2", CPU: "2", Memory: "4Gi"}, {Name: "n3", CPU: "4", Memory: "8Gi"}} {
		n.Address = fmt.Sprintf("10.1.0.%d", i+1)
		if _, err := CreateNode(ctx, cs, n); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: ptr(int32(3)), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr(int64(30)), Containers: []corev1.Container{{Name: "app", Image: "app",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("600m"), corev1.ResourceMemory: resource.MustParse("256Mi")}}}}}}}}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr(intstr.FromInt32(2)), Selector: &metav1.LabelSelector{MatchLabels: labels}}}
	if _, err := cs.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("3 pods created by the ReplicaSet", func() (bool, error) {
		pods, err := webPods(ctx, cs, ns)
		return len(pods) == 3, err
	})
	step("ReplicaSet created 3 pods", start)
	waitFor("3 pods bound", func() (bool, error) {
		pods, err := webPods(ctx, cs, ns)
		bound := 0
		for _, p := range pods {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		return bound == 3, err
	})
	step("kube-scheduler bound 3 pods", start)
	waitFor("Deployment 3 ready replicas", func() (bool, error) {
		d, err := cs.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == 3 && d.Status.AvailableReplicas == 3, err
	})
	step("Deployment reports 3 ready", start)
	waitFor("PDB disruptionsAllowed 1", func() (bool, error) {
		p, err := cs.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "web", metav1.GetOptions{})
		return err == nil && p.Status.DisruptionsAllowed == 1 && p.Status.CurrentHealthy == 3, err
	})
	step("PDB allows 1 disruption", start)
	pods, err := webPods(ctx, cs, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		t.Logf("  %s on %s ip %s", p.Name, p.Spec.NodeName, p.Status.PodIP)
		if p.Status.PodIP == "" || p.Status.StartTime == nil || !podReady(&p) {
			t.Errorf("pod %s: ip %q start %v ready %v", p.Name, p.Status.PodIP, p.Status.StartTime, podReady(&p))
		}
	}

	start = time.Now()
	evict := func(name string) error {
		return cs.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}})
	}
	victim := pods[0].Name
	if err := evict(victim); err != nil {
		t.Fatalf("first eviction: %v", err)
	}
	step("eviction of "+victim+" accepted", start)
	if err := evict(pods[1].Name); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("second eviction while the budget is spent: got %v, want 429 TooManyRequests", err)
	} else {
		t.Logf("  second eviction refused: %v", err)
	}
	waitFor("evicted pod gone and a replacement ready", func() (bool, error) {
		pods, err := webPods(ctx, cs, ns)
		if err != nil {
			return false, err
		}
		ready := 0
		for _, p := range pods {
			if p.Name == victim {
				return false, nil
			}
			if p.Spec.NodeName != "" && podReady(&p) {
				ready++
			}
		}
		return ready == 3, nil
	})
	step("replacement bound and ready", start)
	waitFor("PDB disruptionsAllowed 1 again", func() (bool, error) {
		p, err := cs.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "web", metav1.GetOptions{})
		return err == nil && p.Status.DisruptionsAllowed == 1, err
	})
	step("PDB allows 1 disruption again", start)

	// A gated pod is not placed; while gated it takes a required node affinity (a scheduling
	// directive may be added to a gated pod); ungated, it lands on that node.
	start = time.Now()
	gated := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gated", Namespace: ns},
		Spec: corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: "edgeflow.io/placement"}},
			Containers: []corev1.Container{{Name: "app", Image: "app",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}}}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, gated, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("gated pod reported SchedulingGated", func() (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "gated", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonSchedulingGated {
				return true, nil
			}
		}
		return false, nil
	})
	step("gated pod has PodScheduled=False SchedulingGated", start)
	time.Sleep(time.Second)
	p, err := cs.CoreV1().Pods(ns).Get(ctx, "gated", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" {
		t.Fatalf("gated pod bound to %s", p.Spec.NodeName)
	}
	const target = "n1" // the smallest node: not where the scheduler's scoring would put it
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{target}}}}}}}}
	if p, err = cs.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setting node affinity on the gated pod: %v", err)
	}
	step("node affinity set while gated", start)
	ungate := time.Now()
	p.Spec.SchedulingGates = nil
	if _, err = cs.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("removing the gate: %v", err)
	}
	waitFor("ungated pod bound and ready", func() (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "gated", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName != "" && podReady(p), err
	})
	step("ungated pod bound and ready", ungate)
	if p, err = cs.CoreV1().Pods(ns).Get(ctx, "gated", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if p.Spec.NodeName != target {
		t.Fatalf("ungated pod on %s, want %s", p.Spec.NodeName, target)
	}

	// The nodes stay Ready and untainted (the FakeKubelet renews their Leases).
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if len(n.Spec.Taints) > 0 {
			t.Errorf("node %s tainted: %v", n.Name, n.Spec.Taints)
		}
		l, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil || time.Since(l.Spec.RenewTime.Time) > time.Minute {
			t.Errorf("node %s: no fresh Lease in %s (%v)", n.Name, corev1.NamespaceNodeLease, err)
		}
	}
	// Stop ends every goroutine of the FakeKubelet (its informers, worker and heartbeat);
	// the clientset's HTTP/2 connection is the cluster's and outlives it.
	fk.Stop()
	goleak.VerifyNone(t, leaks, goleak.IgnoreAnyFunction("net/http.(*http2ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"), goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"))
	step("whole test", begin)
}

func webPods(ctx context.Context, cs kubernetes.Interface, ns string) ([]corev1.Pod, error) {
	l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
