package server

import (
	"context"
	"fmt"
	"slices"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/edgeflow/edgeflow/xds"
)

// sotwCache is the cache behind go-control-plane's server: SOTW watches are the Server's own
// (below), delta watches and fetches go to the snapshot caches.
//
// go-control-plane's snapshot cache keeps, for every open SOTW watch, the request that opened
// it, a map entry, and, per response, a map of the names it returned; at one stream per
// sidecar those cost more memory than the rest of the stream's state. The Server already
// holds what a watch needs (the node's sets, the stream's subscription, what it was sent), so
// a watch here is the responder channel and the version its request named, on the stream.
//
// The rules are the snapshot cache's (ads=false): a request naming a version other than the
// node's current one for its type, or subscribing to a resource of the current set that the
// stream was not returned, is answered at once; any other waits until the node's set of that
// type changes to a version other than the one it named. Nothing is answered before the node
// has its first snapshot. A response carries the set's resources that the stream subscribes
// to (all of them for a wildcard subscription), each marshalled once per publication and
// shared by every stream sent it.
type sotwCache struct {
	s *Server
	cache.Cache
}

// Fetch answers a fetch (the per-type services' unary Fetch methods): what the last
// publication has for a node of that id and kind (a fetch has no stream: nothing it sends
// changes a node's state), only the named resources when the request names any (filtered by
// a set; at most Limits.MaxResourceNames). A request naming the version it
// would get is told to skip (types.SkipFetchError), as by the snapshot cache.
func (w sotwCache) Fetch(_ context.Context, req *cache.Request) (cache.Response, error) {
	s := w.s
	i := setIndex(req.GetTypeUrl())
	if i < 0 {
		return nil, fmt.Errorf("xds: fetch of type %q: edgeflow serves %v", clip(req.GetTypeUrl()), typeURLs)
	}
	id := req.GetNode().GetId()
	if names := len(req.GetResourceNames()); over(names, s.cfg.Limits.MaxResourceNames) {
		return nil, s.refuse("resource_names", codes.ResourceExhausted,
			"xds: a fetch names %d resources; the server's bound is %d", names, s.cfg.Limits.MaxResourceNames)
	}
	pub := s.currentPub()
	if pub == nil {
		return nil, fmt.Errorf("xds: fetch of %s by node %q: nothing is published yet", xds.SetNames[i], clip(id))
	}
	res, _ := pub.resourcesFor(id, xds.ClassifyNode(req.GetNode()))
	set := res.Sets[i]
	if req.GetVersionInfo() == set.Version {
		return nil, &types.SkipFetchError{}
	}
	all, err := pub.anys(i, set, false)
	if err != nil {
		return nil, fmt.Errorf("xds: fetch of %s by node %q: %w", xds.SetNames[i], clip(id), err)
	}
	resources := all
	if names := req.GetResourceNames(); len(names) > 0 {
		want := make(map[string]struct{}, len(names))
		for _, name := range names {
			want[name] = struct{}{}
		}
		resources = pick(set, all, func(name string) bool { _, ok := want[name]; return ok })
	}
	return &response{req: req, version: set.Version, resources: resources}, nil
}

// CreateDeltaWatch opens a delta watch in the snapshot cache, first noting the stream's
// response channel (see revokeLocked).
func (w sotwCache) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, ch chan cache.DeltaResponse) (func(), error) {
	s := w.s
	s.nodesMu.RLock()
	n := s.nodes[req.GetNode().GetId()]
	s.nodesMu.RUnlock()
	if n != nil {
		n.mu.Lock()
		for _, x := range n.live {
			if x.delta != nil && x.delta.req == req {
				x.delta.req, x.delta.ch = nil, ch
				break
			}
		}
		n.mu.Unlock()
	}
	return w.Cache.CreateDeltaWatch(req, sub, ch)
}

// noCancel is every watch's cancel function. A watch needs no cancelling: go-control-plane
// cancels a type's watch only to open the next one, which replaces it on the stream, or when the
// stream ends, which takes the stream out of its node. Until then a push may still answer the
// old watch; its channel has room for that one answer, which nobody reads. (A cancel function
// per watch cost 32 bytes for each of a stream's four types.)
func noCancel() {}

// CreateWatch opens a SOTW watch for req, which onRequest has just seen on its stream.
func (w sotwCache) CreateWatch(req *cache.Request, _ cache.Subscription, ch chan cache.Response) (func(), error) {
	s := w.s
	i := setIndex(req.GetTypeUrl())
	if i < 0 {
		return noCancel, nil // a type edgeflow does not serve: never answered
	}
	s.nodesMu.RLock()
	n := s.nodes[req.GetNode().GetId()]
	s.nodesMu.RUnlock()
	if n == nil {
		return noCancel, nil // the stream is closing
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var st *streamState
	for _, x := range n.live {
		if x.sotw != nil && x.sotw.req == req {
			st = x
			break
		}
	}
	if st == nil {
		return noCancel, nil
	}
	st.sotw.req = nil
	version := req.GetVersionInfo()
	if n.served && s.unheldLocked(n, st, i, version) {
		s.respondLocked(n, st, i, ch, req)
		return noCancel, nil
	}
	st.sotw.watch[i], st.sotw.watchVersion[i] = ch, version
	st.sotw.unchecked[i] = !n.served
	return noCancel, nil
}

// unheldLocked reports whether a SOTW request of type i naming version is answered at once:
// the node's set has another version, or holds a resource that st subscribes to and was not
// returned. n.mu is held.
func (s *Server) unheldLocked(n *nodeState, st *streamState, i int, version string) bool {
	set := n.sets[i]
	if version != set.Version {
		return true
	}
	if st.sotw.returnedAll[i] && st.sotw.sent[i].Version == set.Version {
		return false // every item of this very set was returned
	}
	for _, r := range set.Items {
		name := cache.GetResourceName(r)
		if st.sub[i].has(name) && !st.returnedHas(i, name) {
			return true
		}
	}
	return false
}

// respondSOTWLocked answers the node's open SOTW watches whose type's set changed to a
// version other than the one their request named. A watch opened before the node was served
// is answered by CreateWatch's rule (unheldLocked), which could not be applied then: a client
// that reconnects to a restarted server before its first publication names the version it
// holds, often the one that publication gives it, and was returned nothing on the new stream.
// n.mu is held.
func (s *Server) respondSOTWLocked(n *nodeState) {
	for _, st := range n.live {
		if st.sotw == nil {
			continue
		}
		for i, ch := range st.sotw.watch {
			if ch == nil {
				continue
			}
			unheld := st.sotw.watchVersion[i] != n.sets[i].Version
			if st.sotw.unchecked[i] {
				unheld = s.unheldLocked(n, st, i, st.sotw.watchVersion[i])
			}
			if unheld {
				s.respondLocked(n, st, i, ch, nil)
			}
		}
	}
}

// typeRequests name each type. A response to a watch that waited carries its type's as its
// request: the request that opened the watch is not kept.
var typeRequests = func() (r [xds.NumSets]*discovery.DiscoveryRequest) {
	for i := range r {
		r[i] = &discovery.DiscoveryRequest{TypeUrl: typeURLs[i]}
	}
	return r
}()

// respondLocked sends st the node's set of type i on ch, which has room for it (a watch is
// answered once), and closes st's watch of that type. n.mu is held.
func (s *Server) respondLocked(n *nodeState, st *streamState, i int, ch chan cache.Response, req *discovery.DiscoveryRequest) {
	if st.sotw.watch[i] == ch {
		st.sotw.watch[i], st.sotw.watchVersion[i], st.sotw.unchecked[i] = nil, "", false
	}
	set := n.sets[i]
	all, err := n.pub.anys(i, set, n.relabeled[i])
	if err != nil {
		s.log.Error("xds: marshalling a response", "node", n.id, "type", xds.SetNames[i], "version", set.Version, "error", err)
		return
	}
	resources := all
	if sub := &st.sub[i]; !sendsAll(sub) {
		resources = pick(set, all, sub.has)
	}
	if req == nil {
		req = typeRequests[i]
	}
	select {
	case ch <- &response{req: req, version: set.Version, resources: resources}:
	default:
		s.log.Error("xds: a watch was answered twice", "node", n.id, "type", xds.SetNames[i])
	}
}

// pick returns the marshalled resources all (of set, in its order) whose names keep holds:
// all itself when it holds for every one.
func pick(set xds.Set, all []*anypb.Any, keep func(name string) bool) []*anypb.Any {
	var out []*anypb.Any
	for j, r := range set.Items {
		if keep(cache.GetResourceName(r)) {
			out = append(out, all[j])
		}
	}
	if len(out) == len(all) {
		return all
	}
	return out
}

// response is a SOTW response (cache.Response). Its resources are shared with every stream
// sent the same set.
type response struct {
	req       *discovery.DiscoveryRequest
	version   string
	resources []*anypb.Any
}

// GetDiscoveryResponse returns a new message each time: go-control-plane sets its nonce.
func (r *response) GetDiscoveryResponse() (*discovery.DiscoveryResponse, error) {
	return &discovery.DiscoveryResponse{VersionInfo: r.version, Resources: r.resources, TypeUrl: r.req.GetTypeUrl()}, nil
}

func (r *response) GetRequest() *discovery.DiscoveryRequest { return r.req }
func (r *response) GetVersion() (string, error)             { return r.version, nil }
func (r *response) GetResponseVersion() string              { return r.version }
func (r *response) GetContext() context.Context             { return context.Background() }

// GetReturnedResources returns nil: the Server keeps what each stream was returned
// (sotwStream.returned), and go-control-plane only stores this and hands it back to the cache.
func (r *response) GetReturnedResources() map[string]string { return nil }

// What the last SOTW response of type i returned to a stream, less the names the stream
// unsubscribed from since, is go-control-plane's returned resources: every item of
// st.sotw.sent[i] (st.sotw.returnedAll[i]), or the sorted names st.sotw.returned[i].

// returnedHas reports whether name is among the resources returned to st of type i.
func (st *streamState) returnedHas(i int, name string) bool {
	if st.sotw.returnedAll[i] {
		return setItem(st.sotw.sent[i], name) != nil
	}
	_, found := slices.BinarySearch(st.sotw.returned[i], name)
	return found
}

// sendsAll reports whether a response to a stream subscribed as sub carries every resource
// of the set: a wildcard subscription, or (as go-control-plane's snapshot cache, which
// filters only by a request's non-empty names) one that names nothing.
func sendsAll(sub *subscription) bool { return sub.wildcard || len(sub.list) == 0 }

// setReturned records what the response of st.sotw.sent[i], just sent, returned. The names are
// the subscription's own list when the set has every one of them (no allocation).
func (st *streamState) setReturned(i int) {
	set, sub := st.sotw.sent[i], &st.sub[i]
	st.sotw.returnedAll[i], st.sotw.returned[i] = sendsAll(sub), nil
	if st.sotw.returnedAll[i] {
		return
	}
	matched := 0
	for _, r := range set.Items {
		if sub.has(cache.GetResourceName(r)) {
			matched++
		}
	}
	if matched == len(sub.list) {
		st.sotw.returned[i] = sub.list
		return
	}
	names := make([]string, 0, matched)
	for _, r := range set.Items {
		if name := cache.GetResourceName(r); sub.has(name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	st.sotw.returned[i] = names
}

// dropUnsubscribed drops from what was returned to st of type i the names its subscription
// no longer has, as go-control-plane does on every accepted request that names resources
// without the wildcard.
func (st *streamState) dropUnsubscribed(i int) {
	sub := &st.sub[i]
	if sub.wildcard {
		return
	}
	names := st.sotw.returned[i]
	if st.sotw.returnedAll[i] {
		st.sotw.returnedAll[i] = false
		names = make([]string, 0, len(st.sotw.sent[i].Items))
		for _, x := range st.sotw.sent[i].Items {
			names = append(names, cache.GetResourceName(x))
		}
		slices.Sort(names)
	}
	if !slices.ContainsFunc(names, func(name string) bool { return !sub.has(name) }) {
		st.sotw.returned[i] = names
		return
	}
	st.sotw.returned[i] = slices.DeleteFunc(slices.Clone(names), func(name string) bool { return !sub.has(name) })
}

// anys returns set i's resources marshalled, in the set's order: made once per publication
// and version and shared, unless the set is relabeled or unversioned.
func (p *publication) anys(i int, s xds.Set, relabeled bool) ([]*anypb.Any, error) {
	if relabeled || s.Version == "" {
		return marshalAnys(i, s.Items)
	}
	p.internMu.Lock()
	defer p.internMu.Unlock()
	in := p.internedLocked(i, s)
	if in.anys != nil {
		return in.anys, nil
	}
	items := make([]types.Resource, len(s.Items))
	for j, r := range s.Items {
		items[j] = p.wireLocked(r)
	}
	a, err := marshalAnys(i, items)
	if err != nil {
		return nil, err
	}
	in.anys = a
	return a, nil
}

func marshalAnys(i int, items []types.Resource) ([]*anypb.Any, error) {
	out := make([]*anypb.Any, len(items))
	for j, r := range items {
		b, err := cache.MarshalResource(r)
		if err != nil {
			return nil, err
		}
		out[j] = &anypb.Any{TypeUrl: typeURLs[i], Value: b}
	}
	return out, nil
}
