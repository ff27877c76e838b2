package install

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/testkit"
)

// Small edge clusters, on a real control plane (kube-apiserver, kube-scheduler,
// kube-controller-manager; the fake kubelet runs the chart's pods): the chart's Deployment
// becomes available and a rollout (a changed pod template) completes on 1 node and on 2, with
// the defaults and with antiAffinity=required; with replicaCount 1 there is no
// PodDisruptionBudget and the pod can be evicted (kubectl drain). The subtests run one after
// the other, each with its own nodes.
func TestSmallClusters(t *testing.T) {
	t.Parallel()
	c, _ := startAPIServer(t, kubeapi.Options{Scheduler: true, ControllerManager: true})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
	createNamespaces(ctx, t, c.Client, namespace)
	kubeapi.RunFakeKubelet(ctx, t, c.Client, kubeapi.FakeKubeletOptions{Namespaces: []string{namespace}})
	for _, tc := range []struct {
		nodes  int
		values map[string]any
	}{
		{1, nil},
		{2, nil},
		{2, map[string]any{"antiAffinity": "required"}},
		{1, map[string]any{"replicaCount": 1}},
	} {
		t.Run(fmt.Sprintf("%d nodes, values %v", tc.nodes, tc.values), func(t *testing.T) {
			smallCluster(ctx, t, c, tc.nodes, tc.values)
		})
	}
}

// smallCluster creates nodes, the chart's ServiceAccount, Deployment and (if rendered)
// PodDisruptionBudget, and checks that the Deployment becomes available, that a rollout
// completes, and that every pod can be drained the way the PodDisruptionBudget allows.
func smallCluster(ctx context.Context, t *testing.T, c *kubeapi.Cluster, nodes int, values map[string]any) {
	cs := c.Client
	var keep []*unstructured.Unstructured
	for _, o := range render(t, values) {
		if o.GetKind() == "ServiceAccount" && !isHook(o) || o.GetKind() == "Deployment" || o.GetKind() == "PodDisruptionBudget" {
			keep = append(keep, o)
		}
	}
	var dep appsv1.Deployment
	convert(t, find(t, keep, "Deployment", release), &dep)
	replicas := *dep.Spec.Replicas
	var pdb *unstructured.Unstructured
	for _, o := range keep {
		if o.GetKind() == "PodDisruptionBudget" {
			pdb = o
		}
	}
	if (pdb != nil) != (replicas > 1) {
		t.Errorf("%d replicas, a PodDisruptionBudget rendered: %v (want one only with more than one replica)", replicas, pdb != nil)
	}
	names := make([]string, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("small-%d", i+1)
		if _, err := kubeapi.CreateNode(ctx, cs, kubeapi.NodeSpec{Name: names[i]}); err != nil {
			t.Fatal(err)
		}
	}
	cl := newClient(t, c.Config)
	t.Cleanup(func() {
		ctx := context.Background()
		if err := cl.remove(ctx, keep); err != nil {
			t.Errorf("removing the chart: %v", err)
		}
		testkit.Eventually(t, 60*time.Second, "edgeflow's pods gone", func() bool {
			pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
			return err == nil && len(pods.Items) == 0
		})
		for _, n := range names {
			if err := cs.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
				t.Errorf("deleting node %s: %v", n, err)
			}
		}
	})
	if err := cl.create(ctx, keep); err != nil {
		t.Fatal(err)
	}
	rolledOut(ctx, t, c, replicas, "the first rollout")

	patch := fmt.Appendf(nil, `{"spec":{"template":{"metadata":{"annotations":{"edgeflow.io/restarted-at":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := cs.AppsV1().Deployments(namespace).Patch(ctx, release, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	rolledOut(ctx, t, c, replicas, "a rollout of a changed pod template")

	// kubectl drain evicts each pod of a node; the PodDisruptionBudget (if any) must allow one.
	pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=edgeflow"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Fatal("no pod to evict")
	}
	p := pods.Items[0]
	testkit.EventuallyNoError(t, 30*time.Second, "evicting "+p.Name+" (kubectl drain)", func() error {
		err := cs.PolicyV1().Evictions(namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: namespace}})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	testkit.Eventually(t, 30*time.Second, "the evicted pod "+p.Name+" gone", func() bool {
		_, err := cs.CoreV1().Pods(namespace).Get(ctx, p.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	rolledOut(ctx, t, c, replicas, "the replacement of the evicted pod")
}

// rolledOut waits until the Deployment's rollout is complete as kubectl rollout status says:
// the latest generation observed, every replica updated and available, no old one left.
func rolledOut(ctx context.Context, t *testing.T, c *kubeapi.Cluster, replicas int32, what string) {
	t.Helper()
	var last string
	start := time.Now()
	if !testkit.WaitUntil(90*time.Second, func() bool {
		d, err := c.Client.AppsV1().Deployments(namespace).Get(ctx, release, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false
		}
		s := d.Status
		last = fmt.Sprintf("generation %d observed %d, replicas %d updated %d available %d", d.Generation, s.ObservedGeneration, s.Replicas, s.UpdatedReplicas, s.AvailableReplicas)
		return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == replicas && s.Replicas == replicas && s.AvailableReplicas == replicas
	}) {
		pods, _ := c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		var ps []string
		for _, p := range pods.Items {
			ps = append(ps, fmt.Sprintf("%s on %q (%s)", p.Name, p.Spec.NodeName, p.Status.Phase))
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodScheduled && cond.Status != corev1.ConditionTrue {
					ps[len(ps)-1] += ": " + cond.Message
				}
			}
		}
		t.Fatalf("%s did not complete in 90 s: %s; pods: %s", what, last, strings.Join(ps, "; "))
	}
	pods, err := c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=edgeflow"})
	if err != nil {
		t.Fatal(err)
	}
	var on []string
	for _, p := range pods.Items {
		on = append(on, p.Spec.NodeName)
	}
	t.Logf("%s complete in %v, pods on %v", what, time.Since(start).Round(100*time.Millisecond), on)
}
