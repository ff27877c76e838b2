package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/edgeflow/edgeflow/optimizer"
)

// TLSFiles names the xDS port's certificate files (PEM).
type TLSFiles struct {
	// CertFile and KeyFile are the server's certificate chain and key.
	CertFile, KeyFile string
	// ClientCAFile, when set, turns on mutual TLS: clients must present a certificate signed
	// by one of these CAs.
	ClientCAFile string
}

// certReloadEvery bounds how often the files are checked for changes.
const certReloadEvery = time.Second

// NewTLSConfig returns the xDS port's TLS configuration. The files are read now (an error
// names the file) and re-read when their modification time changes, checked at most once a
// second on a new handshake, so a rotated certificate (e.g. a renewed Kubernetes Secret) takes
// effect without a restart; a rotation that does not load is logged and the previous
// certificates stay.
func NewTLSConfig(f TLSFiles, logger *slog.Logger) (*tls.Config, error) {
	if f.CertFile == "" || f.KeyFile == "" {
		return nil, errors.New("xds: TLS needs both a certificate and a key file")
	}
	if logger == nil {
		logger = slog.Default()
	}
	r := &certReloader{files: f, log: logger}
	cfg, err := r.load()
	if err != nil {
		return nil, err
	}
	r.current = cfg
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return r.get(), nil },
	}, nil
}

type certReloader struct {
	files TLSFiles
	log   *slog.Logger

	mu      sync.Mutex
	current *tls.Config
	checked time.Time
	mtimes  [3]time.Time
}

func (r *certReloader) mtimes3() ([3]time.Time, error) {
	var out [3]time.Time
	for i, p := range []string{r.files.CertFile, r.files.KeyFile, r.files.ClientCAFile} {
		if p == "" {
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return out, fmt.Errorf("xds: TLS file %s: %w", p, err)
		}
		out[i] = st.ModTime()
	}
	return out, nil
}

func (r *certReloader) load() (*tls.Config, error) {
	mt, err := r.mtimes3()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(r.files.CertFile, r.files.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("xds: TLS certificate %s / key %s: %w", r.files.CertFile, r.files.KeyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}
	if r.files.ClientCAFile != "" {
		pem, err := os.ReadFile(r.files.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("xds: client CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("xds: client CA file %s: no PEM certificate", r.files.ClientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	r.mtimes = mt
	return cfg, nil
}

func (r *certReloader) get() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) < certReloadEvery {
		return r.current
	}
	r.checked = time.Now()
	mt, err := r.mtimes3()
	if err != nil || mt == r.mtimes {
		return r.current
	}
	cfg, err := r.load()
	if err != nil {
		r.log.Error("xds: reloading the TLS certificates failed; the previous ones stay", "error", err)
		r.mtimes = mt // report a bad rotation once
		return r.current
	}
	r.log.Info("xds: TLS certificates reloaded", "cert", r.files.CertFile)
	r.current = cfg
	return cfg
}

// PodIdentity is the identity a pod runs as: its namespace and service account.
type PodIdentity struct{ Namespace, ServiceAccount string }

// SPIFFE returns the identity's path as Istio writes it in a SPIFFE id
// (spiffe://TRUST-DOMAIN/ns/NS/sa/SA), without the trust domain.
func (id PodIdentity) SPIFFE() string { return "/ns/" + id.Namespace + "/sa/" + id.ServiceAccount }

// ClaimedIdentity resolves an xDS node id as the server does (a pod key, an Istio sidecar id by
// pod, else by IP) against the last publication and returns the identity of the pod it claims.
// ok is false when the id claims no pod of the topology (it is served round-robin weights) or
// nothing is published yet.
func (s *Server) ClaimedIdentity(nodeID string) (id PodIdentity, pod string, ok bool) {
	s.nodesMu.Lock()
	pub := s.pub
	s.nodesMu.Unlock()
	if pub == nil {
		return PodIdentity{}, "", false
	}
	_, pod = pub.resourcesFor(nodeID, ProxylessGRPC) // the pod only; proxyless resources are prebuilt
	if pod == "" {
		return PodIdentity{}, "", false
	}
	id, ok = identities(pub.topology)[pod]
	return id, pod, ok
}

// identities indexes a topology's pods by key. The index of the last topology asked for is
// kept (a publication's topology is immutable), so streams opening in a burst share it.
func identities(t *optimizer.Topology) map[string]PodIdentity {
	if c := lastIdentities.Load(); c != nil && c.t == t {
		return c.ids
	}
	m := map[string]PodIdentity{}
	for i := range t.Services {
		s := &t.Services[i]
		for j := range s.Pods {
			p := &s.Pods[j]
			m[s.PodKey(p)] = PodIdentity{Namespace: s.NamespaceOrDefault(), ServiceAccount: p.ServiceAccount}
		}
	}
	lastIdentities.Store(&identityIndex{t: t, ids: m})
	return m
}

type identityIndex struct {
	t   *optimizer.Topology
	ids map[string]PodIdentity
}

var lastIdentities atomic.Pointer[identityIndex]

// IdentityCheck returns a stream interceptor for the xDS port under mutual TLS: a stream's
// first request must name a node, and the pod that node id claims (ClaimedIdentity) must run
// as an identity the client's certificate proves — a URI SAN ending in /ns/NS/sa/SA (Istio's
// SPIFFE form) — else the stream ends with PermissionDenied naming the node and the identity,
// before anything is served. A node id that claims no pod gets round-robin weights and is
// allowed; a pod without a known service account may be claimed by any certificate of its
// namespace.
func (s *Server) IdentityCheck() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		var first proto.Message = &discovery.DiscoveryRequest{}
		if strings.Contains(info.FullMethod, "Delta") {
			first = &discovery.DeltaDiscoveryRequest{}
		}
		if err := ss.RecvMsg(first); err != nil {
			return err
		}
		if err := s.checkIdentity(ss.Context(), first); err != nil {
			return err
		}
		return handler(srv, &replayStream{ServerStream: ss, first: first})
	}
}

func (s *Server) checkIdentity(ctx context.Context, req proto.Message) error {
	var node *core.Node
	switch r := req.(type) {
	case *discovery.DiscoveryRequest:
		node = r.GetNode()
	case *discovery.DeltaDiscoveryRequest:
		node = r.GetNode()
	}
	if node == nil {
		return status.Error(codes.InvalidArgument, "xds: the first request of a stream must name its node")
	}
	want, pod, ok := s.ClaimedIdentity(node.GetId())
	if !ok {
		return nil
	}
	uris := peerURIs(ctx)
	for _, u := range uris {
		if want.ServiceAccount == "" && strings.Contains(u, "/ns/"+want.Namespace+"/sa/") || strings.HasSuffix(u, want.SPIFFE()) {
			return nil
		}
	}
	s.log.Warn("xds: client certificate does not allow the pod identity its node id claims", "node", node.GetId(), "pod", pod, "want", want.SPIFFE(), "certificate", uris)
	return status.Errorf(codes.PermissionDenied, "xds: node %q claims pod %s, which runs as %s; the client certificate proves %v",
		node.GetId(), pod, want.SPIFFE(), uris)
}

// replayStream hands the handler the first request again, then the stream's own.
type replayStream struct {
	grpc.ServerStream
	first proto.Message
}

func (st *replayStream) RecvMsg(m any) error {
	if st.first != nil {
		proto.Merge(m.(proto.Message), st.first)
		st.first = nil
		return nil
	}
	return st.ServerStream.RecvMsg(m)
}

// peerURIs returns the URI SANs of the client's verified certificate.
func peerURIs(ctx context.Context) []string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil
	}
	var out []string
	for _, u := range ti.State.PeerCertificates[0].URIs {
		out = append(out, u.String())
	}
	return out
}
