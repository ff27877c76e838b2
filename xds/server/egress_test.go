package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/xds"
)

// TestEnvoyClientEgressPortOffset: with Config.EgressPortOffset an Envoy node's listeners
// bind 127.0.0.1:PORT+offset, named after it, and the Envoy-like client (Envoy's rules)
// accepts them.
func TestEnvoyClientEgressPortOffset(t *testing.T) {
	t.Parallel()
	c := bookinfoEnvoy(t, Config{EgressPortOffset: 10000})
	c.waitFor(t, "listeners on the shifted ports", func(s envoyState) error {
		var got []string
		for _, l := range s.listeners {
			got = append(got, fmt.Sprintf("%s@%s:%d", l.GetName(), l.GetAddress().GetSocketAddress().GetAddress(), l.GetAddress().GetSocketAddress().GetPortValue()))
		}
		want := []string{xds.ListenerName(19080) + "@127.0.0.1:19080", xds.ListenerName(19090) + "@127.0.0.1:19090"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("listeners %v, want %v", got, want)
		}
		return nil
	})
}

func TestEgressPortOffsetRejected(t *testing.T) {
	if _, err := New(Config{EgressPortOffset: -1}); err == nil || !strings.Contains(err.Error(), "egress port offset -1") {
		t.Errorf("New(egress port offset -1): %v, want the offset named", err)
	}
}

// bookinfoEnvoy serves the Bookinfo topology with cfg (pushes not debounced) and returns an
// Envoy-like client of node productpage-0 once the first plan is published.
func bookinfoEnvoy(t *testing.T, cfg Config) *envoyClient {
	t.Helper()
	cfg.DebounceQuiet = -1
	h := startServer(t, cfg)
	h.srv.Update(loadTopology(t, bookinfoPath))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.srv.WaitPublished(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return dialEnvoy(t, h.addr, "productpage-0")
}
