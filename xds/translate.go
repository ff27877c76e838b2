// Package xds turns edgeflow allocations into xDS resources for Envoy sidecars, Istio sidecars
// and proxyless gRPC clients, one set of resources per caller pod. It is pure: topology and
// allocation in, validated resources out (Translate), plus the vocabulary the server and tests
// share: the sets (Set, NodeResources), node kinds (ClassifyNode), wire encodings, and the
// rules a real Envoy rejects a response by (envoycheck.go). Package xds/server serves it.
//
// Files: translate.go (the entry points and types), build.go (per-service and per-node
// building), entry.go (content-addressed resources), envoy.go (plain Envoy's listeners and
// routes), resources.go (resource constructors), kinds.go (node kinds and Istio node ids),
// envoycheck.go (Envoy's rejection rules and the references between resources).
package xds

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"

	"github.com/edgeflow/edgeflow/optimizer"
)

// Encoding says how per-caller weights are written on the wire (docs/architecture.md, "The wire
// encoding").
type Encoding string

const (
	// EncodingLocality (the default) gives every callee service one cluster whose
	// ClusterLoadAssignment holds one LocalityLbEndpoints per callee pod the caller sends to
	// (sub_zone = pod name), weighted by the caller's integer weight; the caller's zero-flow
	// pods are never given weight 0 but sit in one failover locality at priority 1.
	EncodingLocality Encoding = "locality"
	// EncodingWeightedClusters gives every callee pod its own cluster (named SERVICE/POD) and
	// writes the caller's weights into the route's weighted_clusters; each per-pod cluster has
	// its pod at priority 0 and the service's other pods as the priority-1 failover. Pods
	// without weight are named in an unreachable second route (KeepClustersRoute), so that
	// clients keep every pod's cluster active: a gRPC client then connects to every pod of the
	// service, as plain round_robin does, and a weight shift never makes it add a cluster.
	EncodingWeightedClusters Encoding = "weighted-clusters"
)

// ParseEncoding returns the named encoding; "" is the default (locality).
func ParseEncoding(s string) (Encoding, error) {
	switch Encoding(s) {
	case "", EncodingLocality:
		return EncodingLocality, nil
	case EncodingWeightedClusters:
		return EncodingWeightedClusters, nil
	}
	return "", fmt.Errorf("xds: unknown encoding %q (want locality or weighted-clusters)", s)
}

// LBPolicy is the load-balancing policy a client runs over a callee service's endpoints: the
// Cluster's lb_policy.
type LBPolicy string

const (
	// LBRoundRobin (the default) is the Cluster's ROUND_ROBIN, which grpc-go runs as
	// xds_wrr_locality{round_robin}: a locality is picked by its weight (the caller's
	// allocation), then its endpoint round-robin.
	LBRoundRobin LBPolicy = "round-robin"
	// LBLeastRequest is the Cluster's LEAST_REQUEST with choice_count 2 (power of two choices:
	// of two endpoints drawn at random, the one with fewer requests in flight), which grpc-go
	// runs as least_request_experimental over all endpoints of a priority, locality weights
	// ignored (gRFC A48; on by default since grpc-go 1.73, and the gate
	// GRPC_EXPERIMENTAL_ENABLE_LEAST_REQUEST is gone since 1.74). It is a baseline, not an
	// allocation: every caller gets the same assignment, ONE locality at priority 0 holding
	// every pod of the callee, endpoints weighted by capacity (round-robin's weights; grpc-go
	// ignores endpoint weights, Envoy weighs them). The allocation is still checked against
	// the topology, but its weights do not reach the wire. Locality encoding only.
	LBLeastRequest LBPolicy = "least-request"
	// LBBands delivers the plan between latency bands and balances by least-request inside
	// one (docs/architecture.md, "Delivery"). A band is the callee pods on one node: every
	// pod of a band is the same distance from the caller, so the plan's cost does not depend
	// on how a band's flow is split among its pods, and a split by capacity gives every callee
	// pod exactly its planned load when every caller splits so (the planned flows into a node
	// sum to its pods' demands, which are proportional to capacity). Each caller's
	// ClusterLoadAssignment holds one locality per band its plan sends to (Zone = the node,
	// SubZone = BandSubZone), weighted by the caller's integer weights summed over the band,
	// with every pod of the node in it, endpoints weighted by capacity; bands without flow sit
	// in the priority-1 failover locality.
	//
	// Proxyless gRPC gets a Cluster whose load_balancing_policy is WrrLocality{LeastRequest}
	// (gRFC A52 custom policies, A48 least request; bandsGRPCCluster says what grpc-go reads);
	// plain Envoy nodes get LEAST_REQUEST with locality_weighted_lb_config and an explicit
	// active_request_bias (envoyCluster); Istio sidecars (per-pod mode) get the band
	// assignments only, into istiod's cluster, whose EnvoyFilter sets
	// locality_weighted_lb_config and whose lb_policy is Istio's default LEAST_REQUEST unless
	// a DestinationRule says otherwise. Locality encoding only.
	LBBands LBPolicy = "bands"
)

// LeastRequestChoiceCount is the choice_count of LBLeastRequest and LBBands.
const LeastRequestChoiceCount = 2

// ActiveRequestBias is LBBands' active_request_bias for Envoy nodes (Envoy's default, 1.0:
// an endpoint's weight is divided by its requests in flight plus one), and
// ActiveRequestBiasRuntimeKey the Envoy runtime key that overrides it without a push.
const (
	ActiveRequestBias           = 1.0
	ActiveRequestBiasRuntimeKey = "edgeflow.bands.active_request_bias"
)

// ParseLBPolicy returns the named load-balancing policy; "" is the default (round-robin).
func ParseLBPolicy(s string) (LBPolicy, error) {
	switch LBPolicy(s) {
	case "", LBRoundRobin:
		return LBRoundRobin, nil
	case LBLeastRequest, LBBands:
		return LBPolicy(s), nil
	}
	return "", fmt.Errorf("xds: unknown lb policy %q (want round-robin, least-request or bands)", s)
}

// TranslateConfig says how TranslateWith writes an allocation on the wire.
type TranslateConfig struct {
	// Encoding is the wire encoding of the weights ("" means locality).
	Encoding Encoding
	// LBPolicy is the clusters' load-balancing policy ("" means round-robin). LBLeastRequest
	// and LBBands need EncodingLocality.
	LBPolicy LBPolicy
	// ClusterDomain is the Kubernetes cluster's DNS domain, the suffix of the service FQDNs in
	// Istio's cluster names and plain Envoy's virtual hosts ("" means
	// optimizer.DefaultClusterDomain).
	ClusterDomain string
	// EgressPortOffset shifts plain Envoy nodes' outbound listeners: the listener for service
	// port P binds EnvoyListenerAddress:P+EgressPortOffset (and is named after that port), so
	// that it does not clash with an app of the pod that itself listens on P; the app then
	// dials NAME:P+EgressPortOffset, and the virtual hosts match that authority too. 0 (the
	// default) binds P itself; at most MaxEgressPortOffset. A port shifted past 65535 gets no
	// listener (Translation.Skipped says so).
	EgressPortOffset int
}

// MaxEgressPortOffset is the largest TranslateConfig.EgressPortOffset.
const MaxEgressPortOffset = 65534

// dnsName matches a DNS name of lowercase RFC 1123 labels, as a Kubernetes cluster domain is.
var dnsName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$`)

// Check fills in the defaults and rejects unknown or incompatible values.
func (c TranslateConfig) Check() (TranslateConfig, error) {
	enc, err := ParseEncoding(string(c.Encoding))
	if err != nil {
		return c, err
	}
	lb, err := ParseLBPolicy(string(c.LBPolicy))
	if err != nil {
		return c, err
	}
	if c.ClusterDomain != "" && !dnsName.MatchString(c.ClusterDomain) {
		return c, fmt.Errorf("xds: cluster domain %q is not a DNS name (lowercase labels of a-z, 0-9 and '-', separated by dots)", c.ClusterDomain)
	}
	if c.EgressPortOffset < 0 || c.EgressPortOffset > MaxEgressPortOffset {
		return c, fmt.Errorf("xds: egress port offset %d out of range [0, %d]", c.EgressPortOffset, MaxEgressPortOffset)
	}
	if (lb == LBLeastRequest || lb == LBBands) && enc != EncodingLocality {
		return c, fmt.Errorf("xds: lb policy %s needs the %s encoding, not %s (weighted clusters pick a pod's cluster by weight first)", lb, EncodingLocality, enc)
	}
	return TranslateConfig{Encoding: enc, LBPolicy: lb, ClusterDomain: cmp.Or(c.ClusterDomain, optimizer.DefaultClusterDomain), EgressPortOffset: c.EgressPortOffset}, nil
}

// WeightTotal is the fixed total over which one caller's fractions to one callee service are
// apportioned into integer weights (largest remainder), so the rounding error of a route is at
// most 1/WeightTotal.
const WeightTotal = 10000

// FractionTolerance is how far a caller's fractions to one callee service may sum from 1.
const FractionTolerance = 1e-6

var (
	// ErrInvalidAllocation is wrapped by every error about an allocation that does not fit its
	// topology; the message names the offending call, pod or route.
	ErrInvalidAllocation = errors.New("xds: invalid allocation")
	// ErrIncompleteTopology is wrapped when a callee pod cannot be an endpoint (no address, a
	// bad address, or an address another pod of its service already has).
	ErrIncompleteTopology = errors.New("xds: incomplete topology")
)

// Resource type indices of NodeResources.Sets, in the order clients resolve them.
const (
	ListenerSet = iota
	RouteSet
	ClusterSet
	EndpointSet
	NumSets
)

// SetNames are the xDS services' short names of the sets (as in metric labels), indexed like
// NodeResources.Sets.
var SetNames = [NumSets]string{"lds", "rds", "cds", "eds"}

// Set is the resources of one xDS type for one node, sorted by name, with a version that is a
// content hash of their names and bytes: the same resources give the same version in every
// process, so a restarted server hands reconnecting clients the versions they already hold.
type Set struct {
	Version string
	Items   []types.Resource
}

// NodeResources is everything one xDS node receives: Listeners, RouteConfigurations, Clusters
// and ClusterLoadAssignments (indexed by ListenerSet … EndpointSet). Values are shared between
// nodes and must not be modified.
type NodeResources struct {
	Sets [NumSets]Set
}

// Translation is the output of Translate: the resources of every pod of the topology, and the
// round-robin resources for xDS nodes the topology does not know, for every NodeKind.
//
// Pods and Default are what proxyless gRPC nodes get; Resources gives any kind's. The Envoy
// and Istio resources are assembled on first use (most deployments run one kind only), from
// entries shared with every other node that has the same weights.
type Translation struct {
	Encoding Encoding
	LBPolicy LBPolicy
	// Pods maps every pod of the topology to its proxyless gRPC resources. Pods that call
	// nothing share Default.
	Pods map[string]*NodeResources
	// Default serves every servable service round-robin (capacity weights).
	Default *NodeResources
	// Skipped says, one line each, what Envoy and Istio nodes do not get and why: a servable
	// service without ports, or a port that cannot be served. For the caller to log.
	Skipped []string
	// Pooled names the services delivered pooled, least-request over all their pods
	// (optimizer.Allocation.Pooled under LBBands; none under the other policies), sorted.
	Pooled []string

	b     *builder
	plans map[string][]callPlan // per caller pod

	mu    sync.Mutex                          // guards kinds and the services' derived entries after Translate
	kinds [NumKinds]map[string]*NodeResources // per kind, by pod; "" is the kind's default
}

// Translate turns an allocation of topology t into per-pod xDS resources.
//
// A caller's fractions to one callee service become integer weights summing to WeightTotal
// (largest remainder, so each route is within 1/WeightTotal of its fraction); pods whose
// weight is 0 go to the priority-1 failover locality.
//
// Every caller pod gets, for each service it calls, a Listener named after the callee service
// (gRPC target xds:///SERVICE), its RouteConfiguration, Cluster(s) and ClusterLoadAssignment(s)
// carrying its weights. Every other *servable* service (all its pods have addresses) is in its
// snapshot too, round-robin, so a call edge the topology does not know yet still works. That is
// what proxyless gRPC nodes get; Translation.Resources gives what plain Envoy and Istio nodes
// get (NodeKind), with the same weights, per service port.
//
// Rules (the xds package's "complete topology"): every pod of a service that some call edge
// targets must have an address "IP:PORT", unique within its service; services nobody calls
// are served only when all their pods have addresses. A violation wraps ErrIncompleteTopology.
// An allocation that does not fit t (unknown call, service or pod, a caller pod without routes,
// fractions that are negative, not finite or do not sum to 1 within FractionTolerance, a
// duplicate route) wraps ErrInvalidAllocation. Every resource passes its proto's ValidateAll,
// and the plain Envoy resources Envoy's rules too (CheckEnvoy).
//
// Complexity O(Σ callers × callee pods); resources shared by many pods are built and hashed once.
//
// Translate is TranslateWith(t, a, TranslateConfig{Encoding: enc}): round-robin clusters.
func Translate(t *optimizer.Topology, a *optimizer.Allocation, enc Encoding) (*Translation, error) {
	return TranslateWith(t, a, TranslateConfig{Encoding: enc})
}

// TranslateWith is Translate with the clusters' load-balancing policy chosen by cfg.LBPolicy.
// With LBLeastRequest every caller pod gets the callee's round-robin assignment as one
// locality (see LBLeastRequest), whatever its weights in a; with LBBands its weights summed
// per band (see LBBands).
func TranslateWith(t *optimizer.Topology, a *optimizer.Allocation, cfg TranslateConfig) (*Translation, error) {
	cfg, err := cfg.Check()
	if err != nil {
		return nil, err
	}
	enc := cfg.Encoding
	if t == nil || a == nil {
		return nil, fmt.Errorf("%w: nil topology or allocation", ErrInvalidAllocation)
	}
	b := &builder{enc: enc, lb: cfg.LBPolicy, domain: cfg.ClusterDomain, egressOffset: uint32(cfg.EgressPortOffset), services: map[string]*service{}, podService: map[string]*service{}}
	if b.lb == LBBands {
		// A pooled service takes least-request over all its pods (optimizer.Allocation.Pooled);
		// the other policies deliver no bands to release.
		b.pooled = map[string]bool{}
		for _, name := range a.Pooled {
			b.pooled[name] = true
		}
	}
	called := map[string]bool{}
	for _, c := range t.Calls {
		called[optimizer.CanonicalKey(c.To)] = true
	}
	for _, c := range a.Calls {
		called[c.To] = true
	}
	for i := range t.Services {
		s, err := newService(&t.Services[i], called[t.Services[i].Key()])
		if err != nil {
			return nil, err
		}
		if _, dup := b.services[s.name]; dup {
			return nil, fmt.Errorf("%w: service %q: duplicate name", ErrInvalidAllocation, s.name)
		}
		b.services[s.name] = s
		b.order = append(b.order, s)
		for _, p := range s.pods {
			if _, dup := b.podService[p.name]; dup {
				return nil, fmt.Errorf("%w: pod %q: duplicate name", ErrInvalidAllocation, p.name)
			}
			b.podService[p.name] = s
		}
	}
	for _, name := range a.Pooled {
		if _, ok := b.services[name]; !ok {
			return nil, fmt.Errorf("%w: pooled service %q is not in the topology", ErrInvalidAllocation, name)
		}
	}
	plans, err := b.checkAllocation(a)
	if err != nil {
		return nil, err
	}
	for _, s := range b.order {
		if s.servable {
			if err := b.buildShared(s); err != nil {
				return nil, err
			}
		}
	}
	for _, s := range b.order {
		if s.servable {
			if err := b.buildPorts(s); err != nil {
				return nil, err
			}
		}
	}
	if b.lb == LBLeastRequest {
		// Every caller gets the callee's shared round-robin entries (the same derived key).
		for _, calls := range plans {
			for i := range calls {
				calls[i].weights = calls[i].callee.rrWeights
			}
		}
	}
	if b.lb == LBBands {
		// Every caller's weights in the canonical band form (bandWeights): the same band
		// sums, the same derived entries; a pooled callee's callers all get its round-robin
		// entries, as under LBLeastRequest.
		for _, calls := range plans {
			for i := range calls {
				if calls[i].callee.allPods {
					calls[i].weights = calls[i].callee.rrWeights
				} else {
					calls[i].weights = bandWeights(calls[i].callee.bands, calls[i].weights)
				}
			}
		}
	}
	if err := b.buildEnvoyShared(); err != nil {
		return nil, err
	}
	tr := &Translation{Encoding: enc, LBPolicy: b.lb, Pods: map[string]*NodeResources{}, Skipped: b.skipped, b: b, plans: plans,
		Pooled: slices.Sorted(maps.Keys(b.pooled))}
	if tr.Default, err = b.node(nil); err != nil {
		return nil, err
	}
	for _, s := range b.order {
		for _, p := range s.pods {
			calls := plans[p.name]
			if len(calls) == 0 {
				tr.Pods[p.name] = tr.Default
				continue
			}
			if tr.Pods[p.name], err = b.node(calls); err != nil {
				return nil, err
			}
		}
	}
	return tr, nil
}

// CheckTopology applies Translate's "complete topology" rule to t alone: every pod of every
// service that a call targets has an address "IP:PORT", unique within its service. The error
// wraps ErrIncompleteTopology and names the pod. Sources use it to refuse a topology before
// the server would.
func CheckTopology(t *optimizer.Topology) error {
	called := map[string]bool{}
	for _, c := range t.Calls {
		called[optimizer.CanonicalKey(c.To)] = true
	}
	for i := range t.Services {
		if _, err := newService(&t.Services[i], called[t.Services[i].Key()]); err != nil {
			return err
		}
	}
	return nil
}
