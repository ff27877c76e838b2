package server

import (
	"context"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// cachedCount returns how many resources of typeURL the cache holds for the node, and their
// version.
func cachedCount(t testing.TB, h *harness, id, typeURL string) (int, string) {
	t.Helper()
	snap, err := h.srv.cached(id)
	if err != nil {
		t.Fatal(err)
	}
	return len(snap.GetResources(typeURL)), snap.GetVersion(typeURL)
}

// withW is two(15) plus a service w that nobody calls: every node gets a new Listener, route,
// Cluster and assignment.
func withW() *optimizer.Topology {
	top := two(15)
	top.Services = append(top.Services, optimizer.Service{Name: "w", Pods: []optimizer.Pod{{Name: "w-0", Node: "n1", Address: "127.0.0.1:4001"}}})
	return top
}

// TestNACKAfterUnknownVersionNeverEmpties is the regression test for a client that names a
// version this server never sent (a restarted server's, or garbage) and then NACKs the push:
// it has ACKed nothing here, and the node has no earlier set, so the only safe answer is to
// keep what the cache holds. Answering with version "" and no resources would delete every
// listener or cluster on the client.
func TestNACKAfterUnknownVersionNeverEmpties(t *testing.T) {
	t.Parallel()
	// What an earlier server sent for a topology with a service z this one never sees.
	other := two(5)
	other.Services = append(other.Services, optimizer.Service{Name: "z", Pods: []optimizer.Pod{{Name: "z-0", Node: "n1", Address: "127.0.0.1:5001"}}})
	elsewhere, err := xds.Translate(other, plan(t, other, optimizer.Localization), xds.EncodingLocality)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, held string }{
		{"garbage", "garbage"},
		{"another server's version", elsewhere.Pods["x-0"].Sets[xds.ListenerSet].Version},
		{"nothing", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
			h.srv.Update(two(5))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := h.srv.WaitPublished(ctx, 1); err != nil {
				t.Fatal(err)
			}
			c := dialADS(t, h.addr, "x-0")
			types := []string{resource.ListenerType, resource.ClusterType}
			for _, typ := range types {
				c.subscribeAt(typ, tc.held, "y", "v")
			}
			for range types {
				r := c.next()
				if len(r.GetResources()) == 0 {
					t.Fatalf("first %s response is empty", r.GetTypeUrl())
				}
				c.nack(r, tc.held)
			}
			testkit.Eventually(t, 5*time.Second, "both NACKs handled", func() bool {
				return counter(t, h.srv.m.nacks.WithLabelValues("lds")) == 1 && counter(t, h.srv.m.nacks.WithLabelValues("cds")) == 1
			})
			for _, typ := range types {
				if n, v := cachedCount(t, h, "x-0", typ); n != 2 {
					t.Errorf("after the NACK the cache holds %d %s resources (version %q), want the 2 it had", n, typ, v)
				}
			}

			// The next thing on the wire is the next publication, not an empty answer: a new
			// service w reaches the client, its cluster before the listener that names it.
			h.srv.Update(withW())
			r := c.next()
			if r.GetTypeUrl() != resource.ClusterType || len(r.GetResources()) != 2 || r.GetVersionInfo() == "" {
				t.Fatalf("after the NACK the client got %s version %q with %d resources, want the new CDS", r.GetTypeUrl(), r.GetVersionInfo(), len(r.GetResources()))
			}
			c.ack(r)
			if r = c.next(); r.GetTypeUrl() != resource.ListenerType || len(r.GetResources()) != 2 {
				t.Fatalf("then %s with %d resources, want the new LDS", r.GetTypeUrl(), len(r.GetResources()))
			}
			c.ack(r)
			if err := h.srv.WaitConverged(ctx, 2); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestNACKFallsBackToPreviousSet: a node that never ACKed anything here NACKs a push; the set
// it had before the rejected one is what it gets back, never an empty one.
func TestNACKFallsBackToPreviousSet(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	h.srv.Update(two(5))
	c := dialADS(t, h.addr, "x-0")
	c.subscribeAt(resource.ListenerType, "garbage")
	v1 := c.next()
	c.nack(v1, "garbage") // nothing to fall back to: the cache keeps v1's listeners
	testkit.Eventually(t, 5*time.Second, "first NACK handled", func() bool { return counter(t, h.srv.m.nacks.WithLabelValues("lds")) == 1 })

	h.srv.Update(withW())
	v2 := c.next()
	if v2.GetVersionInfo() == v1.GetVersionInfo() || len(v2.GetResources()) != 3 {
		t.Fatalf("v2 = %q with %d listeners, want a new version with 3 (y, v, w)", v2.GetVersionInfo(), len(v2.GetResources()))
	}
	c.nack(v2, "garbage")
	back := c.next()
	if back.GetVersionInfo() != v1.GetVersionInfo() || len(back.GetResources()) != len(v1.GetResources()) {
		t.Fatalf("after rejecting v2 the client got version %q with %d listeners, want v1 %q with %d",
			back.GetVersionInfo(), len(back.GetResources()), v1.GetVersionInfo(), len(v1.GetResources()))
	}
	c.ack(back)
}
