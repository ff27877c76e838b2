package xds

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	gcpserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/edgeflow/edgeflow/optimizer"
)

// Per-set xDS type URLs, snapshot slots and metric labels, indexed like NodeResources.Sets.
var (
	typeURLs   = [numSets]string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}
	typeSlots  = [numSets]types.ResponseType{types.Listener, types.Route, types.Cluster, types.Endpoint}
	typeLabels = [numSets]string{"lds", "rds", "cds", "eds"}
)

func setIndex(typeURL string) int {
	for i, u := range typeURLs {
		if u == typeURL {
			return i
		}
	}
	return -1
}

// nodeIDHash keys the snapshot cache by the xDS node id exactly as the client sent it. The
// mapping from node id to pod (name, Istio sidecar id, IP) is made by the server per
// publication, not here: a hash that mapped ids to pods would strand a client's open watches
// under the old key whenever the topology changed what its id resolves to.
type nodeIDHash struct{}

func (nodeIDHash) ID(n *core.Node) string { return n.GetId() }

// publication is one published topology and its translation.
type publication struct {
	num      uint64
	topology *optimizer.Topology
	alloc    *optimizer.Allocation
	tr       *Translation
	byIP     map[string]string // address host → pod name; "" when several pods share the host
	changeAt time.Time
	pending  atomic.Int64 // nodes still expected to answer (+1 while nodes are being visited)

	internMu sync.Mutex
	interned map[internKey]*internedSet        // see intern
	wire     map[types.Resource]types.Resource // resource → its wire form (wireForm)

	refs sync.Map // types.Resource (a Listener) → []string, the clusters it names

	idsOnce sync.Once
	ids     map[string]PodIdentity // pod key → identity (identities)
}

func newPublication(num uint64, t *optimizer.Topology, a *optimizer.Allocation, tr *Translation, changeAt time.Time) *publication {
	p := &publication{num: num, topology: t, alloc: a, tr: tr, byIP: map[string]string{}, changeAt: changeAt,
		interned: map[internKey]*internedSet{}, wire: map[types.Resource]types.Resource{}}
	for i := range t.Services {
		s := &t.Services[i]
		for j := range s.Pods {
			pd := &s.Pods[j]
			ap, err := netip.ParseAddrPort(s.Endpoint(pd))
			if err != nil {
				continue
			}
			ip := ap.Addr().Unmap().String()
			if _, dup := p.byIP[ip]; dup {
				p.byIP[ip] = ""
			} else {
				p.byIP[ip] = s.PodKey(pd)
			}
		}
	}
	return p
}

// resourcesFor resolves a node id: a pod name; else an Istio sidecar id by pod, then by IP;
// else the round-robin default. It returns what a node of that kind gets.
func (p *publication) resourcesFor(id string, kind NodeKind) (res *NodeResources, pod string) {
	if _, ok := p.tr.Pods[id]; ok {
		return p.tr.Resources(id, kind), id
	}
	if name, ip, ok := ParseSidecarID(id); ok {
		name = optimizer.QualifiedName(name, sidecarNamespace(id))
		if _, ok := p.tr.Pods[name]; ok {
			return p.tr.Resources(name, kind), name
		}
		if name := p.byIP[ip]; name != "" {
			return p.tr.Resources(name, kind), name
		}
	}
	return p.tr.Resources("", kind), ""
}

// ParseSidecarID splits an Istio sidecar node id "sidecar~IP~POD.NS~NS.svc.cluster.local" into
// the pod name and IP. Pod names may contain dots; the namespace is taken from the last field.
// A dotted pod name in the default namespace is not returned (only the IP): its key would read
// as POD.NAMESPACE, another namespace's pod (optimizer.QualifiedName), and the watcher leaves
// such pods out (kube.SkipAmbiguousName).
func ParseSidecarID(id string) (pod, ip string, ok bool) {
	parts := strings.Split(id, "~")
	if len(parts) != 4 || parts[0] != "sidecar" {
		return "", "", false
	}
	ns, _, _ := strings.Cut(parts[3], ".")
	pod = strings.TrimSuffix(parts[2], "."+ns)
	if ns == optimizer.DefaultNamespace && strings.Contains(pod, ".") {
		pod = ""
	}
	if a, err := netip.ParseAddr(parts[1]); err == nil {
		ip = a.Unmap().String()
	}
	return pod, ip, pod != "" || ip != ""
}

// sidecarNamespace is the namespace field of an Istio sidecar id ("" if it is not one).
func sidecarNamespace(id string) string {
	parts := strings.Split(id, "~")
	if len(parts) != 4 {
		return ""
	}
	ns, _, _ := strings.Cut(parts[3], ".")
	return ns
}

// internKey is a set's index (ListenerSet … EndpointSet) and version.
type internKey struct {
	set     int
	version string
}

// intern returns the snapshot cache's form of set i, made once per publication and version,
// with its resources in wire form: every node with delta streams given that set shares it.
func (p *publication) intern(i int, s Set) cache.Resources {
	if s.Version == "" {
		return cache.Resources{}
	}
	p.internMu.Lock()
	defer p.internMu.Unlock()
	in := p.internedLocked(i, s)
	if in.res.Items == nil {
		items := make(map[string]types.ResourceWithTTL, len(s.Items))
		for _, res := range s.Items {
			items[cache.GetResourceName(res)] = types.ResourceWithTTL{Resource: p.wireLocked(res)}
		}
		in.res = cache.Resources{Version: s.Version, Items: items}
	}
	return in.res
}

// internedSet is what a publication made once for a set (index and version) and shares between
// the nodes given it, each part when first needed: the snapshot cache's form and the
// resources' versions (delta streams), the resources marshalled in the set's order (SOTW).
type internedSet struct {
	res      cache.Resources
	versions map[string]string
	anys     []*anypb.Any
}

// internedLocked returns set i's entry, made empty if there is none. p.internMu is held.
func (p *publication) internedLocked(i int, s Set) *internedSet {
	key := internKey{i, s.Version}
	in := p.interned[key]
	if in == nil {
		in = &internedSet{}
		p.interned[key] = in
	}
	return in
}

// wireLocked returns res's wire form, made once per publication. p.internMu is held.
func (p *publication) wireLocked(res types.Resource) types.Resource {
	w, ok := p.wire[res]
	if !ok {
		w = wireForm(res)
		p.wire[res] = w
	}
	return w
}

// versions returns go-control-plane's per-resource versions (what Snapshot.ConstructVersionMap
// computes) of res; when res is what intern returned for set i, they are computed once per
// publication and shared, read-only, by every node that holds it.
func (p *publication) versions(i int, res cache.Resources, interned bool) (map[string]string, error) {
	var in *internedSet
	if interned && res.Version != "" {
		p.internMu.Lock()
		defer p.internMu.Unlock()
		if in = p.interned[internKey{i, res.Version}]; in != nil && in.versions != nil {
			return in.versions, nil
		}
	}
	vm := make(map[string]string, len(res.Items))
	for name, r := range res.Items {
		b, err := cache.MarshalResource(r.Resource)
		if err != nil {
			return nil, fmt.Errorf("xds: resource %q: %w", name, err)
		}
		vm[name] = cache.HashResource(b)
	}
	if in != nil {
		in.versions = vm
	}
	return vm, nil
}

// wireForm returns r ready to be sent many times: a message of r's type with r's name field
// (field 1 of a Listener, RouteConfiguration, Cluster and ClusterLoadAssignment) and, as
// unknown fields, the rest of r's deterministic encoding. Every resource of every delta
// response, and of every SOTW set once per publication, is marshalled; marshalling the wire
// form copies bytes instead of encoding r again (which dominated the server's CPU at thousands
// of streams), and one wire
// form serves every node that holds r. The bytes on the wire, and the resource versions delta
// streams compare, are r's own: wireForm checks that they are, and returns r itself otherwise.
func wireForm(r types.Resource) types.Resource {
	det := proto.MarshalOptions{Deterministic: true}
	full, err := det.Marshal(r)
	if err != nil {
		return r
	}
	src := r.ProtoReflect()
	fd := src.Descriptor().Fields().ByNumber(1)
	if fd == nil || fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated {
		return r
	}
	w := src.New()
	if src.Has(fd) {
		w.Set(fd, src.Get(fd))
	}
	prefix, err := det.Marshal(w.Interface())
	if err != nil || !bytes.HasPrefix(full, prefix) {
		return r
	}
	w.SetUnknown(protoreflect.RawFields(full[len(prefix):]))
	if again, err := det.Marshal(w.Interface()); err != nil || !bytes.Equal(again, full) {
		return r
	}
	return w.Interface()
}

// nodeState is one xDS node id with open streams: where its publication wants it (target),
// what the cache holds for it (sets), and what its streams hold. Fields below mu are guarded
// by mu; streams by Server.nodesMu.
type nodeState struct {
	id      string   // the node id its client sent
	key     string   // id and owner: the key of s.nodes and of the snapshot cache (cacheNode.Id)
	kind    NodeKind // classified from the node of its first stream
	streams int32
	// cacheNode stands for the client's node in every request handed to go-control-plane:
	// it carries key as its id, so the snapshot cache keys the node by id and owner, and
	// keeps no copy of the client's metadata.
	cacheNode *core.Node
	uris      []string // the identities its connection's certificate proves (RequireIdentity)

	mu     sync.Mutex
	pub    *publication  // the publication target was built from
	pod    string        // the pod the id resolved to ("" = round-robin default)
	target *[numSets]Set // the publication's sets for the node (shared): where its steps lead
	sets   [numSets]Set  // what the cache holds for the node
	// relabeled marks a set kept after a NACK under the version its client named (no
	// fallback existed): not interned, not remembered.
	relabeled [numSets]bool
	closed    bool             // the node's last stream closed (next to relabeled: one word for both)
	served    bool             // the node has been given its sets (SOTW watches wait until then)
	snap      *nodeSnapshot    // the snapshot last set in the snapshot cache, while the node has delta streams
	writes    [numSets]uint64  // sets written so far, per type
	history   [numSets][]past  // sets written, oldest first (see rememberLocked)
	acked     [numSets]Set     // the set a stream of the node last ACKed, per type
	rejected  *[numSets]string // the version last NACKed, per type: never set again (nil until a NACK)
	live      []*streamState   // streams that sent a request, in arrival order
	deltas    int              // how many of live are delta streams
	awaitPub  *publication     // the publication waiting for this node's answers
	revoked   error            // its claim no longer holds (RequireIdentity): served nothing more
	nackLog   [numSets]string  // the version whose NACK was last logged, per type
}

// rejectedVersion is the version of type i the node's clients last NACKed ("" = none).
func (n *nodeState) rejectedVersion(i int) string {
	if n.rejected == nil {
		return ""
	}
	return n.rejected[i]
}

// past is a set the node was given, with its write number.
type past struct {
	set Set
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
func (n *nodeState) rememberLocked(before [numSets]Set) {
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
			h = append(make([]past, 0, historyLen+1), h...)
		}
		h = append(h, past{set: set, seq: n.writes[i]})
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
func (n *nodeState) lookup(i int, version string) (Set, bool) {
	if version == "" {
		return Set{}, true
	}
	if n.sets[i].Version == version && !n.relabeled[i] {
		return n.sets[i], true
	}
	for j := len(n.history[i]) - 1; j >= 0; j-- {
		if p := n.history[i][j]; p.set.Version == version {
			return p.set, true
		}
	}
	return Set{}, false
}

// find is lookup that also knows the sets sent to st.
func (n *nodeState) find(st *streamState, i int, version string) (Set, bool) {
	switch {
	case version == "":
		return Set{}, true
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

	sub [numSets]subscription
	// acked is what the client holds, as far as the server knows: for SOTW the set its
	// latest request names (version_info), for delta the set of the last response it ACKed.
	acked [numSets]Set
	// since is, per type, the write number from which sets may still reach the client: after
	// a response the cache sends nothing of that type until the next request, which it
	// answers from the set current then or a later one; so a set written before the set
	// current at the stream's last request, or before its last response, is never sent.
	since [numSets]uint64
	// awaiting is the version of each type the stream must answer before the node's
	// publication converges ("" = none).
	awaiting [numSets]string

	sotw  *sotwStream  // SOTW streams only
	delta *deltaStream // delta streams only
}

// sotwStream is what a SOTW stream was sent, and its watches (guarded by node.mu).
type sotwStream struct {
	// The last response per type (its nonce, 0 = none), whether the client answered it, and
	// what it returned.
	nonce    [numSets]int64
	sent     [numSets]Set
	answered [numSets]bool
	// open: a response of the type was sent since its last accepted request; go-control-plane
	// then ignores a request (stale) unless it names that response's nonce.
	open        [numSets]bool
	returnedAll [numSets]bool // see returnedHas
	returned    [numSets][]string

	// SOTW watches (sotw.go): per type, the open watch's responder (nil = none) and the
	// version its request named; and the request onRequest hands to CreateWatch.
	watch        [numSets]chan cache.Response
	watchVersion [numSets]string
	req          *discovery.DiscoveryRequest
}

// deltaStream is what a delta stream's client holds and has not answered (guarded by node.mu).
type deltaStream struct {
	// held is, per type, the resources the client ACKed.
	held [numSets]heldSet
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
	set       Set // the set the response was computed from (SystemVersionInfo)
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

func sameVersions(a, b [numSets]Set) bool {
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
func (s *Server) writeLocked(n *nodeState, next [numSets]Set, counted bool) {
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
			s.m.pushes.WithLabelValues(typeLabels[i]).Inc()
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
func (s *Server) setSnapshotLocked(n *nodeState, before [numSets]Set) {
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
			s.log.Error("xds: resource versions", "node", clip(n.id), "type", typeLabels[i], "error", err)
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
	res [numSets]cache.Resources
	vm  [numSets]map[string]string
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

// callbacks hooks the server into go-control-plane's stream lifecycle. An error a callback
// returns ends the stream with that status, before go-control-plane acts on the request.
func (s *Server) callbacks() gcpserver.Callbacks {
	return gcpserver.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, id int64, _ string) error {
			return s.streamOpened(ctx, streamKey{id: id})
		},
		StreamClosedFunc: func(id int64, _ *core.Node) {
			s.closeStream(streamKey{id: id})
		},
		StreamRequestFunc: func(id int64, req *discovery.DiscoveryRequest) error {
			return s.onRequest(streamKey{id: id}, req)
		},
		StreamResponseFunc: func(_ context.Context, id int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
			s.onResponse(streamKey{id: id}, resp)
		},
		DeltaStreamOpenFunc: func(ctx context.Context, id int64, typeURL string) error {
			if err := s.streamOpened(ctx, streamKey{delta: true, id: id}); err != nil {
				return err
			}
			if typeURL != resource.AnyType {
				s.deltaTypes.Store(id, typeURL)
			}
			return nil
		},
		DeltaStreamClosedFunc: func(id int64, _ *core.Node) {
			s.deltaTypes.Delete(id)
			s.closeStream(streamKey{delta: true, id: id})
		},
		StreamDeltaRequestFunc: func(id int64, req *discovery.DeltaDiscoveryRequest) error {
			return s.onDeltaRequest(streamKey{delta: true, id: id}, req)
		},
		StreamDeltaResponseFunc: func(id int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
			s.onDeltaResponse(streamKey{delta: true, id: id}, resp)
		},
	}
}

// streamOpen is what the server knows of a stream from its opening: who owns its node state
// (owner), its connection, the identities its connection's certificate proves, and its
// request budget.
type streamOpen struct {
	owner   string
	conn    *conn
	uris    []string
	limiter *rate.Limiter
}

// streamOpened admits a new stream within the stream bounds (Limits).
func (s *Server) streamOpened(ctx context.Context, key streamKey) error {
	l := s.cfg.Limits
	owner, c := owner(ctx, key)
	if over(int(s.openStreams.Add(1)), l.MaxStreams) {
		s.openStreams.Add(-1)
		return s.refuse("streams", codes.ResourceExhausted, "xds: too many xDS streams (%d, the server's bound)", l.MaxStreams)
	}
	if c != nil && over(int(c.streams.Add(1)), l.MaxStreamsPerConnection) {
		c.streams.Add(-1)
		s.openStreams.Add(-1)
		return s.refuse("streams_per_connection", codes.ResourceExhausted,
			"xds: too many xDS streams on one connection (%d, the server's bound)", l.MaxStreamsPerConnection)
	}
	o := &streamOpen{owner: owner, conn: c}
	if s.cfg.RequireIdentity {
		o.uris = peerIdentities(ctx)
	}
	if l.RequestsPerSecond > 0 && l.RequestBurst > 0 {
		o.limiter = rate.NewLimiter(rate.Limit(l.RequestsPerSecond), l.RequestBurst)
	}
	s.opened.Store(key, o)
	s.m.connected.Inc()
	s.m.streamsOpened.Inc()
	return nil
}

// refuse counts and logs a refusal (reason is the metric's label) and returns its status.
func (s *Server) refuse(reason string, code codes.Code, format string, args ...any) error {
	s.m.refused.WithLabelValues(reason).Inc()
	err := status.Errorf(code, format, args...)
	s.refusedLog(reason, "xds: stream refused or closed", "error", err)
	return err
}

// admit checks a request against its stream's bounds: the names it carries, the stream's
// request rate. It returns the stream's opening record (nil if go-control-plane opened the
// stream without the callbacks: never).
func (s *Server) admit(key streamKey, names int) (*streamOpen, error) {
	v, ok := s.opened.Load(key)
	if !ok {
		return nil, status.Error(codes.Internal, "xds: request on a stream that is not open")
	}
	o := v.(*streamOpen)
	l := s.cfg.Limits
	if over(names, l.MaxResourceNames) {
		return nil, s.refuse("resource_names", codes.ResourceExhausted,
			"xds: a request names %d resources; the server's bound is %d", names, l.MaxResourceNames)
	}
	if o.limiter != nil && !o.limiter.AllowN(s.clock.Now(), 1) {
		return nil, s.refuse("request_rate", codes.ResourceExhausted,
			"xds: more than %g requests per second (burst %d) on one stream, the server's bound", l.RequestsPerSecond, l.RequestBurst)
	}
	return o, nil
}

// openStream returns the stream's state, registering the stream and its node on the first
// request; a new node gets its snapshot before the request is served. A stream serves one
// node: a later request naming another node id is refused (InvalidArgument), as is a first
// request without a node, or one whose id claims a pod the stream's certificate does not
// prove (PermissionDenied, RequireIdentity). The node state is the id's and the owner's (the
// client connection): another client claiming the same id has its own.
func (s *Server) openStream(key streamKey, o *streamOpen, node *core.Node) (*streamState, error) {
	if v, ok := s.streams.Load(key); ok {
		st := v.(*streamState)
		if node != nil && node != st.node.cacheNode && node.GetId() != st.node.id {
			return nil, s.refuse("node_switch", codes.InvalidArgument,
				"xds: the stream serves node %q; a request named node %q (one stream, one node)", clip(st.node.id), clip(node.GetId()))
		}
		st.node.mu.Lock()
		err := st.node.revoked
		st.node.mu.Unlock()
		return st, err
	}
	if node == nil {
		return nil, s.refuse("no_node", codes.InvalidArgument, "xds: the first request of a stream must name its node")
	}
	nodeID := node.GetId()
	nodeKey := nodeID + "\x00" + o.owner
	s.nodesMu.Lock()
	pub := s.pub
	n, ok := s.nodes[nodeKey]
	if !ok && s.cfg.RequireIdentity {
		if err := s.checkClaim(o.uris, nodeID, pub); err != nil {
			s.nodesMu.Unlock()
			s.m.refused.WithLabelValues("identity").Inc()
			return nil, err
		}
	}
	if !ok {
		n = &nodeState{id: nodeID, key: nodeKey, kind: ClassifyNode(node), cacheNode: &core.Node{Id: nodeKey}, uris: o.uris}
		s.nodes[nodeKey] = n
		s.m.nodes.Inc()
	}
	n.streams++
	st := &streamState{node: n, key: key}
	if key.delta {
		st.delta = &deltaStream{}
	} else {
		st.sotw = &sotwStream{}
	}
	s.streams.Store(key, st)
	s.nodesMu.Unlock()

	n.mu.Lock()
	defer n.mu.Unlock()
	n.live = append(n.live, st)
	if key.delta {
		if n.deltas++; n.deltas == 1 && n.served {
			// The first delta stream: the same sets again, now with resource versions.
			s.setSnapshotLocked(n, n.sets)
		}
	}
	if pub != nil {
		s.refreshLocked(n, pub, false)
	}
	return st, n.revoked
}

// closeStream forgets a stream; its node's state goes with its last stream, the node's
// snapshot cache entry included.
func (s *Server) closeStream(key streamKey) {
	if v, ok := s.opened.LoadAndDelete(key); ok {
		if c := v.(*streamOpen).conn; c != nil {
			c.streams.Add(-1)
		}
		s.openStreams.Add(-1)
		s.m.connected.Dec()
	}
	s.nodesMu.Lock()
	v, ok := s.streams.LoadAndDelete(key)
	if !ok {
		s.nodesMu.Unlock()
		return
	}
	st := v.(*streamState)
	n := st.node
	if n.streams--; n.streams == 0 {
		// Under nodesMu, so a new node with the same id cannot set its snapshot in between.
		delete(s.nodes, n.key)
		s.m.nodes.Dec()
		n.mu.Lock()
		n.closed = true
		n.live = nil
		s.cacheFor(n.key).ClearSnapshot(n.key)
		s.settleLocked(n)
		n.mu.Unlock()
		s.nodesMu.Unlock()
		return
	}
	s.nodesMu.Unlock()

	n.mu.Lock()
	defer n.mu.Unlock()
	for i, x := range n.live {
		if x == st {
			n.live = append(n.live[:i], n.live[i+1:]...)
			break
		}
	}
	if key.delta {
		if n.deltas--; n.deltas == 0 && n.snap != nil {
			n.snap = nil // the snapshot cache served only the delta streams
			s.cacheFor(n.key).ClearSnapshot(n.key)
		}
	}
	s.advanceLocked(n) // the stream no longer holds anything back
}

func (s *Server) onResponse(key streamKey, resp *discovery.DiscoveryResponse) {
	i := setIndex(resp.GetTypeUrl())
	v, ok := s.streams.Load(key)
	if i < 0 || !ok {
		return
	}
	st := v.(*streamState)
	n := st.node
	n.mu.Lock()
	defer n.mu.Unlock()
	st.sotw.nonce[i] = parseNonce(resp.GetNonce())
	st.sotw.sent[i], _ = n.find(st, i, resp.GetVersionInfo())
	st.setReturned(i)
	st.sotw.answered[i] = false
	st.sotw.open[i] = true
	st.since[i] = n.writes[i] + 1
}

// onRequest registers new streams and handles SOTW ACKs and NACKs. The version a request names
// (version_info) is the one the client holds, ACK or NACK; the version an ACK or NACK answers
// is the one sent with its nonce.
func (s *Server) onRequest(key streamKey, req *discovery.DiscoveryRequest) error {
	o, err := s.admit(key, len(req.GetResourceNames()))
	if err != nil {
		return err
	}
	st, err := s.openStream(key, o, req.GetNode())
	if err != nil {
		return err
	}
	req.Node = st.node.cacheNode
	i := setIndex(req.GetTypeUrl())
	if i < 0 {
		return nil
	}
	n := st.node
	n.mu.Lock()
	defer n.mu.Unlock()
	held, known := n.find(st, i, req.GetVersionInfo())
	if known {
		st.acked[i] = held
	}
	nonce := parseNonce(req.GetResponseNonce())
	if !st.sotw.open[i] || nonce == st.sotw.nonce[i] {
		// Not stale: the cache drops the type's old watch (and a response queued on it) and
		// answers from the set current then: this one or a later one. A stale request
		// changes nothing in go-control-plane, its subscription included.
		st.sotw.open[i] = false
		st.sub[i].setSOTW(req.GetResourceNames())
		st.since[i] = n.writes[i]
		st.dropUnsubscribed(i)
		st.sotw.req = req // for CreateWatch, which go-control-plane calls next
	}
	if nonce > 0 && nonce == st.sotw.nonce[i] {
		if known {
			n.acked[i] = held
		}
		st.sotw.answered[i] = true
		answered := st.sotw.sent[i].Version
		if d := req.GetErrorDetail(); d != nil {
			s.nackLocked(n, st, i, answered, req.GetVersionInfo(), d.GetMessage())
		}
		if st.awaiting[i] == answered {
			st.awaiting[i] = ""
		}
	}
	s.checkHeldLocked(n, st, i)
	s.advanceLocked(n)
	return nil
}

// onDeltaResponse records what a delta response carries, to be applied when it is ACKed.
func (s *Server) onDeltaResponse(key streamKey, resp *discovery.DeltaDiscoveryResponse) {
	i := setIndex(resp.GetTypeUrl())
	v, ok := s.streams.Load(key)
	if i < 0 || !ok {
		return
	}
	nonce, err := strconv.ParseInt(resp.GetNonce(), 10, 64)
	if err != nil {
		return
	}
	st := v.(*streamState)
	n := st.node
	n.mu.Lock()
	defer n.mu.Unlock()
	set, _ := n.find(st, i, resp.GetSystemVersionInfo())
	sent := deltaSent{nonce: nonce, typ: i, set: set, removed: resp.GetRemovedResources()}
	for _, r := range resp.GetResources() {
		sent.resources = append(sent.resources, heldEntry{r.GetName(), heldResource{version: r.GetVersion(), res: setItem(set, r.GetName())}})
	}
	st.delta.pending = append(st.delta.pending, sent)
	if len(st.delta.pending) > maxPending { // a client that never answers: forget the oldest
		oldest := 0
		for j, p := range st.delta.pending {
			if p.nonce < st.delta.pending[oldest].nonce {
				oldest = j
			}
		}
		st.delta.pending = slices.Delete(st.delta.pending, oldest, oldest+1)
	}
	st.since[i] = n.writes[i] + 1
}

// onDeltaRequest handles a delta stream's subscriptions, ACKs and NACKs. Delta has no
// version_info per type: the answered response is found by its nonce.
func (s *Server) onDeltaRequest(key streamKey, req *discovery.DeltaDiscoveryRequest) error {
	o, err := s.admit(key, len(req.GetResourceNamesSubscribe())+len(req.GetResourceNamesUnsubscribe())+len(req.GetInitialResourceVersions()))
	if err != nil {
		return err
	}
	st, err := s.openStream(key, o, req.GetNode())
	if err != nil {
		return err
	}
	req.Node = st.node.cacheNode
	typeURL := req.GetTypeUrl()
	if typeURL == "" {
		if t, ok := s.deltaTypes.Load(key.id); ok {
			typeURL = t.(string)
		}
	}
	i := setIndex(typeURL)
	if i < 0 {
		return nil
	}
	n := st.node
	n.mu.Lock()
	defer n.mu.Unlock()
	if st.delta.req = req; n.revoked != nil {
		return n.revoked
	}
	first := !st.sub[i].started
	st.sub[i].updateDelta(req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe())
	// Responses queued before this request were sent before it was handed over; the cache
	// answers it from the set current then: this one or a later one.
	st.since[i] = n.writes[i]
	if !st.sub[i].wildcard {
		st.delta.held[i].removeAll(req.GetResourceNamesUnsubscribe())
	}
	if first && len(req.GetInitialResourceVersions()) > 0 {
		// A reconnecting client says what it holds; the content is known when it matches.
		vm := n.versionMap(i)
		entries := make([]heldEntry, 0, len(req.GetInitialResourceVersions()))
		for name, v := range req.GetInitialResourceVersions() {
			h := heldResource{version: v}
			if vm[name] == v {
				h.res = setItem(n.sets[i], name)
			}
			entries = append(entries, heldEntry{name, h})
		}
		st.delta.held[i].putAll(entries)
	}
	if nonce, err := strconv.ParseInt(req.GetResponseNonce(), 10, 64); err == nil {
		if j := slices.IndexFunc(st.delta.pending, func(p deltaSent) bool { return p.nonce == nonce && p.typ == i }); j >= 0 {
			sent := st.delta.pending[j]
			st.delta.pending = slices.DeleteFunc(st.delta.pending, func(p deltaSent) bool { return p.nonce <= nonce && p.typ == i })
			if len(st.delta.pending) == 0 {
				st.delta.pending = nil
			}
			if d := req.GetErrorDetail(); d != nil {
				s.nackLocked(n, st, i, sent.set.Version, "", d.GetMessage())
			} else {
				st.delta.held[i].putAll(slices.Clone(sent.resources))
				st.delta.held[i].removeAll(sent.removed)
				st.acked[i] = sent.set
				n.acked[i] = sent.set
			}
			if st.awaiting[i] == sent.set.Version {
				st.awaiting[i] = ""
			}
		}
	}
	s.checkHeldLocked(n, st, i)
	s.advanceLocked(n)
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
	s.m.nacks.WithLabelValues(typeLabels[i]).Inc()
	logIt := n.nackLog[i] != version || version == ""
	n.nackLog[i] = version // each version's NACK is logged once per node
	if n.closed || version != n.sets[i].Version || n.pub == nil || version == "" {
		if logIt {
			s.log.Warn("xds: client rejected a response", "node", clip(n.id), "type", typeLabels[i], "version", version,
				"kept", n.sets[i].Version, "error", clip(message))
		}
		return
	}
	if n.rejected == nil {
		n.rejected = new([numSets]string)
	}
	n.rejected[i] = version
	fallback, kind := n.fallback(i, version)
	if kind == "" {
		if st.key.delta || holds == version {
			kind = "kept"
			fallback = n.sets[i]
		} else {
			kind = "kept-relabeled"
			fallback = Set{Version: holds, Items: n.sets[i].Items}
		}
	}
	s.m.fallbacks.WithLabelValues(kind).Inc()
	if logIt {
		s.log.Warn("xds: client rejected a response", "node", clip(n.id), "type", typeLabels[i], "version", version,
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
func (n *nodeState) fallback(i int, version string) (Set, string) {
	if a := n.acked[i]; a.Version != "" && a.Version != version && len(a.Items) > 0 {
		return a, "acked"
	}
	for j := len(n.history[i]) - 1; j >= 0; j-- {
		if p := n.history[i][j]; p.set.Version != "" && p.set.Version != version && len(p.set.Items) > 0 {
			return p.set, "previous"
		}
	}
	return Set{}, ""
}
