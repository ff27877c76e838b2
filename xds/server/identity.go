package server

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
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/edgeflow/edgeflow/xds"
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

// DefaultTrustDomain is Istio's default trust domain.
const DefaultTrustDomain = "cluster.local"

// ClaimedIdentity resolves an xDS node id as the server does (a pod key, an Istio sidecar id by
// pod, else by IP) against the last publication and returns the identity of the pod it claims.
// ok is false when the id claims no pod of the topology (it is served round-robin weights) or
// nothing is published yet.
func (s *Server) ClaimedIdentity(nodeID string) (id PodIdentity, pod string, ok bool) {
	return s.currentPub().claimed(nodeID)
}

func (s *Server) currentPub() *publication {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	return s.pub
}

// claimed is ClaimedIdentity against p (nil: nothing published).
func (p *publication) claimed(nodeID string) (id PodIdentity, pod string, ok bool) {
	if p == nil {
		return PodIdentity{}, "", false
	}
	_, pod = p.resourcesFor(nodeID, xds.ProxylessGRPC) // the pod only; proxyless resources are prebuilt
	if pod == "" {
		return PodIdentity{}, "", false
	}
	id, ok = p.identities()[pod]
	return id, pod, ok
}

// identities indexes the publication's pods by key, once (the topology is immutable).
func (p *publication) identities() map[string]PodIdentity {
	p.idsOnce.Do(func() {
		t := p.topology
		m := map[string]PodIdentity{}
		for i := range t.Services {
			s := &t.Services[i]
			for j := range s.Pods {
				pd := &s.Pods[j]
				m[s.PodKey(pd)] = PodIdentity{Namespace: s.NamespaceOrDefault(), ServiceAccount: pd.ServiceAccount}
			}
		}
		p.ids = m
	})
	return p.ids
}

// Mutual TLS and node identity (Config.RequireIdentity): the pod a node id claims
// (ClaimedIdentity) must run as an identity the client's certificate proves — a URI SAN
// spiffe://TRUST-DOMAIN/ns/NS/sa/SA (Istio's form) in Config.TrustDomain — else the stream
// ends with PermissionDenied naming the node and the identity before anything is served, and a
// unary Fetch is refused the same way. The check runs at a stream's first request and again at
// every publication for every open stream: a stream whose claim no longer holds (its pod now
// runs as another account, or an id that claimed no pod now claims one the certificate does
// not prove) is closed with PermissionDenied and is sent nothing of the new publication. An id
// that claims no pod gets round-robin weights; a pod without a known service account may be
// claimed by any certificate of its namespace.

// checkClaim checks that the certificate identities uris prove the pod nodeID claims in pub.
func (s *Server) checkClaim(uris []string, nodeID string, pub *publication) error {
	want, pod, ok := pub.claimed(nodeID)
	if !ok {
		return nil
	}
	for _, u := range uris {
		ns, sa, ok := parseSPIFFE(u, s.cfg.TrustDomain)
		if ok && ns == want.Namespace && (want.ServiceAccount == "" || sa == want.ServiceAccount) {
			return nil
		}
	}
	s.log.Warn("xds: client certificate does not prove the pod identity its node id claims", "node", clip(nodeID), "pod", pod,
		"want", "spiffe://"+s.cfg.TrustDomain+want.SPIFFE(), "certificate", uris)
	return status.Errorf(codes.PermissionDenied, "xds: node %q claims pod %s, which runs as spiffe://%s%s; the client certificate proves %v",
		clip(nodeID), pod, s.cfg.TrustDomain, want.SPIFFE(), uris)
}

// parseSPIFFE parses a SPIFFE id (go-spiffe's rules) and returns the namespace and service
// account of its path /ns/NS/sa/SA; ok is false for another trust domain or path.
func parseSPIFFE(uri, trustDomain string) (ns, sa string, ok bool) {
	id, err := spiffeid.FromString(uri)
	if err != nil || id.TrustDomain().Name() != trustDomain {
		return "", "", false
	}
	parts := strings.Split(id.Path(), "/")
	if len(parts) != 5 || parts[0] != "" || parts[1] != "ns" || parts[3] != "sa" || parts[2] == "" || parts[4] == "" {
		return "", "", false
	}
	return parts[2], parts[4], true
}

// peerIdentities returns the URI SANs of the client's verified certificate.
func peerIdentities(ctx context.Context) []string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.PeerCertificates) == 0 {
		return nil
	}
	var out []string
	for _, u := range ti.State.PeerCertificates[0].URIs {
		out = append(out, u.String())
	}
	return out
}
