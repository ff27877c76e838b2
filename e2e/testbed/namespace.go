package testbed

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"testing"
)

// Namespace is a bare network namespace a test made, with loopback up and the test's
// addresses (from 198.18.0.0/15) on it: a place for pod endpoints that Kubernetes accepts (an
// EndpointSlice may not hold loopback addresses) while all traffic stays inside the namespace.
// The test process reaches it through Listen and DialContext, which open their sockets inside.
type Namespace struct {
	Name string
}

// NewNamespace creates the namespace with cidr (e.g. "198.18.1.0/24") on its loopback, so
// every address of cidr is local there. It is deleted at the test's cleanup. Call RequireRoot
// first.
func NewNamespace(t testing.TB, cidr string) *Namespace {
	t.Helper()
	// A name no other namespace has: `ip netns add` fails on a taken one, so try another.
	n := &Namespace{}
	for attempt := 0; ; attempt++ {
		n.Name = fmt.Sprintf("ef%04x-pods", rand.Uint32()&0xffff)
		err := newNamespace(n.Name)
		if err == nil {
			break
		}
		if !errors.Is(err, errNamespaceExists) || attempt == 20 {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", n.Name).CombinedOutput(); err != nil {
			t.Errorf("testbed: ip netns del %s: %v: %s", n.Name, err, out)
		}
	})
	for _, args := range [][]string{
		{"-n", n.Name, "link", "set", "lo", "up"},
		{"-n", n.Name, "addr", "add", cidr, "dev", "lo"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("testbed: ip %v: %v: %s", args, err, out)
		}
	}
	return n
}

// Listen opens a listener inside the namespace.
func (n *Namespace) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNamespace(n.Name, func() (err error) {
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// DialContext connects from inside the namespace (a grpc.WithContextDialer for pods' traffic).
func (n *Namespace) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNamespace(n.Name, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}
