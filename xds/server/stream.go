package server

import (
	"slices"
	"strconv"
	"strings"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/edgeflow/edgeflow/xds"
)

// streamKey tells SOTW and delta streams apart: go-control-plane numbers each kind from 1.
type streamKey struct {
	delta bool
	id    int64
}

// parseNonce reads a SOTW nonce as go-control-plane writes it (a counter from 1, in decimal):
// "" is 0, and anything it does not write is -1, which equals no nonce it sent.
func parseNonce(s string) int64 {
	if s == "" {
		return 0
	}
	if s[0] < '1' || s[0] > '9' {
		return -1
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// streamState is one xDS stream: what it subscribed to, what its client holds, what it was
// sent and has not answered. Fields are guarded by node.mu.
type streamState struct {
	node *nodeState
	key  streamKey

	sub [xds.NumSets]subscription
	// acked is what the client holds, as far as the server knows: for SOTW the set its
	// latest request names (version_info), for delta the set of the last response it ACKed.
	acked [xds.NumSets]xds.Set
	// since is, per type, the write number from which sets may still reach the client: after
	// a response the cache sends nothing of that type until the next request, which it
	// answers from the set current then or a later one; so a set written before the set
	// current at the stream's last request, or before its last response, is never sent.
	since [xds.NumSets]uint64
	// awaiting is the version of each type the stream must answer before the node's
	// publication converges ("" = none).
	awaiting [xds.NumSets]string
	// foreign: the client holds a set of the type that it got elsewhere, from a server
	// restarted under it: its SOTW request named a version the node cannot resolve, or its
	// delta stream listed resources in initial_resource_versions and has ACKed nothing since.
	foreign [xds.NumSets]bool

	sotw  *sotwStream  // SOTW streams only
	delta *deltaStream // delta streams only
}

// sotwStream is what a SOTW stream was sent, and its watches (guarded by node.mu).
type sotwStream struct {
	// The last response per type (its nonce, 0 = none), whether the client answered it, and
	// what it returned.
	nonce    [xds.NumSets]int64
	sent     [xds.NumSets]xds.Set
	answered [xds.NumSets]bool
	// open: a response of the type was sent since its last accepted request; go-control-plane
	// then ignores a request (stale) unless it names that response's nonce.
	open        [xds.NumSets]bool
	returnedAll [xds.NumSets]bool // see returnedHas
	returned    [xds.NumSets][]string

	// SOTW watches (sotw.go): per type, the open watch's responder (nil = none) and the
	// version its request named; and the request onRequest hands to CreateWatch.
	watch        [xds.NumSets]chan cache.Response
	watchVersion [xds.NumSets]string
	// unchecked: the type's watch was opened before the node was served, so CreateWatch's
	// rule is applied when it is (respondSOTWLocked).
	unchecked [xds.NumSets]bool
	req       *discovery.DiscoveryRequest
}

// deltaStream is what a delta stream's client holds and has not answered (guarded by node.mu).
type deltaStream struct {
	// held is, per type, the resources the client ACKed.
	held [xds.NumSets]heldSet
	// pending is the responses sent and not answered yet, oldest first (nil when none: a
	// stream keeps no array between pushes).
	pending []deltaSent
	// req is the request onDeltaRequest last saw, until CreateDeltaWatch takes its channel:
	// ch, the stream's responses, where revokeLocked leaves the stream's end.
	req *discovery.DeltaDiscoveryRequest
	ch  chan cache.DeltaResponse
}

// heldResource is a resource a delta client holds: its version (go-control-plane's content
// hash) and, when known, the resource.
type heldResource struct {
	version string
	res     types.Resource
}

// heldSet is what a delta client holds of one type, sorted by name. A slice: a stream holds a
// few resources of each type, and a map per stream and type cost more than the rest of the
// stream's state.
type heldSet []heldEntry

type heldEntry struct {
	name string
	heldResource
}

func (h heldSet) search(name string) (int, bool) {
	return slices.BinarySearchFunc(h, name, func(e heldEntry, name string) int { return strings.Compare(e.name, name) })
}

func (h heldSet) get(name string) (heldResource, bool) {
	if j, ok := h.search(name); ok {
		return h[j].heldResource, true
	}
	return heldResource{}, false
}

func (h *heldSet) remove(name string) {
	if j, ok := h.search(name); ok {
		*h = slices.Delete(*h, j, j+1)
	}
}

// putAll puts every entry of es, whose names are distinct (es is sorted in place), in one
// merge: O(n + m log m) for m entries, where putting them one at a time moved n entries each.
func (h *heldSet) putAll(es []heldEntry) {
	if len(es) == 0 {
		return
	}
	slices.SortFunc(es, func(a, b heldEntry) int { return strings.Compare(a.name, b.name) })
	es = slices.CompactFunc(es, func(a, b heldEntry) bool { return a.name == b.name })
	old := *h
	out := make(heldSet, 0, len(old)+len(es))
	a, b := 0, 0
	for a < len(old) || b < len(es) {
		switch {
		case b == len(es) || (a < len(old) && old[a].name < es[b].name):
			out = append(out, old[a])
			a++
		case a == len(old) || es[b].name < old[a].name:
			out = append(out, es[b])
			b++
		default: // same name: the new entry
			out = append(out, es[b])
			a++
			b++
		}
	}
	*h = out
}

// removeAll removes every name of names in one pass: O(n + m log m).
func (h *heldSet) removeAll(names []string) {
	if len(names) == 0 || len(*h) == 0 {
		return
	}
	if len(names) == 1 {
		h.remove(names[0])
		return
	}
	drop := slices.Clone(names)
	slices.Sort(drop)
	*h = slices.DeleteFunc(*h, func(e heldEntry) bool {
		_, found := slices.BinarySearch(drop, e.name)
		return found
	})
}

// deltaSent is a delta response the client has not answered.
type deltaSent struct {
	nonce     int64
	typ       int
	set       xds.Set // the set the response was computed from (SystemVersionInfo)
	resources []heldEntry
	removed   []string
}

// subscription mirrors go-control-plane's view of what a stream asked for (stream.Subscription),
// including the legacy wildcard (a first request without names). The names are a sorted list:
// usually a few, the same list again in every SOTW ACK, and a map per stream and type cost more
// memory than the rest of the stream's state. A SOTW request replaces the list (a new one, so
// a list once handed out is never changed); a delta request edits a copy.
type subscription struct {
	list     []string // sorted, without duplicates and "*"
	started  bool
	legacy   bool
	wildcard bool
}

func (s *subscription) has(name string) bool {
	if s.wildcard {
		return true
	}
	_, found := slices.BinarySearch(s.list, name)
	return found
}

// subscribedNames returns the names subscribed to besides the wildcard, sorted.
func (s *subscription) subscribedNames() []string { return slices.Clone(s.list) }

// setSOTW applies a SOTW request's resource_names (the full list).
func (s *subscription) setSOTW(names []string) {
	if !s.started {
		s.started, s.legacy, s.wildcard = true, true, len(names) == 0
	}
	if s.legacy {
		if len(names) == 0 {
			return
		}
		s.legacy = false
	}
	if !s.wildcard && len(names) == len(s.list) {
		same := true // an ACK repeats the names: nothing to allocate
		for _, r := range names {
			if _, found := slices.BinarySearch(s.list, r); !found {
				same = false
				break
			}
		}
		if same {
			return
		}
	}
	s.wildcard = false
	list := make([]string, 0, len(names))
	for _, r := range names {
		if r == "*" {
			s.wildcard = true
		} else {
			list = append(list, r)
		}
	}
	slices.Sort(list)
	s.list = slices.Clip(slices.Compact(list))
}

// updateDelta applies a delta request's subscribe and unsubscribe lists.
func (s *subscription) updateDelta(subscribe, unsubscribe []string) {
	if !s.started {
		s.started, s.legacy, s.wildcard = true, true, len(subscribe) == 0
	}
	if s.legacy {
		if len(subscribe) == 0 {
			return
		}
		s.legacy = false
	}
	if len(subscribe) == 0 && len(unsubscribe) == 0 {
		return // an ACK: nothing to copy
	}
	list := slices.Clone(s.list) // edited as a whole: a list handed out stays as it was
	for _, r := range subscribe {
		if r == "*" {
			s.wildcard = true
		} else {
			list = append(list, r)
		}
	}
	slices.Sort(list)
	list = slices.Compact(list)
	if len(unsubscribe) > 0 {
		drop := slices.Clone(unsubscribe)
		slices.Sort(drop)
		if _, found := slices.BinarySearch(drop, "*"); found {
			s.wildcard = false
		}
		list = slices.DeleteFunc(list, func(r string) bool {
			_, found := slices.BinarySearch(drop, r)
			return found
		})
	}
	s.list = slices.Clip(list)
}
