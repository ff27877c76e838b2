package xds

import (
	"slices"
	"strings"
	"testing"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/edgeflow/edgeflow/optimizer"
)

// TestEgressPortOffset: with an offset plain Envoy nodes' listeners bind 127.0.0.1:PORT+offset
// and are named after it, their routes (still named PORT) also match NAME:PORT+offset, and
// everything passes Envoy's rules; offset 0 is what it always was.
func TestEgressPortOffset(t *testing.T) {
	top := loadTopology(t, "testdata/bookinfo.yaml")
	alloc := bookinfoAllocation(t, top)
	for _, tc := range []struct {
		offset int
		bind   uint32
	}{{0, 9080}, {10000, 19080}} {
		tr, err := TranslateWith(top, alloc, TranslateConfig{EgressPortOffset: tc.offset})
		if err != nil {
			t.Fatal(err)
		}
		n := tr.Resources("reviews-1", Envoy)
		if err := CheckEnvoy(n); err != nil {
			t.Errorf("offset %d: %v", tc.offset, err)
		}
		ls := typed[*listener.Listener](n.Sets[ListenerSet])
		i := slices.IndexFunc(ls, func(l *listener.Listener) bool { return l.GetName() == ListenerName(tc.bind) })
		if len(ls) != 2 || i < 0 {
			t.Fatalf("offset %d: %d listeners, want two (ports 9080 and 9090), one named %s", tc.offset, len(ls), ListenerName(tc.bind))
		}
		if sa := ls[i].GetAddress().GetSocketAddress(); sa.GetPortValue() != tc.bind || sa.GetAddress() != EnvoyListenerAddress {
			t.Errorf("offset %d: listener %s binds %s:%d, want %s:%d", tc.offset, ls[i].GetName(), sa.GetAddress(), sa.GetPortValue(), EnvoyListenerAddress, tc.bind)
		}
		if got := RDSNames(ls[i : i+1]); !slices.Equal(got, []string{"9080"}) {
			t.Errorf("offset %d: the listener takes routes %v, want [9080]", tc.offset, got)
		}
		rcs := typed[*route.RouteConfiguration](n.Sets[RouteSet])
		rcs = slices.DeleteFunc(rcs, func(rc *route.RouteConfiguration) bool { return rc.GetName() != "9080" })
		var ratings *route.VirtualHost
		for _, vh := range rcs[0].GetVirtualHosts() {
			if strings.HasPrefix(vh.GetName(), "ratings.") {
				ratings = vh
			}
		}
		hasShifted := slices.Contains(ratings.GetDomains(), "ratings:19080")
		if hasShifted != (tc.offset != 0) || !slices.Contains(ratings.GetDomains(), "ratings:9080") || !slices.Contains(ratings.GetDomains(), "ratings") {
			t.Errorf("offset %d: ratings' domains %v", tc.offset, ratings.GetDomains())
		}
	}
}

func TestEgressPortOffsetLimits(t *testing.T) {
	for _, off := range []int{-1, MaxEgressPortOffset + 1} {
		if _, err := TranslateWith(small(), smallAlloc(), TranslateConfig{EgressPortOffset: off}); err == nil || !strings.Contains(err.Error(), "egress port offset") {
			t.Errorf("offset %d: %v, want an out-of-range error", off, err)
		}
	}
	top := small()
	top.Services[1].Ports = []optimizer.Port{{Port: 60000, TargetPort: 1001}}
	tr, err := TranslateWith(top, smallAlloc(), TranslateConfig{EgressPortOffset: 6000})
	if err != nil {
		t.Fatal(err)
	}
	if n := tr.Resources("a-0", Envoy); len(n.Sets[ListenerSet].Items) != 0 {
		t.Errorf("a listener past port 65535: %v", n.Sets[ListenerSet].Items)
	}
	if !slices.ContainsFunc(tr.Skipped, func(s string) bool { return strings.Contains(s, "past 65535") }) {
		t.Errorf("Skipped %q: want the shifted port named", tr.Skipped)
	}
}
