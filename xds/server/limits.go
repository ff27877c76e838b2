package server

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// Default bounds of the xDS port, in the style of istiod's (ISTIO_GPRC_MAXRECVMSGSIZE 4 MiB,
// ISTIO_GPRC_MAXSTREAMS 100,000, --keepaliveMaxServerConnectionAge 30 m): a sidecar or a
// proxyless gRPC client opens one connection and one ADS stream (an Envoy on the per-type
// services, one per type), names the few services it calls and answers each response once.
const (
	DefaultMaxMessageBytes         = 4 << 20
	DefaultMaxConnections          = 100_000
	DefaultMaxStreams              = 100_000
	DefaultMaxStreamsPerConnection = 100
	DefaultMaxResourceNames        = 50_000
	DefaultRequestsPerSecond       = 100
	DefaultRequestBurst            = 500
	DefaultMaxConnectionAge        = 30 * time.Minute
	DefaultMaxConnectionAgeGrace   = 10 * time.Second
)

// Limits bound what one client may make the server do. A zero field takes its default
// (Default…); a negative one means no bound. Over a bound the stream (or connection) is
// refused or closed with ResourceExhausted naming the bound, and counted in
// edgeflow_xds_refused_total{reason}.
type Limits struct {
	// MaxMessageBytes bounds a request message (gRPC answers ResourceExhausted itself).
	MaxMessageBytes int
	// MaxConnections bounds the open connections (Server.Listener): a connection past it is
	// closed at once.
	MaxConnections int
	// MaxStreams bounds the open xDS streams in all, MaxStreamsPerConnection those of one
	// connection.
	MaxStreams, MaxStreamsPerConnection int
	// MaxResourceNames bounds the names one request carries: resource_names (SOTW), or
	// resource_names_subscribe, _unsubscribe and initial_resource_versions together (delta).
	MaxResourceNames int
	// RequestsPerSecond and RequestBurst are each stream's token bucket: a stream that sends
	// faster is closed.
	RequestsPerSecond float64
	RequestBurst      int
	// MaxConnectionAge is when a connection is asked to go away (gRPC adds ±10 % jitter), so
	// clients spread over replicas again; MaxConnectionAgeGrace is how long its streams may
	// still run after that.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
}

// withDefaults returns l with every zero field set to its default.
func (l Limits) withDefaults() Limits {
	setInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	setInt(&l.MaxMessageBytes, DefaultMaxMessageBytes)
	setInt(&l.MaxConnections, DefaultMaxConnections)
	setInt(&l.MaxStreams, DefaultMaxStreams)
	setInt(&l.MaxStreamsPerConnection, DefaultMaxStreamsPerConnection)
	setInt(&l.MaxResourceNames, DefaultMaxResourceNames)
	setInt(&l.RequestBurst, DefaultRequestBurst)
	if l.RequestsPerSecond == 0 {
		l.RequestsPerSecond = DefaultRequestsPerSecond
	}
	if l.MaxConnectionAge == 0 {
		l.MaxConnectionAge = DefaultMaxConnectionAge
	}
	if l.MaxConnectionAgeGrace == 0 {
		l.MaxConnectionAgeGrace = DefaultMaxConnectionAgeGrace
	}
	return l
}

// over reports whether n exceeds bound (a negative bound is none).
func over(n, bound int) bool { return bound >= 0 && n > bound }

// ServerOptions returns the gRPC server options the xDS port needs: the message size bound,
// keepalives and MaxConnectionAge, the connection tagging that gives each client connection
// its own node state and stream count, and, with Config.RequireIdentity, the identity check
// of the unary Fetch methods (streams are checked in the server's stream callbacks). Use them with
// Register, and Listener around the listener:
//
//	g := grpc.New(append(srv.ServerOptions(), grpc.Creds(creds))...)
//	srv.Register(g)
//	g.Serve(srv.Listener(lis))
//
// HTTP/2's own stream bound is set above MaxStreamsPerConnection, so a client that opens more
// streams than that gets ResourceExhausted from the server rather than a stream that waits
// forever in its own queue.
func (s *Server) ServerOptions() []grpc.ServerOption {
	l := s.cfg.Limits
	age, grace := l.MaxConnectionAge, l.MaxConnectionAgeGrace
	if age < 0 {
		age = 0 // keepalive: 0 is infinity
	}
	if grace < 0 {
		grace = 0
	}
	opts := []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second,
			MaxConnectionAge: age, MaxConnectionAgeGrace: grace}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.StatsHandler(connTagger{}),
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
	}
	if l.MaxMessageBytes > 0 {
		opts = append(opts, grpc.MaxRecvMsgSize(l.MaxMessageBytes))
	}
	if l.MaxStreamsPerConnection > 0 {
		opts = append(opts, grpc.MaxConcurrentStreams(uint32(min(2*l.MaxStreamsPerConnection+16, 1<<20))))
	}
	return opts
}

// conn is one client connection, tagged by connTagger.
type conn struct {
	num     uint64
	streams atomic.Int64
}

var connNums atomic.Uint64

type connKey struct{}

// connTagger tags each gRPC connection with a conn, which the stream callbacks find in the
// stream's context.
type connTagger struct{}

func (connTagger) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, &conn{num: connNums.Add(1)})
}
func (connTagger) HandleConn(context.Context, stats.ConnStats) {}
func (connTagger) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}
func (connTagger) HandleRPC(context.Context, stats.RPCStats) {}

// owner names who owns a stream's node state: its connection when tagged, else its peer's
// address (a TCP client's address and port are its connection's), else the stream alone.
func owner(ctx context.Context, key streamKey) (string, *conn) {
	if c, ok := ctx.Value(connKey{}).(*conn); ok {
		return "c" + fmt.Sprint(c.num), c
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil && p.Addr.Network() == "tcp" {
		return "a" + p.Addr.String(), nil
	}
	if key.delta {
		return fmt.Sprintf("d%d", key.id), nil
	}
	return fmt.Sprintf("s%d", key.id), nil
}

// unaryInterceptor checks the identity of the unary Fetch methods' callers
// (Config.RequireIdentity) as the streams' first requests are checked.
func (s *Server) unaryInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.cfg.RequireIdentity {
		r, ok := req.(interface{ GetNode() *core.Node })
		if !ok {
			return nil, status.Error(codes.InvalidArgument, "xds: a fetch must name its node")
		}
		if err := s.checkClaim(peerIdentities(ctx), r.GetNode().GetId(), s.currentPub()); err != nil {
			s.m.refused.WithLabelValues("identity").Inc()
			return nil, err
		}
	}
	return handler(ctx, req)
}

// Listener returns l bounded to Limits.MaxConnections open connections: a connection past
// the bound is closed at once and counted (edgeflow_xds_refused_total{reason="connections"}).
func (s *Server) Listener(l net.Listener) net.Listener {
	return &boundedListener{Listener: l, s: s}
}

type boundedListener struct {
	net.Listener
	s    *Server
	open atomic.Int64
}

func (b *boundedListener) Accept() (net.Conn, error) {
	for {
		c, err := b.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if over(int(b.open.Add(1)), b.s.cfg.Limits.MaxConnections) {
			b.open.Add(-1)
			b.s.m.refused.WithLabelValues("connections").Inc()
			b.s.refusedLog("connections", "xds: connection refused: too many connections", "remote", c.RemoteAddr().String(),
				"max", b.s.cfg.Limits.MaxConnections)
			c.Close()
			continue
		}
		b.s.m.connections.Inc()
		return &boundedConn{Conn: c, l: b}, nil
	}
}

type boundedConn struct {
	net.Conn
	l    *boundedListener
	once sync.Once
}

func (c *boundedConn) Close() error {
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.s.m.connections.Dec()
	})
	return c.Conn.Close()
}

// maxLogged bounds a client-supplied string in a log line.
const maxLogged = 256

// clip returns s, or its first maxLogged bytes and how long it was: client-supplied strings
// (node ids, NACK messages, type URLs) are logged clipped.
func clip(s string) string {
	if len(s) <= maxLogged {
		return s
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:maxLogged], len(s))
}

// refusedLog logs a refusal at most once a second per reason (the metric counts them all).
func (s *Server) refusedLog(reason, msg string, args ...any) {
	now := s.clock.Now()
	s.refusedMu.Lock()
	last := s.refusedAt[reason]
	logIt := now.Sub(last) >= time.Second
	if logIt {
		if s.refusedAt == nil {
			s.refusedAt = map[string]time.Time{}
		}
		s.refusedAt[reason] = now
	}
	s.refusedMu.Unlock()
	if logIt {
		s.log.Warn(msg, append(args, "reason", reason)...)
	}
}
