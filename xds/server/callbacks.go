package server

import (
	"context"
	"slices"
	"strconv"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	gcpserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/edgeflow/edgeflow/xds"
)

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
		n = &nodeState{id: nodeID, key: nodeKey, kind: xds.ClassifyNode(node), cacheNode: &core.Node{Id: nodeKey}, uris: o.uris}
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
		n.stopGraceLocked()
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
	if n.awaitPub != nil {
		n.awaitPub.sent(s.clock.Now())
	}
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
	st.foreign[i] = !known
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
	if n.awaitPub != nil {
		n.awaitPub.sent(s.clock.Now())
	}
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
		st.foreign[i] = true
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
				st.foreign[i] = false
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
