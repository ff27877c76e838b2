package xds

import (
	"fmt"
	"net/netip"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/edgeflow/edgeflow/optimizer"
)

// NodeKind is the kind of xDS client behind a node. It decides which resources the node gets
// (docs/architecture.md, "Integration modes"); the weights are the same for every kind.
type NodeKind uint8

const (
	// ProxylessGRPC is a gRPC client with the xDS resolver, dialling xds:///SERVICE: per
	// callee service an api_listener, a RouteConfiguration, Cluster(s) and
	// ClusterLoadAssignment(s), all named by the service key (Translate). Every node that is
	// not one of the kinds below is one.
	ProxylessGRPC NodeKind = iota
	// Envoy is a plain Envoy whose bootstrap points ADS at edgeflow: real socket listeners,
	// one per service port (EnvoyListenerAddress:PORT, named ListenerName(PORT)), each with an
	// HTTP connection manager taking RouteConfiguration RouteName(PORT) from ADS, in which
	// every service with that port has a virtual host; per service port an EDS cluster named
	// as Istio names it (optimizer.Service.IstioClusterName) and its ClusterLoadAssignment.
	Envoy
	// IstioSidecar is an Istio sidecar (node id "sidecar~IP~POD.NS~NS.svc.cluster.local").
	// istiod serves its listeners, routes and clusters; an EnvoyFilter points the EDS of the
	// managed services' outbound clusters at edgeflow, so it gets ClusterLoadAssignments
	// only, named by Istio's cluster names and carrying Istio's mTLS endpoint metadata.
	IstioSidecar
	NumKinds
)

// String names the kind as logs and metrics show it.
func (k NodeKind) String() string {
	switch k {
	case ProxylessGRPC:
		return "grpc"
	case Envoy:
		return "envoy"
	case IstioSidecar:
		return "istio"
	}
	return fmt.Sprintf("NodeKind(%d)", uint8(k))
}

// EnvoyUserAgent is the user_agent_name every Envoy puts in its xDS node (Istio's sidecars
// included; grpc-go sends "gRPC Go").
const EnvoyUserAgent = "envoy"

// ClassifyNode tells the kind of an xDS node: an Istio sidecar id (ParseSidecarID) is
// IstioSidecar, else a user_agent_name of EnvoyUserAgent is Envoy, else ProxylessGRPC.
func ClassifyNode(n *core.Node) NodeKind {
	if _, _, ok := ParseSidecarID(n.GetId()); ok {
		return IstioSidecar
	}
	if n.GetUserAgentName() == EnvoyUserAgent {
		return Envoy
	}
	return ProxylessGRPC
}

// Resources returns what an xDS node of the given kind gets when it is pod (a pod key of the
// topology; "" or an unknown pod gets the kind's round-robin default). It never returns nil.
//
// ProxylessGRPC is Pods[pod], else Default. The Envoy and Istio resources of a pod are built
// on its first call and kept: the listeners, routes and clusters are one set shared by all
// Envoy nodes, and each ClusterLoadAssignment is shared by every caller with the same weights
// to that service. They are not validated again: they differ from resources Translate
// validated (every service port's round-robin assignment, the Envoy sets) only in the weights,
// which are the caller's, already validated in its proxyless assignments.
//
// Safe for concurrent use; the first call for a pod costs O(its callee pods × ports).
func (t *Translation) Resources(pod string, kind NodeKind) *NodeResources {
	if kind == ProxylessGRPC || kind >= NumKinds {
		if r, ok := t.Pods[pod]; ok {
			return r
		}
		return t.Default
	}
	calls := t.plans[pod]
	if len(calls) == 0 {
		pod = "" // calls nothing, or not a pod: the kind's round-robin default
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.kinds[kind][pod]; r != nil {
		return r
	}
	r := t.b.kindNode(kind, calls)
	if t.kinds[kind] == nil {
		t.kinds[kind] = map[string]*NodeResources{}
	}
	t.kinds[kind][pod] = r
	return r
}

// ParseSidecarID splits an Istio sidecar node id "sidecar~IP~POD.NS~NS.svc.cluster.local" into
// the pod name and IP. Pod names may contain dots; the namespace is taken from the last field.
// A dotted pod name in the default namespace is not returned (only the IP): its key would read
// as POD.NAMESPACE, another namespace's pod (optimizer.QualifiedName), and the watcher leaves
// such pods out (kube.SkipAmbiguousName).
func ParseSidecarID(id string) (pod, ip string, ok bool) {
	parts := strings.Split(id, "~")
	if len(parts) != 4 || parts[0] != "sidecar" {
		return "", "", false
	}
	ns, _, _ := strings.Cut(parts[3], ".")
	pod = strings.TrimSuffix(parts[2], "."+ns)
	if ns == optimizer.DefaultNamespace && strings.Contains(pod, ".") {
		pod = ""
	}
	if a, err := netip.ParseAddr(parts[1]); err == nil {
		ip = a.Unmap().String()
	}
	return pod, ip, pod != "" || ip != ""
}

// SidecarNamespace is the namespace field of an Istio sidecar id ("" if it is not one).
func SidecarNamespace(id string) string {
	parts := strings.Split(id, "~")
	if len(parts) != 4 {
		return ""
	}
	ns, _, _ := strings.Cut(parts[3], ".")
	return ns
}
