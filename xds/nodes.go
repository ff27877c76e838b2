package xds

import (
	"context"
	"net/netip"
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
	pending  atomic.Int64 // answers still expected (+1 while nodes are being visited)

	internMu sync.Mutex
	interned map[string]cache.Resources // by set index and version
}

func newPublication(num uint64, t *optimizer.Topology, a *optimizer.Allocation, tr *Translation, changeAt time.Time) *publication {
	p := &publication{num: num, topology: t, alloc: a, tr: tr, byIP: map[string]string{}, changeAt: changeAt,
		interned: map[string]cache.Resources{}}
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
func ParseSidecarID(id string) (pod, ip string, ok bool) {
	parts := strings.Split(id, "~")
	if len(parts) != 4 || parts[0] != "sidecar" {
		return "", "", false
	}
	ns, _, _ := strings.Cut(parts[3], ".")
	pod = strings.TrimSuffix(parts[2], "."+ns)
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

func (p *publication) intern(i int, s Set) cache.Resources {
	if s.Version == "" {
		return cache.Resources{}
	}
	key := typeLabels[i] + s.Version
	p.internMu.Lock()
	defer p.internMu.Unlock()
	if r, ok := p.interned[key]; ok {
		return r
	}
	r := cache.NewResources(s.Version, s.Items)
	p.interned[key] = r
	return r
}

// nodeState is one xDS node id with open streams. Fields below mu are guarded by mu; streams
// and closed by Server.nodesMu (closed also under mu).
type nodeState struct {
	id      string
	kind    NodeKind // classified from the node of its first stream
	streams int

	mu       sync.Mutex
	closed   bool
	pub      *publication             // the publication sets were built from
	pod      string                   // the pod the id resolved to ("" = round-robin default)
	sets     [numSets]Set             // what the cache holds for the node
	history  [numSets][historyLen]Set // the last sets written, newest first, to resolve versions clients name
	acked    [numSets]Set             // the version the node last said it holds, per type
	rejected [numSets]string
	awaiting [numSets]string // versions of awaitPub not yet answered
	awaitPub *publication
	// subscribed records the types the node has asked for over SOTW: only those get
	// answers, so only those are awaited (a sidecar that takes only EDS never ACKs CDS).
	subscribed [numSets]bool
}

// historyLen is how many past versions per type a node remembers, so that an ACK or NACK
// naming a version that a newer push already replaced still finds that version's resources.
const historyLen = 4

// remember records the sets just written.
func (n *nodeState) remember() {
	for i, set := range n.sets {
		if set.Version == n.history[i][0].Version {
			continue
		}
		copy(n.history[i][1:], n.history[i][:historyLen-1])
		n.history[i][0] = set
	}
}

// lookup returns the remembered set of type i with the given version.
func (n *nodeState) lookup(i int, version string) (Set, bool) {
	if version == "" {
		return Set{}, true
	}
	for _, s := range n.history[i] {
		if s.Version == version {
			return s, true
		}
	}
	return Set{}, false
}

// streamState is one xDS stream. Its fields are used only by the stream's goroutine.
type streamState struct {
	node   *nodeState
	nonce  [numSets]string // last response nonce per type
	sentAt [numSets]string // version of that response
}

// refreshLocked brings n's snapshot up to pub, pushing only if a version changed. When
// fromPublication, changed types are counted as pushes and awaited for convergence. n.mu is
// held. It reports whether the snapshot changed.
func (s *Server) refreshLocked(n *nodeState, pub *publication, fromPublication bool) bool {
	if n.closed || (n.pub != nil && n.pub.num > pub.num) {
		return false
	}
	res, pod := pub.resourcesFor(n.id, n.kind)
	if n.pub == nil && pod == "" {
		s.log.Info("xds: node id matches no pod, serving round-robin", "node", n.id)
	}
	n.pub, n.pod = pub, pod
	var want [numSets]Set
	changed := false
	for i := range want {
		want[i] = res.Sets[i]
		if want[i].Version != "" && want[i].Version == n.rejected[i] {
			want[i] = n.acked[i] // the client rejected exactly this: keep what it has
		}
		if want[i].Version != n.sets[i].Version {
			changed = true
		}
	}
	if !changed {
		return false
	}
	if fromPublication && n.awaitPub != nil && n.awaitPub != pub {
		s.settleLocked(n) // superseded: the old publication no longer waits for this node
	}
	awaiting := false
	for i := range want {
		if want[i].Version != n.sets[i].Version {
			if fromPublication && n.subscribed[i] {
				s.m.pushes.WithLabelValues(typeLabels[i]).Inc()
				n.awaiting[i] = want[i].Version
				awaiting = true
			}
		}
	}
	if awaiting {
		if n.awaitPub != pub {
			pub.pending.Add(1)
		}
		n.awaitPub = pub
	}
	n.sets = want
	s.setSnapshotLocked(n, pub)
	return true
}

// settleLocked stops n's publication from waiting for it and drops the reference, so an old
// publication is not kept alive by a node that is never pushed again. n.mu is held.
func (s *Server) settleLocked(n *nodeState) {
	if n.awaitPub == nil {
		return
	}
	n.awaiting = [numSets]string{}
	s.answered(n.awaitPub)
	n.awaitPub = nil
}

func (n *nodeState) waiting() bool {
	for _, v := range n.awaiting {
		if v != "" {
			return true
		}
	}
	return false
}

// setSnapshotLocked writes n.sets into the cache. n.mu is held.
func (s *Server) setSnapshotLocked(n *nodeState, pub *publication) {
	n.remember()
	snap := &cache.Snapshot{}
	for i, set := range n.sets {
		snap.Resources[typeSlots[i]] = pub.intern(i, set)
	}
	if err := s.cacheFor(n.id).SetSnapshot(context.Background(), n.id, snap); err != nil {
		s.log.Error("xds: setting snapshot", "node", n.id, "error", err)
	}
}

// callbacks hooks the server into go-control-plane's stream lifecycle.
func (s *Server) callbacks() gcpserver.Callbacks {
	return gcpserver.CallbackFuncs{
		StreamOpenFunc: func(context.Context, int64, string) error {
			s.m.connected.Inc()
			s.m.streamsOpened.Inc()
			return nil
		},
		StreamClosedFunc: func(id int64, _ *core.Node) {
			s.m.connected.Dec()
			s.closeStream(id)
		},
		StreamRequestFunc:  s.onRequest,
		StreamResponseFunc: s.onResponse,
		DeltaStreamOpenFunc: func(context.Context, int64, string) error {
			s.m.connected.Inc()
			s.m.streamsOpened.Inc()
			return nil
		},
		DeltaStreamClosedFunc: func(id int64, _ *core.Node) {
			s.m.connected.Dec()
			s.closeStream(id)
		},
		StreamDeltaRequestFunc: func(id int64, req *discovery.DeltaDiscoveryRequest) error {
			st := s.openStream(id, req.GetNode())
			if d := req.GetErrorDetail(); d != nil {
				i := setIndex(req.GetTypeUrl())
				if i >= 0 {
					s.m.nacks.WithLabelValues(typeLabels[i]).Inc()
				}
				s.log.Warn("xds: client rejected a delta response", "node", st.node.id, "type", req.GetTypeUrl(), "error", d.GetMessage())
			}
			return nil
		},
	}
}

// openStream returns the stream's state, registering the stream and its node on the first
// request; a new node gets its snapshot before the request is served.
func (s *Server) openStream(id int64, node *core.Node) *streamState {
	if st, ok := s.streams.Load(id); ok {
		return st.(*streamState)
	}
	nodeID := node.GetId()
	s.nodesMu.Lock()
	n, ok := s.nodes[nodeID]
	if !ok {
		n = &nodeState{id: nodeID, kind: ClassifyNode(node)}
		s.nodes[nodeID] = n
		s.m.nodes.Inc()
	}
	n.streams++
	st := &streamState{node: n}
	s.streams.Store(id, st)
	pub := s.pub
	s.nodesMu.Unlock()
	if pub != nil {
		n.mu.Lock()
		s.refreshLocked(n, pub, false)
		n.mu.Unlock()
	}
	return st
}

func (s *Server) closeStream(id int64) {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	v, ok := s.streams.LoadAndDelete(id)
	if !ok {
		return
	}
	n := v.(*streamState).node
	if n.streams--; n.streams > 0 {
		return
	}
	delete(s.nodes, n.id)
	s.m.nodes.Dec()
	n.mu.Lock()
	n.closed = true
	s.cacheFor(n.id).ClearSnapshot(n.id)
	s.settleLocked(n)
	n.mu.Unlock()
}

func (s *Server) onResponse(_ context.Context, id int64, req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	i := setIndex(resp.GetTypeUrl())
	if i < 0 {
		return
	}
	if v, ok := s.streams.Load(id); ok {
		st := v.(*streamState)
		st.nonce[i], st.sentAt[i] = resp.GetNonce(), resp.GetVersionInfo()
	}
}

// onRequest registers new streams and handles ACKs and NACKs. The version a request names
// (version_info) is the one the client holds, ACK or NACK; the version an ACK or NACK answers
// is the one sent with its nonce.
func (s *Server) onRequest(id int64, req *discovery.DiscoveryRequest) error {
	st := s.openStream(id, req.GetNode())
	i := setIndex(req.GetTypeUrl())
	if i < 0 {
		return nil
	}
	n := st.node
	n.mu.Lock()
	defer n.mu.Unlock()
	n.subscribed[i] = true
	if req.GetResponseNonce() == "" {
		return nil // a subscription, not an answer
	}
	if held, ok := n.lookup(i, req.GetVersionInfo()); ok {
		n.acked[i] = held
	}
	if req.GetResponseNonce() != st.nonce[i] {
		return nil // answers a response that a newer one superseded
	}
	answered := st.sentAt[i]
	if d := req.GetErrorDetail(); d != nil {
		s.nackLocked(n, i, answered, d.GetMessage())
	}
	if n.awaitPub != nil && n.awaiting[i] != "" && n.awaiting[i] == answered {
		n.awaiting[i] = ""
		if !n.waiting() {
			s.settleLocked(n)
		}
	}
	return nil
}

// nackLocked handles a client's rejection of version of set i: count, log, and set the node
// back to its last ACKed version of that type, so the cache stops resending the rejected one.
func (s *Server) nackLocked(n *nodeState, i int, version, message string) {
	s.m.nacks.WithLabelValues(typeLabels[i]).Inc()
	s.log.Warn("xds: client rejected a response", "node", n.id, "type", typeLabels[i], "version", version,
		"kept", n.acked[i].Version, "error", message)
	if n.closed || version != n.sets[i].Version || n.pub == nil {
		return
	}
	n.rejected[i] = version
	n.sets[i] = n.acked[i]
	s.setSnapshotLocked(n, n.pub)
}
