package kubetest

import (
	"context"
	"testing"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
)

// A watch started after a List delivers the objects changed since; changing what it delivered
// (as an informer's transform does) must not change the tracker's object. The plain fake
// fails this (the reason for NewClientset); the copying one passes.
func TestWatchDeliversCopies(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cs     kubernetes.Interface
		shared bool
	}{
		{"fake.NewClientset", fake.NewClientset(), true},
		{"kubetest.NewClientset", NewClientset(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pods := tc.cs.CoreV1().Pods("shop")
			list, err := pods.List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cart-1", Namespace: "shop", Labels: map[string]string{"app": "cart"}}}
			if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			w, err := pods.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			e := <-w.ResultChan()
			got, ok := e.Object.(*corev1.Pod)
			if !ok {
				t.Fatalf("event %v: %T, want a pod", e.Type, e.Object)
			}
			got.Labels["app"] = "trimmed"
			stored, err := pods.Get(ctx, "cart-1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if shared := stored.Labels["app"] == "trimmed"; shared != tc.shared {
				t.Errorf("the tracker's object changed with the watched one: %v, want %v", shared, tc.shared)
			}
		})
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A watch stopped while events wait unread leaves no goroutine behind (TestMain's goleak).
func TestStoppedWatchLeavesNothing(t *testing.T) {
	ctx := context.Background()
	pods := NewClientset().CoreV1().Pods("shop")
	w, err := pods.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cart-1", "cart-2"} {
		if _, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if e := <-w.ResultChan(); e.Type != watch.Added {
		t.Fatalf("first event %v, want Added", e.Type)
	}
	w.Stop() // the second event stays unread: the copying goroutine must return anyway
}
