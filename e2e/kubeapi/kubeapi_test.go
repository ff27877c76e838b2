package kubeapi

import (
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeflow/edgeflow/internal/testkit"
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

// At most n boots hold a slot at once: with both of 2 slots held, a third waits until one is
// given back, then takes it.
func TestBootSlots(t *testing.T) {
	dir := t.TempDir()
	r1, err := acquireBootSlot(t, dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := acquireBootSlot(t, dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan func(), 1)
	go func() {
		r3, err := acquireBootSlot(t, dir, 2)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- r3
	}()
	select {
	case <-got:
		t.Fatal("a third boot took a slot while both were held")
	case <-time.After(300 * time.Millisecond):
	}
	r1()
	select {
	case r3, ok := <-got:
		if ok {
			r3()
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a slot given back was not taken within 10 s")
	}
	r2()
}

// A port taken between its pick and its bind costs a boot, not the test: etcd's client port
// taken, then kube-apiserver's, and the third boot comes up.
func TestStartOnTakenPorts(t *testing.T) {
	taken := testkit.Listen(t)
	port := taken.Addr().(*net.TCPAddr).Port
	boots := 0
	pickPorts = func(n int) ([]int, error) {
		ports, err := freePorts(n)
		if err == nil && boots < 2 {
			ports[[]int{0, 2}[boots]] = port // etcd's client port, then the apiserver's
		}
		boots++
		return ports, err
	}
	t.Cleanup(func() { pickPorts = freePorts })
	c := Start(t, Options{})
	if boots != 3 {
		t.Errorf("%d boots, want 3", boots)
	}
	if _, err := c.Client.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
}
