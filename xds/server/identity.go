package server

import (
	"context"
	"crypto/tls"
	"log/slog"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/edgeflow/edgeflow/internal/certfile"
	"github.com/edgeflow/edgeflow/xds"
)

// TLSFiles names the xDS port's certificate files (PEM).
type TLSFiles = certfile.Files

// NewTLSConfig returns the xDS port's TLS configuration. The files are read now (an error
// names the file) and re-read when they change (package certfile), so a rotated certificate
// takes effect without a restart.
func NewTLSConfig(f TLSFiles, logger *slog.Logger) (*tls.Config, error) {
	src, err := certfile.New(f, "xds", logger)
	if err != nil {
		return nil, err
	}
	return src.ServerConfig(), nil
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
