package server

import (
	"fmt"
	"math/rand"
	"sort"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
)

// TestSubscriptionMirrorsGoControlPlane: the server's view of what a stream subscribes to
// agrees with go-control-plane's own (stream.Subscription, legacy wildcard on, as the server
// runs it) over random SOTW and delta request sequences.
func TestSubscriptionMirrorsGoControlPlane(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewSource(1))
	names := func() []string {
		var out []string
		for _, n := range []string{"a", "b", "c", "*"} {
			if r.Intn(3) == 0 {
				out = append(out, n)
			}
		}
		return out
	}
	keys := func(m map[string]struct{}) string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return fmt.Sprint(out)
	}
	ours := func(s *subscription) string { return fmt.Sprint(s.subscribedNames()) }
	for run := range 500 {
		delta := run%2 == 1
		var mine subscription
		var theirs stream.Subscription
		for step := range 6 {
			sub, unsub := names(), names()
			switch {
			case delta && step == 0:
				theirs = stream.NewDeltaSubscription(sub, unsub, nil, true)
			case delta:
				theirs.UpdateResourceSubscriptions(sub, unsub)
			case step == 0:
				theirs = stream.NewSotwSubscription(sub, true)
			default:
				theirs.SetResourceSubscription(sub)
			}
			if delta {
				mine.updateDelta(sub, unsub)
			} else {
				mine.setSOTW(sub)
			}
			if mine.wildcard != theirs.IsWildcard() || ours(&mine) != keys(theirs.SubscribedResources()) {
				t.Fatalf("run %d step %d (delta %v, %v/%v): ours wildcard=%v %s, go-control-plane's wildcard=%v %s",
					run, step, delta, sub, unsub, mine.wildcard, ours(&mine), theirs.IsWildcard(), keys(theirs.SubscribedResources()))
			}
		}
	}
}
