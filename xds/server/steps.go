package server

// Make before break: the steps that take one node from what its client holds to its target.
//
// A client must never hold a route or listener that names a cluster it does not have: grpc-go
// fails the RPCs picked for it, Envoy answers 503. So when a publication changes routes and
// clusters of a node, the node goes through up to three snapshots:
//
//  1. the new clusters and endpoints, together with every cluster a route the client may
//     still hold names, under the old routes and listeners — while some stream of the node
//     that takes clusters (or endpoints) does not hold the ones the new routes name, unless
//     the old routes are none that the client holds (foreignRoutes);
//  2. the new routes and listeners, still with the old clusters those routes named;
//  3. the target, once no route the client may hold names the old clusters any more.
//
// Each step is computed from the node's current state (nextLocked), so the steps are
// level-triggered: a step is set when the answers it needs are in, a newer publication
// restarts from wherever the node is, and a node whose change needs no ordering (weights
// only, or nothing removed and nothing new named) takes its target in one step.

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"sort"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"

	"github.com/edgeflow/edgeflow/xds"
)

// nextLocked returns the node's next safe snapshot on the way to its target (the target with
// every type the client rejected kept as it is). It equals n.sets when there is nothing to do
// until a client answers. n.mu is held.
func (s *Server) nextLocked(n *nodeState) [xds.NumSets]xds.Set {
	want := *n.target
	for i := range want {
		if want[i].Version != "" && want[i].Version == n.rejectedVersion(i) {
			want[i] = n.sets[i]
		}
	}
	cur := n.sets
	if sameVersions(want, cur) {
		return cur
	}
	next := want
	routesMove := want[xds.ListenerSet].Version != cur[xds.ListenerSet].Version || want[xds.RouteSet].Version != cur[xds.RouteSet].Version
	if routesMove && !n.foreignRoutes() && !s.holdsNamedLocked(n, &want) {
		next[xds.ListenerSet], next[xds.RouteSet] = cur[xds.ListenerSet], cur[xds.RouteSet]
	}
	if !namesSubset(cur[xds.ClusterSet], next[xds.ClusterSet]) {
		named := s.namedLocked(n, &next)
		next[xds.ClusterSet] = merged(next[xds.ClusterSet], cur[xds.ClusterSet], func(r types.Resource) types.Resource {
			name := cache.GetResourceName(r)
			if named[name] {
				n.forgetGraceLocked(name)
				return r
			}
			if s.keptForGraceLocked(n, name) {
				return r
			}
			return nil
		})
	}
	if !namesSubset(cur[xds.EndpointSet], next[xds.EndpointSet]) {
		keep := map[string]bool{}
		for _, c := range next[xds.ClusterSet].Items {
			if name := xds.EDSName(c); name != "" {
				keep[name] = true
			}
		}
		next[xds.EndpointSet] = merged(next[xds.EndpointSet], cur[xds.EndpointSet], func(r types.Resource) types.Resource {
			name := cache.GetResourceName(r)
			switch {
			case keep[name]:
				return r
			case n.subscribesByName(xds.EndpointSet, name):
				return emptyAssignment(r)
			}
			return nil
		})
	}
	for _, i := range []int{xds.ClusterSet, xds.EndpointSet} {
		if next[i].Version != "" && next[i].Version == n.rejectedVersion(i) {
			next[i] = cur[i]
		}
	}
	return next
}

// foreignRoutes reports whether the node was never given listeners or routes while its client
// holds some from elsewhere: it reconnected to this server, restarted, naming versions the
// server cannot know. Holding the node's routes back keeps the ones its client has; here it
// would replace the client's with none (an empty Listener response), and grpc-go fails the
// RPCs that then pick no cluster ("unknown cluster selected for RPC"). So the target's routes
// go out with its clusters: a client that reconnects under the same plan already holds every
// cluster they name. n.mu is held.
func (n *nodeState) foreignRoutes() bool {
	if n.writes[xds.ListenerSet] > 0 || n.writes[xds.RouteSet] > 0 {
		return false
	}
	for _, st := range n.live {
		if st.foreign[xds.ListenerSet] || st.foreign[xds.RouteSet] {
			return true
		}
	}
	return false
}

// holdsNamedLocked reports whether every stream of n that takes clusters (endpoints) holds
// the clusters (their endpoints) that want's listeners and routes name, and keeps them: every
// set of that type still on its way to the client has them too. A cluster the client rejected
// is not held: the routes naming it wait for a publication that does without it. n.mu is held.
func (s *Server) holdsNamedLocked(n *nodeState, want *[xds.NumSets]xds.Set) bool {
	// Quick answer: every such stream holds the target's clusters and endpoints (which have
	// all the routes name), and nothing else is on its way to it.
	quick := true
	for _, st := range n.live {
		for _, i := range []int{xds.ClusterSet, xds.EndpointSet} {
			if !st.sub[i].started {
				continue
			}
			if st.key.delta || st.acked[i].Version != want[i].Version || want[i].Version != n.target[i].Version {
				quick = false
			}
			for _, set := range n.onTheWay(st, i) {
				if set.Version != want[i].Version {
					quick = false
				}
			}
		}
	}
	if quick {
		return true
	}
	named := map[string]bool{}
	for _, i := range []int{xds.ListenerSet, xds.RouteSet} {
		for _, r := range want[i].Items {
			s.addRefs(n.pub, r, named)
		}
	}
	var clusters, eds []string
	for name := range named {
		c := setItem(n.target[xds.ClusterSet], name)
		if c == nil {
			continue // not ours to send: waiting for it would wait forever
		}
		clusters = append(clusters, name)
		if e := xds.EDSName(c); e != "" && setItem(n.target[xds.EndpointSet], e) != nil {
			eds = append(eds, e)
		}
	}
	for _, st := range n.live {
		if st.sub[xds.ClusterSet].started && !n.holds(st, xds.ClusterSet, clusters) {
			return false
		}
		if st.sub[xds.EndpointSet].started && !n.holds(st, xds.EndpointSet, eds) {
			return false
		}
	}
	return true
}

// holds reports whether st's client holds every named resource of type i and will keep it:
// a SOTW client when the version its requests name includes them (a SOTW response carries
// the whole set's version, requested names or not), a delta client when it ACKed each one it
// subscribes to (a delta stream gets only what it subscribes to); and in either case every
// set of type i on its way to the client has them. n.mu is held.
func (n *nodeState) holds(st *streamState, i int, names []string) bool {
	coming := n.onTheWay(st, i)
	for _, name := range names {
		if st.key.delta {
			if !st.sub[i].has(name) {
				continue
			}
			if _, ok := st.delta.held[i].get(name); !ok {
				return false
			}
		} else if setItem(st.acked[i], name) == nil {
			return false
		}
		for _, set := range coming {
			if setItem(set, name) == nil {
				return false
			}
		}
	}
	return true
}

// onTheWay returns the sets of type i that may still reach st's client: its response not
// answered yet (SOTW) or not ACKed yet (delta), the sets written since its last request or
// response (one may be queued), and the cache's. n.mu is held.
func (n *nodeState) onTheWay(st *streamState, i int) []xds.Set {
	var out []xds.Set
	if st.key.delta {
		for _, p := range st.delta.pending {
			if p.typ == i {
				out = append(out, p.set)
			}
		}
	} else if st.sotw.nonce[i] != 0 && !st.sotw.answered[i] {
		out = append(out, st.sotw.sent[i])
	}
	for _, p := range n.history[i] {
		if p.seq >= st.since[i] && p.seq != n.writes[i] { // the cache's set is added below
			out = append(out, p.set)
		}
	}
	return append(out, n.sets[i])
}

// namedLocked returns the clusters named by next's listeners and routes and by every listener
// and route the node's clients may hold or still receive: each stream's ACKed ones and those
// on their way (within what each stream subscribes to), and the cache's. n.mu is held.
func (s *Server) namedLocked(n *nodeState, next *[xds.NumSets]xds.Set) map[string]bool {
	named := map[string]bool{}
	add := func(set xds.Set, sub *subscription) {
		for _, r := range set.Items {
			if sub == nil || sub.has(cache.GetResourceName(r)) {
				s.addRefs(n.pub, r, named)
			}
		}
	}
	for _, i := range []int{xds.ListenerSet, xds.RouteSet} {
		add(next[i], nil)
		add(n.sets[i], nil)
		for _, st := range n.live {
			sub := &st.sub[i]
			if !sub.started {
				continue
			}
			if st.key.delta {
				for _, h := range st.delta.held[i] {
					if h.res != nil {
						s.addRefs(n.pub, h.res, named)
					}
				}
			} else {
				add(st.acked[i], sub)
			}
			for _, set := range n.onTheWay(st, i) {
				add(set, sub)
			}
		}
	}
	return named
}

// addRefs adds the clusters r names (a RouteConfiguration's routes, a Listener's inline routes
// and TCP proxies) to into. A Listener's are computed once per publication.
func (s *Server) addRefs(pub *publication, r types.Resource, into map[string]bool) {
	switch r := r.(type) {
	case *route.RouteConfiguration:
		xds.ClusterRefs(r, into)
	case *listener.Listener:
		var refs []string
		if v, ok := pub.refs.Load(r); ok {
			refs = v.([]string)
		} else {
			m := map[string]bool{}
			xds.ClusterRefs(r, m)
			for name := range m {
				refs = append(refs, name)
			}
			pub.refs.Store(r, refs)
		}
		for _, name := range refs {
			into[name] = true
		}
	}
}

// setItem returns the resource of set with the given name, or nil. Set items are sorted by
// name (Set's contract).
func setItem(set xds.Set, name string) types.Resource {
	j := sort.Search(len(set.Items), func(j int) bool { return cache.GetResourceName(set.Items[j]) >= name })
	if j < len(set.Items) && cache.GetResourceName(set.Items[j]) == name {
		return set.Items[j]
	}
	return nil
}

// namesSubset reports whether every name of a is a name of b.
func namesSubset(a, b xds.Set) bool {
	if a.Version == b.Version {
		return true
	}
	j := 0
	for _, r := range a.Items {
		name := cache.GetResourceName(r)
		for j < len(b.Items) && cache.GetResourceName(b.Items[j]) < name {
			j++
		}
		if j == len(b.Items) || cache.GetResourceName(b.Items[j]) != name {
			return false
		}
	}
	return true
}

// Dropped assignments. A ClusterLoadAssignment the node held that its target no longer has
// (its service left the topology, or stopped being servable) and that no cluster of the next
// set names is not simply left out: a SOTW EDS response carries only the requested names it
// has, and Envoy ignores an EDS update without its cluster's assignment and keeps the stale
// endpoints (source/extensions/clusters/eds/eds.cc, EdsClusterImpl::onConfigUpdate: "if
// (resources.empty()) { … update_empty_.inc(); onPreInitComplete(); return …; }"; the delta
// onConfigUpdate ignores removed_resources and calls it with the added ones only). So, as
// istiod does for a requested cluster without a service (pilot/pkg/xds/eds.go answers every
// watched name), the node gets an empty assignment of that name (cluster_name set, no
// endpoints) for as long as one of its streams subscribes to the name explicitly. A cluster
// the next set still has keeps its assignment (make before break).

// subscribesByName reports whether a stream of n subscribes to name of type i by name (a
// wildcard subscription does not count), or n has no stream that took type i yet (a
// reconnecting client will ask again for what it held). n.mu is held.
func (n *nodeState) subscribesByName(i int, name string) bool {
	started := false
	for _, st := range n.live {
		sub := &st.sub[i]
		if !sub.started {
			continue
		}
		started = true
		if _, found := slices.BinarySearch(sub.list, name); found {
			return true
		}
	}
	return !started
}

// emptyAssignment is r's name as an assignment without endpoints; r itself when it is one.
func emptyAssignment(r types.Resource) types.Resource {
	if cla, ok := r.(*endpoint.ClusterLoadAssignment); ok && len(cla.Endpoints) == 0 && cla.Policy == nil {
		return r
	}
	return &endpoint.ClusterLoadAssignment{ClusterName: cache.GetResourceName(r)}
}

// merged is want plus, for each resource of cur that want lacks, what keep makes of it (nil:
// left out). Its version is a function of the two versions and of the names kept and their
// kind (cur's resource or another), so the same inputs give the same version; when the result
// is cur's content, it is cur.
func merged(want, cur xds.Set, keep func(types.Resource) types.Resource) xds.Set {
	var extra []types.Resource
	for _, r := range cur.Items {
		if setItem(want, cache.GetResourceName(r)) != nil {
			continue
		}
		if k := keep(r); k != nil {
			extra = append(extra, k)
		}
	}
	if len(extra) == 0 {
		return want
	}
	items := make([]types.Resource, 0, len(want.Items)+len(extra))
	j := 0
	for _, r := range want.Items {
		for j < len(extra) && cache.GetResourceName(extra[j]) < cache.GetResourceName(r) {
			items = append(items, extra[j])
			j++
		}
		items = append(items, r)
	}
	items = append(items, extra[j:]...)
	if len(items) == len(cur.Items) {
		same := true
		for k := range items {
			if items[k] != cur.Items[k] && !proto.Equal(items[k], cur.Items[k]) {
				same = false
				break
			}
		}
		if same {
			return cur
		}
	}
	h := sha256.New()
	h.Write([]byte("keep\x00" + want.Version + "\x00" + cur.Version))
	for _, r := range extra {
		h.Write([]byte("\x00" + cache.GetResourceName(r)))
		if setItem(cur, cache.GetResourceName(r)) != r {
			h.Write([]byte("\x00replaced"))
		}
	}
	return xds.Set{Version: hex.EncodeToString(h.Sum(nil)[:8]), Items: items}
}
