package live

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/watcher/kube"
)

// TestEndedPodsLeaveTheInformer: the real API server applies the pods' field selector
// (kube.ActivePods) to the shared informers' list and watch: a pod is cached while it runs,
// leaves the cache when it fails (a deletion to the informer), and one created already
// Succeeded is never sent; the running pod next to them stays.
func TestEndedPodsLeaveTheInformer(t *testing.T) {
	t.Parallel()
	w := newWorld(t, worldOptions{kube: true, kubeNodes: []string{"n1"}, services: []string{"api"}})
	c, ctx := w.cluster, w.ctx
	w.pod("api", "api-0", "n1", true)
	w.pod("api", "api-1", "n1", true)

	in, err := kube.NewInformers(kube.InformersConfig{Client: c.Client, Namespaces: []string{ns}})
	must(t, err)
	// The informers end with their context: cancelled before Stop waits for them.
	infCtx, stopInf := context.WithCancel(ctx)
	in.Start(infCtx)
	t.Cleanup(func() { stopInf(); in.Stop() })
	must(t, in.WaitForCacheSync(ctx))
	cached := func(name string) bool {
		_, ok, err := in.Pods[0].Informer.GetStore().GetByKey(ns + "/" + name)
		must(t, err)
		return ok
	}
	testkit.Eventually(t, 10*time.Second, "both running pods cached", func() bool { return cached("api-0") && cached("api-1") })

	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "api-1", metav1.GetOptions{})
	must(t, err)
	p.Status.Phase = corev1.PodFailed
	_, err = c.Client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	must(t, err)
	testkit.Eventually(t, 10*time.Second, "the failed pod gone from the cache", func() bool { return !cached("api-1") })

	done := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "job-0", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "job"}}}}
	done, err = c.Client.CoreV1().Pods(ns).Create(ctx, done, metav1.CreateOptions{})
	must(t, err)
	done.Status.Phase = corev1.PodSucceeded
	_, err = c.Client.CoreV1().Pods(ns).UpdateStatus(ctx, done, metav1.UpdateOptions{})
	must(t, err)
	// A marker created after it: once the marker is cached, the informer has seen every event
	// before it, and the Succeeded pod must be gone (it was sent Pending, then left).
	w.pod("api", "api-2", "n1", true)
	testkit.Eventually(t, 10*time.Second, "the marker pod cached", func() bool { return cached("api-2") })
	if cached("job-0") {
		t.Errorf("the Succeeded pod job-0 is in the cache")
	}
	if !cached("api-0") {
		t.Errorf("the running pod api-0 left the cache")
	}
	// The same list, asked directly: the API server returns only the active pods.
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: kube.ActivePods})
	must(t, err)
	var names []string
	for _, p := range l.Items {
		names = append(names, p.Name)
	}
	t.Logf("active pods per the API server: %v", names)
	if len(names) != 2 {
		t.Errorf("the API server's active pods: %v, want api-0 and api-2", names)
	}
}
