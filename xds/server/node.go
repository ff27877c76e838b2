package server

import (
	"context"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"k8s.io/utils/clock"

	"github.com/edgeflow/edgeflow/xds"
)

// nodeState is one xDS node id with open streams: where its publication wants it (target),
// what the cache holds for it (sets), and what its streams hold. Fields below mu are guarded
// by mu; streams by Server.nodesMu.
type nodeState struct {
	id      string       // the node id its client sent
	key     string       // id and owner: the key of s.nodes and of the snapshot cache (cacheNode.Id)
	kind    xds.NodeKind // classified from the node of its first stream
	streams int32
	// cacheNode stands for the client's node in every request handed to go-control-plane:
	// it carries key as its id, so the snapshot cache keys the node by id and owner, and
	// keeps no copy of the client's metadata.
	cacheNode *core.Node
	uris      []string // the identities its connection's certificate proves (RequireIdentity)

	mu     sync.Mutex
	pub    *publication          // the publication target was built from
	pod    string                // the pod the id resolved to ("" = round-robin default)
	target *[xds.NumSets]xds.Set // the publication's sets for the node (shared): where its steps lead
	sets   [xds.NumSets]xds.Set  // what the cache holds for the node
	// relabeled marks a set kept after a NACK under the version its client named (no
	// fallback existed): not interned, not remembered.
	relabeled [xds.NumSets]bool
	closed    bool                   // the node's last stream closed (next to relabeled: one word for both)
	served    bool                   // the node has been given its sets (SOTW watches wait until then)
	snap      *nodeSnapshot          // the snapshot last set in the snapshot cache, while the node has delta streams
	writes    [xds.NumSets]uint64    // sets written so far, per type
	history   [xds.NumSets][]sentSet // sets written, oldest first (see rememberLocked)
	acked     [xds.NumSets]xds.Set   // the set a stream of the node last ACKed, per type
	rejected  *[xds.NumSets]string   // the version last NACKed, per type: never set again (nil until a NACK)
	live      []*streamState         // streams that sent a request, in arrival order
	deltas    int                    // how many of live are delta streams
	awaitPub  *publication           // the publication waiting for this node's answers
	revoked   error                  // its claim no longer holds (RequireIdentity): served nothing more
	nackLog   [xds.NumSets]string    // the version whose NACK was last logged, per type

	// Removal grace (grace.go): clusters no route names any more, by the time they may
	// leave, and the timer that advances the node then.
	leaving    map[string]time.Time
	graceAt    time.Time
	graceTimer clock.Timer
}

// rejectedVersion is the version of type i the node's clients last NACKed ("" = none).
func (n *nodeState) rejectedVersion(i int) string {
	if n.rejected == nil {
		return ""
	}
	return n.rejected[i]
}

// sentSet is a set the node was given, with its write number.
type sentSet struct {
	set xds.Set
	seq uint64
}

// historyLen is how many past sets per type a node remembers at least, so that an ACK or
// NACK naming a version that a newer push already replaced still finds that version's
// resources; maxHistory is how many it remembers at most, when a stream that does not answer
// holds sets back.
const (
	historyLen = 4
	maxHistory = 64
)

// maxPending is how many unanswered responses a delta stream remembers.
const maxPending = 16

// rememberLocked records the sets just written, keeping the last historyLen per type and every
// later one that may still be sent to a stream (written since its last request or response).
// n.mu is held.
func (n *nodeState) rememberLocked(before [xds.NumSets]xds.Set) {
	for i, set := range n.sets {
		if set.Version == before[i].Version {
			continue
		}
		n.writes[i]++
		if n.relabeled[i] {
			continue
		}
		h := n.history[i]
		if len(h) == cap(h) && len(h) > 0 && len(h) <= historyLen {
			// A type written more than once is usually written again: room for historyLen
			// and the newest at once, instead of growing by doubling past it.
			h = append(make([]sentSet, 0, historyLen+1), h...)
		}
		h = append(h, sentSet{set: set, seq: n.writes[i]})
		oldest := n.writes[i]
		for _, st := range n.live {
			if st.sub[i].started {
				oldest = min(oldest, st.since[i])
			}
		}
		drop := 0
		for drop < len(h)-historyLen && (h[drop].seq < oldest || len(h)-drop > maxHistory) {
			drop++
		}
		if drop > 0 {
			h = append(h[:0], h[drop:]...)
		}
		n.history[i] = h
	}
}

// lookup returns the set of type i with the given version that the node was given. A set
// kept under a client's own version is not found: what that client holds is unknown.
func (n *nodeState) lookup(i int, version string) (xds.Set, bool) {
	if version == "" {
		return xds.Set{}, true
	}
	if n.sets[i].Version == version && !n.relabeled[i] {
		return n.sets[i], true
	}
	for j := len(n.history[i]) - 1; j >= 0; j-- {
		if p := n.history[i][j]; p.set.Version == version {
			return p.set, true
		}
	}
	return xds.Set{}, false
}

// find is lookup that also knows the sets sent to st.
func (n *nodeState) find(st *streamState, i int, version string) (xds.Set, bool) {
	switch {
	case version == "":
		return xds.Set{}, true
	case st.sotw != nil && st.sotw.sent[i].Version == version:
		return st.sotw.sent[i], true
	case st.acked[i].Version == version:
		return st.acked[i], true
	}
	if st.delta != nil {
		for _, p := range st.delta.pending {
			if p.typ == i && p.set.Version == version {
				return p.set, true
			}
		}
	}
	return n.lookup(i, version)
}

// refreshLocked points n at pub. When the node's target changes it moves towards it (see
// advanceLocked); when fromPublication, pub waits for the node's answers. n.mu is held. It
// reports whether the snapshot changed.
func (s *Server) refreshLocked(n *nodeState, pub *publication, fromPublication bool) bool {
	if n.closed || n.revoked != nil || (n.pub != nil && n.pub.num > pub.num) {
		return false
	}
	if s.cfg.RequireIdentity {
		if err := s.checkClaim(n.uris, n.id, pub); err != nil {
			s.revokeLocked(n, err)
			return false
		}
	}
	res, pod := pub.resourcesFor(n.id, n.kind)
	if n.pub == nil && pod == "" {
		s.log.Info("xds: node id matches no pod, serving round-robin", "node", clip(n.id))
	}
	first := n.pub == nil
	n.pub, n.pod = pub, pod
	if !first && sameVersions(res.Sets, *n.target) {
		return false
	}
	n.target = &res.Sets
	if fromPublication {
		if n.awaitPub != nil && n.awaitPub != pub {
			s.settleLocked(n) // superseded: the old publication no longer waits for this node
		}
		if n.awaitPub == nil {
			pub.pending.Add(1)
			n.awaitPub = pub
		}
	}
	before := n.sets
	s.advanceLocked(n)
	return !sameVersions(before, n.sets)
}

func sameVersions(a, b [xds.NumSets]xds.Set) bool {
	for i := range a {
		if a[i].Version != b[i].Version {
			return false
		}
	}
	return true
}

// maxSteps bounds the steps one event takes a node through without waiting for an answer.
const maxSteps = 4

// advanceLocked sets the node's next safe step (nextLocked) while one differs from what the
// cache holds and no stream has an answer outstanding; when nothing is left to do and nothing
// is awaited, the node's publication stops waiting for it. n.mu is held.
func (s *Server) advanceLocked(n *nodeState) {
	if n.closed || n.pub == nil || n.revoked != nil {
		return
	}
	for range maxSteps {
		next := s.nextLocked(n)
		if sameVersions(next, n.sets) {
			break
		}
		s.writeLocked(n, next, n.awaitPub != nil)
		if n.waiting() {
			return
		}
	}
	if !n.waiting() {
		s.settleLocked(n)
	}
}

// writeLocked sets next in the cache. Every stream subscribed to a changed type must answer
// it, unless it already holds it; when counted, the changed types are counted as pushes.
func (s *Server) writeLocked(n *nodeState, next [xds.NumSets]xds.Set, counted bool) {
	if !sameVersions(next, *n.target) {
		s.m.steps.Inc()
	}
	before := n.sets
	n.sets = next
	for i := range next {
		if next[i].Version != before[i].Version {
			n.relabeled[i] = false
		}
	}
	s.setSnapshotLocked(n, before)
	for i := range next {
		if next[i].Version == before[i].Version {
			continue
		}
		subscribed := false
		for _, st := range n.live {
			if !st.sub[i].started {
				continue
			}
			subscribed = true
			st.awaiting[i] = next[i].Version
			s.checkHeldLocked(n, st, i)
		}
		if counted && subscribed {
			s.m.pushes.WithLabelValues(xds.SetNames[i]).Inc()
		}
	}
}

// revokeLocked closes every stream of n, whose claim no longer holds, with err, and serves it
// nothing more: each stream's next response is err (a SOTW stream's open watch, a delta
// stream's response channel), and so is its next request. n.mu is held.
func (s *Server) revokeLocked(n *nodeState, err error) {
	n.revoked = err
	s.m.refused.WithLabelValues("identity").Inc()
	for _, st := range n.live {
		k := &kickResponse{err: err}
		if st.sotw != nil {
			for i, ch := range st.sotw.watch {
				if ch == nil {
					continue
				}
				st.sotw.watch[i], st.sotw.watchVersion[i] = nil, ""
				k.typ = i
				select {
				case ch <- k: // a watch's channel has room for its one answer
				default:
				}
				break
			}
		} else if st.delta.ch != nil {
			select {
			case st.delta.ch <- k:
			default: // full: the responses queued go first, then the next request is refused
			}
		}
	}
	s.settleLocked(n)
}

// kickResponse ends the stream it is sent on with err: go-control-plane ends a stream whose
// response fails to build with that error (its ordered-ADS mode, which edgeflow does not use,
// would turn it into Unavailable).
type kickResponse struct {
	err error
	typ int
}

func (k *kickResponse) GetDiscoveryResponse() (*discovery.DiscoveryResponse, error) {
	return nil, k.err
}
func (k *kickResponse) GetRequest() *discovery.DiscoveryRequest { return typeRequests[k.typ] }
func (k *kickResponse) GetVersion() (string, error)             { return "", k.err }
func (k *kickResponse) GetResponseVersion() string              { return "" }
func (k *kickResponse) GetReturnedResources() map[string]string { return nil }
func (k *kickResponse) GetContext() context.Context             { return context.Background() }
func (k *kickResponse) GetDeltaDiscoveryResponse() (*discovery.DeltaDiscoveryResponse, error) {
	return nil, k.err
}
func (k *kickResponse) GetDeltaRequest() *discovery.DeltaDiscoveryRequest {
	return &discovery.DeltaDiscoveryRequest{TypeUrl: typeURLs[k.typ]}
}
func (k *kickResponse) GetSystemVersion() (string, error)    { return "", k.err }
func (k *kickResponse) GetNextVersionMap() map[string]string { return nil }

var (
	_ cache.Response      = (*kickResponse)(nil)
	_ cache.DeltaResponse = (*kickResponse)(nil)
)

// settleLocked stops n's publication from waiting for it and drops the reference, so an old
// publication is not kept alive by a node that is never pushed again. n.mu is held.
func (s *Server) settleLocked(n *nodeState) {
	if n.awaitPub == nil {
		return
	}
	s.answered(n.awaitPub)
	n.awaitPub = nil
}

// waiting reports whether a stream of n has an answer outstanding.
func (n *nodeState) waiting() bool {
	for _, st := range n.live {
		for _, v := range st.awaiting {
			if v != "" {
				return true
			}
		}
	}
	return false
}

// setSnapshotLocked makes n.sets what the node is served and answers its SOTW watches; before
// is what it was served. A node with delta streams also gets the sets as a snapshot in the
// snapshot cache, which serves those streams. n.mu is held.
func (s *Server) setSnapshotLocked(n *nodeState, before [xds.NumSets]xds.Set) {
	n.rememberLocked(before)
	n.served = true
	if n.deltas == 0 {
		if n.snap != nil {
			n.snap = nil
			s.cacheFor(n.key).ClearSnapshot(n.key)
		}
		s.respondSOTWLocked(n)
		return
	}
	snap := &nodeSnapshot{}
	for i, set := range n.sets {
		interned := !n.relabeled[i] && (set.Version != "" || len(set.Items) == 0)
		if interned {
			snap.res[i] = n.pub.intern(i, set)
		} else {
			snap.res[i] = cache.NewResources(set.Version, set.Items)
		}
		// Delta streams compare per-resource versions; computed before the cache has the
		// snapshot, so the cache and the server only ever read them, and shared by the nodes
		// that hold the same interned set.
		vm, err := n.pub.versions(i, snap.res[i], interned)
		if err != nil {
			s.log.Error("xds: resource versions", "node", clip(n.id), "type", xds.SetNames[i], "error", err)
		}
		snap.vm[i] = vm
	}
	n.snap = snap
	if err := s.cacheFor(n.key).SetSnapshot(context.Background(), n.key, snap); err != nil {
		s.log.Error("xds: setting snapshot", "node", clip(n.id), "error", err)
	}
	s.respondSOTWLocked(n)
}

// nodeSnapshot is a node's sets as the snapshot cache reads them (cache.ResourceSnapshot) for
// its delta streams: the publication's resources and per-resource versions, shared with every
// node that holds the same set, instead of a cache.Snapshot and a version map per node.
type nodeSnapshot struct {
	res [xds.NumSets]cache.Resources
	vm  [xds.NumSets]map[string]string
}

var _ cache.ResourceSnapshot = (*nodeSnapshot)(nil)

func (s *nodeSnapshot) GetVersion(typeURL string) string {
	if i := setIndex(typeURL); i >= 0 {
		return s.res[i].Version
	}
	return ""
}

func (s *nodeSnapshot) GetResourcesAndTTL(typeURL string) map[string]types.ResourceWithTTL {
	if i := setIndex(typeURL); i >= 0 {
		return s.res[i].Items
	}
	return nil
}

func (s *nodeSnapshot) GetResources(typeURL string) map[string]types.Resource {
	items := s.GetResourcesAndTTL(typeURL)
	if items == nil {
		return nil
	}
	out := make(map[string]types.Resource, len(items))
	for name, r := range items {
		out[name] = r.Resource
	}
	return out
}

// ConstructVersionMap does nothing: the versions are computed when the snapshot is made.
func (s *nodeSnapshot) ConstructVersionMap() error { return nil }

func (s *nodeSnapshot) GetVersionMap(typeURL string) map[string]string {
	if i := setIndex(typeURL); i >= 0 {
		return s.vm[i]
	}
	return nil
}

// versionMap returns go-control-plane's per-resource versions of the cached set of type i
// (computed only for nodes with delta streams).
func (n *nodeState) versionMap(i int) map[string]string {
	if n.snap == nil {
		return nil
	}
	return n.snap.vm[i]
}

// checkHeldLocked stops st from being awaited for type i when nothing of that type is on the
// way to it and it already holds what the cache has: a SOTW client whose last request named
// that version, a delta client holding every subscribed resource at its cached version (the
// cache sends a delta stream nothing when none of its resources changed). n.mu is held.
func (s *Server) checkHeldLocked(n *nodeState, st *streamState, i int) {
	if st.awaiting[i] == "" || st.awaiting[i] != n.sets[i].Version {
		return
	}
	if !st.key.delta {
		if (st.sotw.nonce[i] == 0 || st.sotw.answered[i]) && st.acked[i].Version == n.sets[i].Version {
			st.awaiting[i] = ""
		}
		return
	}
	for _, p := range st.delta.pending {
		if p.typ == i {
			return
		}
	}
	vm := n.versionMap(i)
	if vm == nil && len(n.sets[i].Items) > 0 {
		return
	}
	sub, held := &st.sub[i], st.delta.held[i]
	for name, v := range vm {
		if h, _ := held.get(name); sub.has(name) && h.version != v {
			return
		}
	}
	for _, e := range held {
		if _, ok := vm[e.name]; !ok && sub.has(e.name) {
			return
		}
	}
	st.awaiting[i] = ""
}

// nackLocked handles a client's rejection of version of set i: count, log, and, when the cache
// still holds that version, set the node back to the best set it has that is not empty: the
// set the node last ACKed, else the set it had before the rejected one, else (SOTW) the
// rejected resources under the version the client says it holds, so the cache neither
// resends the rejected version in a loop nor answers with nothing. A delta client is sent
// nothing more in that last case: the cache sends delta streams only changed resources.
// Publications that produce the rejected version again keep the fallback. n.mu is held.
func (s *Server) nackLocked(n *nodeState, st *streamState, i int, version, holds, message string) {
	s.m.nacks.WithLabelValues(xds.SetNames[i]).Inc()
	logIt := n.nackLog[i] != version || version == ""
	n.nackLog[i] = version // each version's NACK is logged once per node
	if n.closed || version != n.sets[i].Version || n.pub == nil || version == "" {
		if logIt {
			s.log.Warn("xds: client rejected a response", "node", clip(n.id), "type", xds.SetNames[i], "version", version,
				"kept", n.sets[i].Version, "error", clip(message))
		}
		return
	}
	if n.rejected == nil {
		n.rejected = new([xds.NumSets]string)
	}
	n.rejected[i] = version
	fallback, kind := n.fallback(i, version)
	if kind == "" {
		if st.key.delta || holds == version {
			kind = "kept"
			fallback = n.sets[i]
		} else {
			kind = "kept-relabeled"
			fallback = xds.Set{Version: holds, Items: n.sets[i].Items}
		}
	}
	s.m.fallbacks.WithLabelValues(kind).Inc()
	if logIt {
		s.log.Warn("xds: client rejected a response", "node", clip(n.id), "type", xds.SetNames[i], "version", version,
			"fallback", kind, "kept", fallback.Version, "error", clip(message))
	}
	if fallback.Version == n.sets[i].Version {
		return
	}
	before := n.sets
	n.sets[i] = fallback
	n.relabeled[i] = kind == "kept-relabeled"
	s.setSnapshotLocked(n, before)
	for _, x := range n.live {
		if x.awaiting[i] != "" && x != st { // it now gets the fallback instead
			x.awaiting[i] = fallback.Version
			s.checkHeldLocked(n, x, i)
		}
	}
}

// fallback returns what a node goes back to after rejecting version of type i: the set it
// last ACKed ("acked"), else the newest earlier set it was given ("previous"); kind "" when
// it has neither (empty sets do not count).
func (n *nodeState) fallback(i int, version string) (xds.Set, string) {
	if a := n.acked[i]; a.Version != "" && a.Version != version && len(a.Items) > 0 {
		return a, "acked"
	}
	for j := len(n.history[i]) - 1; j >= 0; j-- {
		if p := n.history[i][j]; p.set.Version != "" && p.set.Version != version && len(p.set.Items) > 0 {
			return p.set, "previous"
		}
	}
	return xds.Set{}, ""
}
