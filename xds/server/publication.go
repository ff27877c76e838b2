package server

import (
	"bytes"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// Per-set xDS type URLs, snapshot slots and metric labels, indexed like NodeResources.Sets.
var (
	typeURLs  = [xds.NumSets]string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}
	typeSlots = [xds.NumSets]types.ResponseType{types.Listener, types.Route, types.Cluster, types.Endpoint}
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
	tr       *xds.Translation
	byIP     map[string]string // address host → pod name; "" when several pods share the host
	changeAt time.Time
	pending  atomic.Int64 // nodes still expected to answer (+1 while nodes are being visited)
	// firstSent and lastSent are when the first and the last response to a node this
	// publication waits for was handed to gRPC (Clock time in Unix ns, 0 = none): the fan-out's
	// stages, logged when the publication converges.
	firstSent, lastSent atomic.Int64

	internMu sync.Mutex
	interned map[internKey]*internedSet        // see intern
	wire     map[types.Resource]types.Resource // resource → its wire form (wireForm)

	refs sync.Map // types.Resource (a Listener) → []string, the clusters it names

	idsOnce sync.Once
	ids     map[string]PodIdentity // pod key → identity (identities)
}

func newPublication(num uint64, t *optimizer.Topology, a *optimizer.Allocation, tr *xds.Translation, changeAt time.Time) *publication {
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

// sent records a response handed to gRPC at now for a node the publication waits for. Safe
// for concurrent use: two atomic operations, no lock.
func (p *publication) sent(now time.Time) {
	t := now.UnixNano()
	p.firstSent.CompareAndSwap(0, t)
	for {
		last := p.lastSent.Load()
		if last >= t || p.lastSent.CompareAndSwap(last, t) {
			return
		}
	}
}

// resourcesFor resolves a node id: a pod name; else an Istio sidecar id by pod, then by IP;
// else the round-robin default. It returns what a node of that kind gets.
func (p *publication) resourcesFor(id string, kind xds.NodeKind) (res *xds.NodeResources, pod string) {
	if _, ok := p.tr.Pods[id]; ok {
		return p.tr.Resources(id, kind), id
	}
	if name, ip, ok := xds.ParseSidecarID(id); ok {
		name = optimizer.QualifiedName(name, xds.SidecarNamespace(id))
		if _, ok := p.tr.Pods[name]; ok {
			return p.tr.Resources(name, kind), name
		}
		if name := p.byIP[ip]; name != "" {
			return p.tr.Resources(name, kind), name
		}
	}
	return p.tr.Resources("", kind), ""
}

// internKey is a set's index (ListenerSet … EndpointSet) and version.
type internKey struct {
	set     int
	version string
}

// intern returns the snapshot cache's form of set i, made once per publication and version,
// with its resources in wire form: every node with delta streams given that set shares it.
func (p *publication) intern(i int, s xds.Set) cache.Resources {
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
func (p *publication) internedLocked(i int, s xds.Set) *internedSet {
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
