// Package optimizer computes edgeflow's traffic allocations (LATA and its baselines) and replica
// placements (LARP) from a plain Topology. It is pure: it imports no Kubernetes, gRPC or
// Prometheus package, so a topology file, a test or the cluster watcher can all feed it.
package optimizer

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
)

// ErrInvalidTopology is wrapped by every validation error; the message names the offending item.
var ErrInvalidTopology = errors.New("optimizer: invalid topology")

// MaxLatencyMS bounds a latency value (10 s). Larger values are rejected: they are certainly
// unit mistakes, and the bound keeps the solver's integer costs (1 µs quanta, shifted by
// TieBreakBits) below the solver's limit of 2^32.
const MaxLatencyMS = 1e4

// Topology is the input of every policy: nodes, the latency between them, services with their
// pods, the call graph and the ingress rates. It is the topology file of `plan` and `place`
// (docs/reference/topology-file.md) and the snapshot the cluster watcher produces. A Topology is treated as
// immutable once handed to the optimizer or the xDS server.
type Topology struct {
	// LatencyGranularity says what the Latency entries name: "" or LatencyPerNode, nodes; or
	// LatencyPerZone, zones (ZoneOf: a node's region/zone, or the node's own name when it has no
	// zone), every node taking its zone's latencies. Per zone, the model holds zones × zones
	// values and never a node × node matrix, and the policies plan between zones
	// (PlanZones).
	LatencyGranularity string    `json:"latency_granularity,omitempty" yaml:"latency_granularity,omitempty"`
	Nodes              []Node    `json:"nodes" yaml:"nodes"`
	Latency            []Latency `json:"latency,omitempty" yaml:"latency,omitempty"`
	Services           []Service `json:"services" yaml:"services"`
	Calls              []Call    `json:"calls,omitempty" yaml:"calls,omitempty"`
	Ingress            []Ingress `json:"ingress,omitempty" yaml:"ingress,omitempty"`
}

// Node is a machine that runs pods. CPU is in millicores and Memory in MiB (allocatable); both
// matter only to placement.
type Node struct {
	Name   string `json:"name" yaml:"name"`
	CPU    int64  `json:"cpu,omitempty" yaml:"cpu,omitempty"`
	Memory int64  `json:"memory,omitempty" yaml:"memory,omitempty"`
	// Cores is the number of cores the node's pods share (CoreCount); 0 means CPU's millicores
	// rounded up. No policy reads it: the emulated testbeds (internal/demo) run a node's pods on
	// that many shared cores.
	Cores int `json:"cores,omitempty" yaml:"cores,omitempty"`
	// Locality is the node's "region/zone/subzone" as Istio reads it from the node's labels
	// (topology.kubernetes.io/region, topology.kubernetes.io/zone, topology.istio.io/subzone);
	// "" when the node has none. The Istio DestinationRule mode reads it (GroupByLocality), and
	// a topology with latency per zone takes the node's zone from it (ZoneOf).
	Locality string `json:"locality,omitempty" yaml:"locality,omitempty"`
}

// Latency is a measured latency in milliseconds from one node to another (from one zone to
// another when the topology's LatencyGranularity is LatencyPerZone). One direction given means
// both; a node's (zone's) latency to itself is 0 unless given.
type Latency struct {
	From string  `json:"from" yaml:"from"`
	To   string  `json:"to" yaml:"to"`
	MS   float64 `json:"ms" yaml:"ms"`
}

// Service is a set of interchangeable pods. CPU (millicores) and Memory (MiB) are per-pod
// requests. Pods are the placed pods (plan, serve); Replicas is the pod count to place (place);
// when Replicas is 0 it is len(Pods).
//
// A service is identified by Name and Namespace ("" means DefaultNamespace); Key is how calls,
// ingress, allocations and xDS resource names refer to it. Ports are the service's ports (as a
// Kubernetes Service has them); they name Istio's clusters (IstioClusterName).
type Service struct {
	Name      string `json:"name" yaml:"name"`
	Namespace string `json:"namespace,omitempty" yaml:"namespace,omitempty"`
	Ports     []Port `json:"ports,omitempty" yaml:"ports,omitempty"`
	CPU       int64  `json:"cpu,omitempty" yaml:"cpu,omitempty"`
	Memory    int64  `json:"memory,omitempty" yaml:"memory,omitempty"`
	// CPULimit is each pod's CPU limit in millicores (its application containers' limits.cpu;
	// 0: none). A limited pod is throttled by CFS quota past it: lata-q prices its queueing
	// by the quota's model (podQueue), not as one M/M/1 server.
	CPULimit int64 `json:"cpu_limit,omitempty" yaml:"cpu_limit,omitempty"`
	// QueueScale, in (0, 1], is the share of the quota model's wait (the part past the CPU a
	// request takes) lata-q prices a pod of this service at; 0 means 1, all of it. The closed
	// loop sets it from the waits it measures (watcher/estimate.WaitScaler): the model is an
	// upper bound. Only services with a CPULimit read it.
	QueueScale float64 `json:"queue_scale,omitempty" yaml:"queue_scale,omitempty"`
	Pods       []Pod   `json:"pods,omitempty" yaml:"pods,omitempty"`
	Replicas   int     `json:"replicas,omitempty" yaml:"replicas,omitempty"`
	// Selector is the label selector of the service's pods (a Kubernetes Service's
	// spec.selector). The Istio DestinationRule mode selects a caller's sidecars with it; a
	// topology file that gives none means {app: NAME}, Istio's and Bookinfo's convention.
	Selector map[string]string `json:"selector,omitempty" yaml:"selector,omitempty"`
	// CapacityRPS, when set, is the service rate μ in requests/s of a pod of weight 1: each pod
	// serves CapacityRPS × its weight, unless it gives its own. Only the lata-q policy reads it.
	CapacityRPS *float64 `json:"capacity_rps,omitempty" yaml:"capacity_rps,omitempty"`
}

// Port is one port of a service: Port is the service port (what callers dial and what Istio's
// cluster names carry), TargetPort the pod's port (0 means the same as Port). A file may still
// give TargetPort as targetPort, its key before target_port (see UnmarshalYAML).
type Port struct {
	Name       string `json:"name,omitempty" yaml:"name,omitempty"`
	Port       int32  `json:"port" yaml:"port"`
	TargetPort int32  `json:"target_port,omitempty" yaml:"target_port,omitempty"`
}

// Pod is one ready replica of a service (a pod that is not ready is not in a Topology: sources
// leave it out). It lives in its service's namespace. Weight is its relative capacity (nil
// means 1). IP is the pod's IP, and Address the HOST:PORT endpoint the xDS server advertises for
// it (optional offline); when Address is empty and both IP and the service's first port are
// known, the address is IP:TargetPort (Endpoint).
type Pod struct {
	Name    string   `json:"name" yaml:"name"`
	Node    string   `json:"node,omitempty" yaml:"node,omitempty"`
	Weight  *float64 `json:"weight,omitempty" yaml:"weight,omitempty"`
	IP      string   `json:"ip,omitempty" yaml:"ip,omitempty"`
	Address string   `json:"address,omitempty" yaml:"address,omitempty"`
	// ServiceAccount is the pod's Kubernetes service account: with mutual TLS on the xDS port,
	// only a client whose certificate names it may claim the pod's identity. A file may still
	// give it as serviceAccount, its key before service_account (see UnmarshalYAML).
	ServiceAccount string `json:"service_account,omitempty" yaml:"service_account,omitempty"`
	// CapacityRPS, when set, is this pod's service rate μ in requests/s, overriding its
	// service's. Only the lata-q policy reads it.
	CapacityRPS *float64 `json:"capacity_rps,omitempty" yaml:"capacity_rps,omitempty"`
	// Sidecar says whether the pod runs an Istio sidecar that terminates Istio mTLS (HasSidecar):
	// only such a pod's endpoints carry Istio's tlsMode metadata, so a caller's sidecar sends it
	// mTLS and sends plain text to the others, as istiod does. The cluster watcher sets it from
	// the pod's label SidecarLabel=SidecarLabelValue; nil (a topology file that does not say)
	// means true, since a file describing an Istio mesh lists injected pods.
	Sidecar *bool `json:"sidecar,omitempty" yaml:"sidecar,omitempty"`
}

// SidecarLabel and SidecarLabelValue are the pod label Istio's injector sets on a pod whose
// sidecar takes Istio mTLS; istiod reads the endpoint's tlsMode from this label only, absent
// meaning "disabled" (istio/istio pilot/pkg/model/service.go GetTLSModeFromEndpointLabels,
// label.SecurityTlsMode of istio.io/api), and writes tlsMode metadata for the endpoints of such
// pods only.
const (
	SidecarLabel      = "security.istio.io/tlsMode"
	SidecarLabelValue = "istio"
)

// Latency granularities (Topology.LatencyGranularity).
const (
	LatencyPerNode = "node"
	LatencyPerZone = "zone"
)

// ZoneOf is the zone a node takes its latencies from when they are given per zone: its
// locality truncated to "region/zone", or, when its locality names no zone, the node's own
// name (such a node is a zone of its own). A Kubernetes node name holds no '/', so a zone
// named after a node never equals a region/zone.
func ZoneOf(n Node) string {
	region, zone, _ := SplitLocality(n.Locality)
	if zone == "" {
		return n.Name
	}
	return region + "/" + zone
}

// CoreCount is the number of cores the node's pods share: Cores when set, else CPU in
// millicores rounded up to whole cores, else 0 (not known: unlimited).
func (n Node) CoreCount() int {
	if n.Cores > 0 {
		return n.Cores
	}
	if n.CPU > 0 {
		return int((n.CPU + 999) / 1000)
	}
	return 0
}

// HasSidecar reports whether the pod runs an Istio sidecar: Sidecar, true when unset.
func (p *Pod) HasSidecar() bool { return p.Sidecar == nil || *p.Sidecar }

// Call is a call edge: each request to From makes Rate requests to To (nil means 1).
type Call struct {
	From string   `json:"from" yaml:"from"`
	To   string   `json:"to" yaml:"to"`
	Rate *float64 `json:"rate,omitempty" yaml:"rate,omitempty"`
}

// Ingress is the external request rate into a service, in requests per second.
type Ingress struct {
	Service string  `json:"service" yaml:"service"`
	RPS     float64 `json:"rps" yaml:"rps"`
}

// DefaultNamespace is the namespace of a service that names none.
const DefaultNamespace = "default"

// DefaultClusterDomain is the Kubernetes cluster's DNS domain when none is given: the suffix
// of a service's FQDN NAME.NAMESPACE.svc.DOMAIN, which Istio's cluster names carry.
const DefaultClusterDomain = "cluster.local"

// NamespaceOrDefault returns the service's namespace, DefaultNamespace when empty.
func (s *Service) NamespaceOrDefault() string {
	if s.Namespace == "" {
		return DefaultNamespace
	}
	return s.Namespace
}

// Key is how the topology refers to the service: its Name in the default namespace (so files
// without namespaces read as before), else "NAME.NAMESPACE" — the name a client in another
// namespace resolves. Calls and ingress may also name a default-namespace service
// "NAME.default".
func (s *Service) Key() string { return QualifiedName(s.Name, s.Namespace) }

// PodKey is how the topology refers to one of the service's pods: the pod's name in the
// default namespace, else "POD.NAMESPACE" (pod names are unique only within a namespace). It
// is the caller and callee name in allocations and the node id a proxyless gRPC pod uses.
func (s *Service) PodKey(p *Pod) string { return QualifiedName(p.Name, s.Namespace) }

// CanonicalKey maps a service reference to its Key: "NAME.default" is "NAME".
func CanonicalKey(ref string) string {
	if name, ok := strings.CutSuffix(ref, "."+DefaultNamespace); ok && name != "" {
		return name
	}
	return ref
}

// QualifiedName is name in the default namespace, else "name.namespace".
func QualifiedName(name, namespace string) string {
	if namespace == "" || namespace == DefaultNamespace {
		return name
	}
	return name + "." + namespace
}

// FQDN is the service's host name in a cluster whose DNS domain is domain ("" means
// DefaultClusterDomain): "NAME.NAMESPACE.svc.DOMAIN".
func (s *Service) FQDN(domain string) string {
	if domain == "" {
		domain = DefaultClusterDomain
	}
	return s.Name + "." + s.NamespaceOrDefault() + ".svc." + domain
}

// IstioClusterName is the name of the outbound cluster an Istio sidecar has for the service's
// port in a cluster whose DNS domain is domain ("" means DefaultClusterDomain):
// "outbound|PORT||NAME.NAMESPACE.svc.DOMAIN".
func (s *Service) IstioClusterName(port int32, domain string) string {
	return fmt.Sprintf("outbound|%d||%s", port, s.FQDN(domain))
}

// Endpoint is the HOST:PORT the pod is served at: Address when given, else IP with the
// service's first port's target port, else "".
func (s *Service) Endpoint(p *Pod) string {
	if p.Address != "" {
		return p.Address
	}
	if p.IP == "" || len(s.Ports) == 0 {
		return ""
	}
	port := s.Ports[0].TargetPort
	if port == 0 {
		port = s.Ports[0].Port
	}
	return net.JoinHostPort(p.IP, strconv.Itoa(int(port)))
}

// CapacityWeight returns the pod's capacity weight (1 when unset).
func (p Pod) CapacityWeight() float64 {
	if p.Weight == nil {
		return 1
	}
	return *p.Weight
}

// CallRate returns the call's rate (1 when unset).
func (c Call) CallRate() float64 {
	if c.Rate == nil {
		return 1
	}
	return *c.Rate
}

// ReplicaCount is the number of pods placement must place for the service.
func (s Service) ReplicaCount() int {
	if s.Replicas > 0 {
		return s.Replicas
	}
	return len(s.Pods)
}

// Clone returns a deep copy, so a caller can derive a new topology without touching one that
// is already shared.
func (t *Topology) Clone() *Topology {
	c := &Topology{
		LatencyGranularity: t.LatencyGranularity,
		Nodes:              append([]Node(nil), t.Nodes...),
		Latency:            append([]Latency(nil), t.Latency...),
		Services:           make([]Service, len(t.Services)),
		Calls:              make([]Call, len(t.Calls)),
		Ingress:            append([]Ingress(nil), t.Ingress...),
	}
	for i, s := range t.Services {
		s.Pods = append([]Pod(nil), s.Pods...)
		s.Ports = append([]Port(nil), s.Ports...)
		s.Selector = maps.Clone(s.Selector)
		s.CapacityRPS = cloneFloat(s.CapacityRPS)
		for j := range s.Pods {
			s.Pods[j].Weight = cloneFloat(s.Pods[j].Weight)
			s.Pods[j].CapacityRPS = cloneFloat(s.Pods[j].CapacityRPS)
		}
		c.Services[i] = s
	}
	for i, e := range t.Calls {
		if e.Rate != nil {
			v := *e.Rate
			e.Rate = &v
		}
		c.Calls[i] = e
	}
	return c
}

func cloneFloat(p *float64) *float64 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidTopology}, args...)...)
}
