package server

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/config"
	gcpserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"k8s.io/utils/clock"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// Debounce defaults, as Istio's DebounceAfter (100 ms); the maximum is lower than Istio's 10 s
// because stale weights cost latency.
const (
	DefaultDebounceQuiet = 100 * time.Millisecond
	DefaultDebounceMax   = time.Second
)

// DefaultRemovalGrace is serve's --removal-grace: far longer than an RPC takes to pick its
// endpoint once it has its route, short enough that a removed pod's cluster is gone within
// seconds.
const DefaultRemovalGrace = 5 * time.Second

// Config configures a Server.
type Config struct {
	// Policy is the allocation policy ("" means lata).
	Policy optimizer.Policy
	// Encoding is the wire encoding of the weights ("" means locality).
	Encoding xds.Encoding
	// LBPolicy is the clusters' load-balancing policy ("" means round-robin). LBLeastRequest
	// serves every caller the callee's pods as one locality under LEAST_REQUEST: the Policy's
	// allocation is still planned and checked (Allocation), but its weights are not served.
	// LBBands serves the Policy's weights summed per latency band (the callee pods of one
	// node), least-request inside a band (xds.LBBands).
	LBPolicy xds.LBPolicy
	// Options are how topologies are compiled.
	Options optimizer.Options
	// ClusterDomain is the Kubernetes cluster's DNS domain in Istio's cluster names and plain
	// Envoy's virtual hosts ("" means optimizer.DefaultClusterDomain); see TranslateConfig.
	ClusterDomain string
	// EgressPortOffset moves plain Envoy nodes' outbound listeners from 127.0.0.1:PORT to
	// 127.0.0.1:PORT+EgressPortOffset (0, the default, leaves them); see TranslateConfig.
	EgressPortOffset int
	// Damping is the flap-damping threshold (optimizer.Planner): a recompute that moves less
	// than this fraction of the traffic, with the same pods, services and calls, is not pushed.
	// Zero means optimizer.DefaultDamping (1 %); negative pushes every recompute.
	Damping float64
	// DebounceQuiet is how long the topology must be quiet after an Update before a push, and
	// DebounceMax the longest a push waits after the first Update of a batch. Zero means the
	// default (DefaultDebounceQuiet, DefaultDebounceMax); a negative DebounceQuiet pushes right
	// after every Update (still one push at a time).
	DebounceQuiet, DebounceMax time.Duration
	// RemovalGrace is how long a cluster and its endpoints stay with a node after the last
	// route or listener its client may hold stopped naming them (grace.go), so RPCs that
	// picked the old route before the client applied the new one still find their cluster.
	// Zero means none; `edgeflow serve --removal-grace` defaults to DefaultRemovalGrace.
	RemovalGrace time.Duration
	// Clock is the time source of the debounce timers, the rate limits and the removal grace
	// (nil means clock.RealClock{}).
	Clock clock.WithTickerAndDelayedExecution
	// Logger receives the server's logs (nil means slog.Default()).
	Logger *slog.Logger
	// Registerer receives the server's metrics (nil means they are not registered).
	Registerer prometheus.Registerer
	// Limits bound what clients may make the server do (zero fields: the defaults).
	Limits Limits
	// RequireIdentity turns on the node identity check (identity.go), for a port that serves
	// mutual TLS: a node may claim only a pod whose identity its client certificate proves, in
	// TrustDomain ("" means DefaultTrustDomain).
	RequireIdentity bool
	TrustDomain     string
}

// Server serves edgeflow's allocations over xDS: one snapshot per connected xDS node, built
// from the last published topology.
//
// Rules:
//   - Nothing is served before the first topology that compiles, solves and translates (see
//     Translate for "complete"); a later topology that fails is logged, counted in
//     edgeflow_xds_rejected_topologies_total, and the previous publication stays.
//   - A node id is matched to a pod of the topology by name (proxyless gRPC: the pod name), or,
//     for an Istio sidecar id "sidecar~IP~POD.NS~NS.svc.cluster.local", by POD, else by IP when
//     exactly one pod has that IP. Any other id gets the round-robin resources, never nothing.
//     Matching happens when the node's first stream opens and again at every publication.
//   - One stream, one node, one owner: a stream serves the node its first request names (a
//     request naming another id ends it with InvalidArgument), and a node's state is its id's
//     and its client connection's (nodeState.key): a client claiming another's id gets a
//     state of its own, so its NACKs and silence affect only itself. Everything kept for a
//     node, its snapshot cache entry included, goes with its last stream. Under
//     Config.RequireIdentity the claim is checked at the first request, at every publication
//     and on Fetch (identity.go).
//   - Bounds (Config.Limits, limits.go): connections, streams in all and per connection,
//     names per request, requests per stream per second; over one the stream (connection)
//     ends with ResourceExhausted and edgeflow_xds_refused_total{reason} counts it. Client
//     strings are clipped in logs, and a NACK is logged once per node and version.
//   - Pushes are debounced (Config.DebounceQuiet/DebounceMax) and one runs at a time. A
//     publication sets the snapshot only of nodes whose resources changed, and versions are
//     per type and content-addressed, so a weight-only change reaches only the affected nodes
//     and only as EDS (locality encoding) or RDS (weighted clusters).
//   - Make before break (steps.go): a cluster, and its endpoints, reach a node before any
//     route or listener that names it, and a cluster leaves only once no route or listener the
//     node may hold names it. When a publication changes both, the node takes up to three
//     snapshots (new clusters with the old routes; new routes with the old clusters kept; the
//     target), each once the answers it depends on are in: the streams that take clusters
//     (endpoints) hold the named ones, the streams that take routes ACKed the new ones. SOTW
//     and delta streams alike; a newer publication restarts from wherever the node is.
//   - ACKs and NACKs are tracked per stream, SOTW by version_info and response nonce, delta by
//     the response nonce (a delta response's system_version_info says which set it came from).
//     A publication converges (WaitConverged) once every node it changed has answered its last
//     step (ACK or NACK) on every stream subscribed to a changed type, or was superseded, or
//     disconnected; a delta stream that subscribes to none of the changed resources is sent
//     nothing and is not waited for.
//   - A NACK is logged and counted, and never answered with an empty set: the node is set back
//     to the set it last ACKed for that type, else to the set it had before the rejected one,
//     else it keeps the cache's set (under the version the SOTW client says it holds, so the
//     cache does not resend the rejected one in a loop). Publications that produce the
//     rejected version again keep the fallback; a different version is pushed.
//
// All methods are safe for concurrent use.
type Server struct {
	cfg    Config
	log    *slog.Logger
	clock  clock.WithTickerAndDelayedExecution
	m      *metrics
	shards [numShards]cache.SnapshotCache // by shardOf(node id)
	xds    gcpserver.Server

	// stopStreams ends every xDS stream; called when Run returns.
	stopStreams context.CancelFunc
	running     atomic.Bool

	updates chan struct{} // capacity 1: "the latest topology changed"

	mu     sync.Mutex // guards latest, changeAt
	latest *optimizer.Topology
	// latestCompiled is latest's model as the watcher compiled it (nil: none handed over).
	latestCompiled *optimizer.Compiled
	changeAt       time.Time // first Update since the last publication started

	nodesMu    sync.RWMutex // guards pub, nodes, streams; the watches only read nodes (RLock)
	pub        *publication
	nodes      map[string]*nodeState // by node id and owner (nodeState.key), nodes with ≥ 1 open stream
	streams    sync.Map              // streamKey → *streamState; written under nodesMu
	deltaTypes sync.Map              // delta stream id → type URL, for the per-type (non-ADS) services

	opened      sync.Map     // streamKey → *streamOpen, streams admitted (streamOpened) and not closed
	openStreams atomic.Int64 // streams admitted and not closed
	refusedMu   sync.Mutex   // guards refusedAt
	refusedAt   map[string]time.Time

	allocation atomic.Pointer[optimizer.Allocation]
	lastPub    atomic.Pointer[publication] // the last publication, stored before published
	published  atomic.Uint64
	converged  atomic.Uint64
	signalMu   sync.Mutex
	signal     chan struct{} // closed and replaced whenever published or converged grows

	planner *optimizer.Planner // used by publish only (one at a time)

	publishHook func(begin bool) // tests: called as each publication attempt begins and ends
}

// NewServer returns a server; it starts no goroutine. Serve it with Register on a grpc.Server
// built with ServerOptions, over Listener, and Run; feed it with Update.
func New(cfg Config) (*Server, error) {
	if cfg.Policy == "" {
		cfg.Policy = optimizer.LATA
	}
	if _, err := optimizer.ParsePolicy(string(cfg.Policy)); err != nil {
		return nil, err
	}
	wire, err := xds.TranslateConfig{Encoding: cfg.Encoding, LBPolicy: cfg.LBPolicy, ClusterDomain: cfg.ClusterDomain, EgressPortOffset: cfg.EgressPortOffset}.Check()
	if err != nil {
		return nil, err
	}
	cfg.Encoding, cfg.LBPolicy, cfg.ClusterDomain = wire.Encoding, wire.LBPolicy, wire.ClusterDomain
	if cfg.DebounceQuiet == 0 {
		cfg.DebounceQuiet = DefaultDebounceQuiet
	}
	if cfg.DebounceMax == 0 {
		cfg.DebounceMax = DefaultDebounceMax
	}
	if cfg.DebounceMax < 0 {
		return nil, fmt.Errorf("xds: negative DebounceMax %v", cfg.DebounceMax)
	}
	if cfg.RemovalGrace < 0 {
		return nil, fmt.Errorf("xds: negative RemovalGrace %v", cfg.RemovalGrace)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.TrustDomain == "" {
		cfg.TrustDomain = DefaultTrustDomain
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		clock:   cfg.Clock,
		m:       m,
		updates: make(chan struct{}, 1),
		nodes:   map[string]*nodeState{},
		planner: &optimizer.Planner{Policy: cfg.Policy, Options: cfg.Options, Damping: cfg.Damping},
		signal:  make(chan struct{}),
	}
	// SOTW streams are answered by the server's own watches (sotw.go); delta streams by
	// go-control-plane's snapshot caches, which hold a snapshot for each node with a delta
	// stream.
	//
	// ads=false: a node's snapshot holds every servable service, and each client asks only for
	// the ones it uses; in ADS mode the cache would hold responses until a request named every
	// resource of the type (go-control-plane's ADS mode waits for the full set of names before
	// it answers; a grpc-go client asks for one service at a time). Responses are filtered to
	// the requested names.
	//
	// The snapshot cache is sharded by node id: one cache serialises every SetSnapshot of a
	// publication with every client's request (CreateDeltaWatch) on a single mutex, which
	// dominated fan-out time at thousands of nodes.
	mux := &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return shardKey(r.GetNode().GetId()) },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return shardKey(r.GetNode().GetId()) },
		Caches:        map[string]cache.Cache{},
	}
	for i := range s.shards {
		s.shards[i] = cache.NewSnapshotCache(false, nodeIDHash{}, gcpLogger{s.log})
		mux.Caches[shardNames[i]] = s.shards[i]
	}
	// The streams' context is cancelled when Run returns, so a graceful gRPC stop completes.
	streamCtx, stop := context.WithCancel(context.Background())
	s.stopStreams = stop
	s.xds = gcpserver.NewServer(streamCtx, sotwCache{s: s, Cache: mux}, s.callbacks(), func(o *config.Opts) { o.Logger = gcpLogger{s.log} })
	return s, nil
}

// numShards is how many snapshot caches the nodes are spread over.
const numShards = 16

var shardNames = func() (n [numShards]string) {
	for i := range n {
		n[i] = strconv.Itoa(i)
	}
	return n
}()

func shardOf(nodeID string) int {
	h := fnv.New32a()
	h.Write([]byte(nodeID))
	return int(h.Sum32() % numShards)
}

func shardKey(nodeID string) string { return shardNames[shardOf(nodeID)] }

// cacheFor returns the snapshot cache that holds the node's snapshot (delta streams).
func (s *Server) cacheFor(nodeID string) cache.SnapshotCache { return s.shards[shardOf(nodeID)] }

// Register registers the aggregated discovery service (ADS) and the per-type LDS, RDS, CDS and
// EDS services on g.
func (s *Server) Register(g *grpc.Server) {
	discovery.RegisterAggregatedDiscoveryServiceServer(g, s.xds)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, s.xds)
	routeservice.RegisterRouteDiscoveryServiceServer(g, s.xds)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, s.xds)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, s.xds)
}

// Update hands the server a new topology. It never blocks; the latest topology wins, and a
// debounced recompute and push follows (in Run). t must not be modified afterwards.
func (s *Server) Update(t *optimizer.Topology) { s.UpdateCompiled(t, nil) }

// UpdateCompiled is Update of a topology the watcher compiled to cm (nil: not compiled): the
// planner uses cm instead of compiling t again.
func (s *Server) UpdateCompiled(t *optimizer.Topology, cm *optimizer.Compiled) {
	s.mu.Lock()
	s.latest, s.latestCompiled = t, cm
	if s.changeAt.IsZero() {
		s.changeAt = s.clock.Now()
	}
	s.mu.Unlock()
	select {
	case s.updates <- struct{}{}:
	default:
	}
}

// Run is the push loop: it debounces Updates, then solves, translates and publishes, one
// publication at a time. It returns nil when ctx is done (the caller owns ctx), and then ends
// every xDS stream. It may be called once.
//
// The debounce is not the client-go workqueue loop of package xds/istio (passes.go), because
// it does not fit: a debounce's deadline moves later with every Update (quiet since the last)
// up to DebounceMax after the first, and a workqueue's AddAfter only ever moves a pending
// key's deadline earlier (delaying_queue.go's insert keeps the sooner one), so a key re-added
// on each Update would fire DebounceQuiet after the first Update of a batch, not the last.
// Neither does the rest of that loop apply: a rejected topology is not retried (it would fail
// again; the next Update brings another) and nothing needs a resync (the server holds what it
// serves). And each AddAfter allocates and hands its entry to the queue's own goroutine,
// where Update now only sends on a channel.
func (s *Server) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("xds: Server.Run called twice")
	}
	defer s.stopStreams()
	var (
		timer       clock.Timer
		first, last time.Time
	)
	stopTimer := func() {
		if timer != nil {
			timer.Stop()
			timer = nil
		}
	}
	defer stopTimer()
	for {
		var fire <-chan time.Time
		if timer != nil {
			fire = timer.C()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.updates:
			now := s.clock.Now()
			if s.cfg.DebounceQuiet < 0 {
				s.publish()
				continue
			}
			if timer == nil {
				first = now
			}
			last = now
			due := last.Add(s.cfg.DebounceQuiet)
			if limit := first.Add(s.cfg.DebounceMax); limit.Before(due) {
				due = limit
			}
			stopTimer()
			timer = s.clock.NewTimer(due.Sub(now))
		case <-fire:
			timer = nil
			s.publish()
		}
	}
}

// Allocation returns the last published allocation (nil before the first publication).
func (s *Server) Allocation() *optimizer.Allocation { return s.allocation.Load() }

// Publication returns the last publication's number with the topology it was made from and
// its allocation, all three of the same publication (0, nil, nil before the first). Its number
// is at least what Published returned before the call.
func (s *Server) Publication() (uint64, *optimizer.Topology, *optimizer.Allocation) {
	p := s.lastPub.Load()
	if p == nil {
		return 0, nil, nil
	}
	return p.num, p.topology, p.alloc
}

// Published returns the number of publications so far; publication n is the n-th topology
// that was published (not rejected).
func (s *Server) Published() uint64 { return s.published.Load() }

// WaitPublished blocks until publication n has been set in the cache for every connected node,
// or ctx is done.
func (s *Server) WaitPublished(ctx context.Context, n uint64) error {
	return s.wait(ctx, func() bool { return s.published.Load() >= n })
}

// WaitConverged blocks until publication n, or a later one, has been answered (ACK or NACK) by
// every client it pushed to, each at the last step of its make-before-break sequence, or ctx
// is done. Clients that disconnect stop being waited for.
func (s *Server) WaitConverged(ctx context.Context, n uint64) error {
	return s.wait(ctx, func() bool { return s.converged.Load() >= n })
}

func (s *Server) wait(ctx context.Context, done func() bool) error {
	for {
		s.signalMu.Lock()
		ch := s.signal
		s.signalMu.Unlock()
		if done() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *Server) notify() {
	s.signalMu.Lock()
	close(s.signal)
	s.signal = make(chan struct{})
	s.signalMu.Unlock()
}

// publish computes and publishes the latest topology.
func (s *Server) publish() {
	if s.publishHook != nil {
		s.publishHook(true)
		defer s.publishHook(false)
	}
	s.mu.Lock()
	t, cm, changeAt := s.latest, s.latestCompiled, s.changeAt
	s.changeAt = time.Time{}
	s.mu.Unlock()
	if t == nil {
		return
	}
	t0 := s.clock.Now()
	res, err := s.planner.PlanCompiled(t, cm)
	t1 := s.clock.Now()
	s.m.solve.Observe(t1.Sub(t0).Seconds())
	var alloc *optimizer.Allocation
	if err == nil {
		alloc = res.Allocation
		if !res.Push {
			s.m.suppressed.Inc()
			s.log.Debug("xds: recompute not pushed (flap damping)", "moved", res.Moved, "damping", s.cfg.Damping)
			return
		}
	}
	var tr *xds.Translation
	t2 := t1
	if err == nil {
		tr, err = xds.TranslateWith(t, alloc, xds.TranslateConfig{Encoding: s.cfg.Encoding, LBPolicy: s.cfg.LBPolicy, ClusterDomain: s.cfg.ClusterDomain, EgressPortOffset: s.cfg.EgressPortOffset})
		t2 = s.clock.Now()
		s.m.translate.Observe(t2.Sub(t1).Seconds())
	}
	if err != nil {
		s.m.rejected.Inc()
		kept := "nothing is served yet"
		if n := s.published.Load(); n > 0 {
			kept = fmt.Sprintf("publication %d stays", n)
		}
		s.log.Error("xds: topology not published", "error", err, "kept", kept)
		return
	}
	pub := newPublication(s.published.Load()+1, t, alloc, tr, changeAt)
	pub.pending.Add(1) // held until every node is visited

	s.nodesMu.Lock()
	s.pub = pub
	nodes := make([]*nodeState, 0, len(s.nodes))
	for _, n := range s.nodes {
		nodes = append(nodes, n)
	}
	s.nodesMu.Unlock()

	pushed := 0
	for _, n := range nodes {
		n.mu.Lock()
		if s.refreshLocked(n, pub, true) {
			pushed++
		}
		n.mu.Unlock()
	}
	s.m.push.Observe(s.clock.Now().Sub(changeAt).Seconds())
	s.m.publications.Inc()
	s.m.setPooled(tr.Pooled)
	s.planner.Pushed(res)
	s.allocation.Store(alloc)
	s.lastPub.Store(pub)
	s.published.Store(pub.num)
	s.notify()
	now := s.clock.Now()
	s.log.Info("xds: published", "publication", pub.num, "policy", alloc.Policy, "cost", alloc.Cost,
		"nodes", len(nodes), "pushed", pushed, "solve", t1.Sub(t0), "translate", t2.Sub(t1), "set", now.Sub(t2),
		"since_change", now.Sub(changeAt), "change_at", changeAt.UTC().Format(time.RFC3339Nano), "pooled", alloc.Pooled)
	s.answered(pub)
}

// answered marks one expected answer of pub as received; the last one converges pub.
func (s *Server) answered(pub *publication) {
	if pub.pending.Add(-1) != 0 {
		return
	}
	for {
		c := s.converged.Load()
		if c >= pub.num {
			return
		}
		if s.converged.CompareAndSwap(c, pub.num) {
			break
		}
	}
	now := s.clock.Now()
	s.m.convergence.Observe(now.Sub(pub.changeAt).Seconds())
	s.notify()
	// The fan-out's stages, each since the change (the publication's "published" line has the
	// ones before): the first and last response to a node it waited for, and its last answer.
	since := func(ns int64) any {
		if ns == 0 {
			return "none"
		}
		return time.Unix(0, ns).Sub(pub.changeAt)
	}
	s.log.Info("xds: converged", "publication", pub.num, "first_response", since(pub.firstSent.Load()),
		"last_response", since(pub.lastSent.Load()), "since_change", now.Sub(pub.changeAt))
}
