package server

import (
	"context"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// Pod "x.shop" in default and pod "x" in shop would share the key "x.shop": a sidecar of the
// first must not claim the second (its identity under mTLS, its weights).
func TestDottedDefaultPodClaimsNoOtherPod(t *testing.T) {
	t.Parallel()
	if pod, ip, ok := xds.ParseSidecarID("sidecar~10.0.0.9~x.shop.default~default.svc.cluster.local"); !ok || pod != "" || ip != "10.0.0.9" {
		t.Errorf("ParseSidecarID of a dotted default-namespace pod = %q, %q, %v; want no pod, the IP", pod, ip, ok)
	}
	srv, err := New(Config{DebounceQuiet: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	srv.Update(&optimizer.Topology{
		Nodes: []optimizer.Node{{Name: "n1"}},
		Services: []optimizer.Service{{Name: "a", Namespace: "shop", Ports: []optimizer.Port{{Name: "http", Port: 80}},
			Pods: []optimizer.Pod{{Name: "x", Node: "n1", IP: "10.0.1.1", ServiceAccount: "sa-x"}}}},
	})
	testkit.Eventually(t, 10*time.Second, "the first publication", func() bool { return srv.Published() > 0 })
	if id, pod, ok := srv.ClaimedIdentity("sidecar~10.0.1.1~x.shop~shop.svc.cluster.local"); !ok || pod != "x.shop" || id.ServiceAccount != "sa-x" {
		t.Errorf("the real pod's sidecar claims %q %+v %v, want x.shop as sa-x", pod, id, ok)
	}
	if id, pod, ok := srv.ClaimedIdentity("sidecar~10.0.0.9~x.shop.default~default.svc.cluster.local"); ok || pod != "" {
		t.Errorf("pod x.shop of default claims %q (%+v): another namespace's pod", pod, id)
	}
}
