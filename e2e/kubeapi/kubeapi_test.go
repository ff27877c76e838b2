package kubeapi

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The control plane starts, serves the API and stops: the ground every live test stands on.
func TestStartStop(t *testing.T) {
	c := Start(t, Options{})
	ctx := Context(t)
	v, err := c.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver %s", v.GitVersion)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Namespaces().Get(ctx, "probe", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}
