// Package xds turns edgeflow allocations into xDS resources and serves them to Envoy sidecars
// and proxyless gRPC clients, one snapshot per caller pod. The translator (Translate) is pure:
// allocation plus endpoints in, validated resources out. The server (Server) wires a
// go-control-plane snapshot cache, debounced pushes and the gRPC discovery services.
package xds

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"sync"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeflow/edgeflow/optimizer"
)

// Encoding says how per-caller weights are written on the wire (DESIGN.md, "The wire encoding").
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
)

// LeastRequestChoiceCount is LBLeastRequest's choice_count.
const LeastRequestChoiceCount = 2

// ParseLBPolicy returns the named load-balancing policy; "" is the default (round-robin).
func ParseLBPolicy(s string) (LBPolicy, error) {
	switch LBPolicy(s) {
	case "", LBRoundRobin:
		return LBRoundRobin, nil
	case LBLeastRequest:
		return LBLeastRequest, nil
	}
	return "", fmt.Errorf("xds: unknown lb policy %q (want round-robin or least-request)", s)
}

// TranslateConfig says how TranslateWith writes an allocation on the wire.
type TranslateConfig struct {
	// Encoding is the wire encoding of the weights ("" means locality).
	Encoding Encoding
	// LBPolicy is the clusters' load-balancing policy ("" means round-robin). LBLeastRequest
	// needs EncodingLocality.
	LBPolicy LBPolicy
	// ClusterDomain is the Kubernetes cluster's DNS domain, the suffix of the service FQDNs in
	// Istio's cluster names and plain Envoy's virtual hosts ("" means
	// optimizer.DefaultClusterDomain).
	ClusterDomain string
}

// dnsName matches a DNS name of lowercase RFC 1123 labels, as a Kubernetes cluster domain is.
var dnsName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$`)

// check fills in the defaults and rejects unknown or incompatible values.
func (c TranslateConfig) check() (TranslateConfig, error) {
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
	if lb == LBLeastRequest && enc != EncodingLocality {
		return c, fmt.Errorf("xds: lb policy %s needs the %s encoding, not %s (weighted clusters pick a pod's cluster by weight first)", lb, EncodingLocality, enc)
	}
	return TranslateConfig{Encoding: enc, LBPolicy: lb, ClusterDomain: cmp.Or(c.ClusterDomain, optimizer.DefaultClusterDomain)}, nil
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
	numSets
)

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
	Sets [numSets]Set
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

	b     *builder
	plans map[string][]callPlan // per caller pod

	mu    sync.Mutex                          // guards kinds and the services' derived entries after Translate
	kinds [numKinds]map[string]*NodeResources // per kind, by pod; "" is the kind's default
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
// and the plain Envoy resources Envoy's rules too (checkEnvoyNode).
//
// Complexity O(Σ callers × callee pods); resources shared by many pods are built and hashed once.
//
// Translate is TranslateWith(t, a, TranslateConfig{Encoding: enc}): round-robin clusters.
func Translate(t *optimizer.Topology, a *optimizer.Allocation, enc Encoding) (*Translation, error) {
	return TranslateWith(t, a, TranslateConfig{Encoding: enc})
}

// TranslateWith is Translate with the clusters' load-balancing policy chosen by cfg.LBPolicy.
// With LBLeastRequest every caller pod gets the callee's round-robin assignment as one
// locality (see LBLeastRequest), whatever its weights in a.
func TranslateWith(t *optimizer.Topology, a *optimizer.Allocation, cfg TranslateConfig) (*Translation, error) {
	cfg, err := cfg.check()
	if err != nil {
		return nil, err
	}
	enc := cfg.Encoding
	if t == nil || a == nil {
		return nil, fmt.Errorf("%w: nil topology or allocation", ErrInvalidAllocation)
	}
	b := &builder{enc: enc, lb: cfg.LBPolicy, domain: cfg.ClusterDomain, services: map[string]*service{}, podService: map[string]*service{}}
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
	if err := b.buildEnvoyShared(); err != nil {
		return nil, err
	}
	tr := &Translation{Encoding: enc, LBPolicy: b.lb, Pods: map[string]*NodeResources{}, Skipped: b.skipped, b: b, plans: plans}
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

// pod is a callee-side view of an optimizer.Pod.
type pod struct {
	name, node string
	capacity   float64
	host       string
	port       uint32
	hasAddress bool
	sidecar    bool // an Istio sidecar takes mTLS for it (optimizer.Pod.HasSidecar)
}

// service holds a service's pods and the resources every caller shares.
type service struct {
	name     string
	src      *optimizer.Service // name, namespace and ports
	pods     []pod
	index    map[string]int
	servable bool

	allPods   bool                     // LBLeastRequest: every assignment is one locality of all pods
	locality  []*core.Locality         // per pod
	lbEps     [][]*endpoint.LbEndpoint // per pod, one endpoint
	fallback  []*endpoint.LbEndpoint   // per pod, for the failover locality: weighted by capacity
	listener  entry
	cluster   entry   // locality encoding
	rrCLA     entry   // locality encoding: round-robin assignment
	podClus   []entry // weighted clusters: one cluster per pod
	podCLA    []entry // weighted clusters: the pod at priority 0, the others at priority 1
	route     entry   // locality encoding: shared route to the service cluster
	rrRoute   entry   // weighted clusters: round-robin route
	rrWeights []int64
	sum       [sha256.Size]byte // content of everything above that per-caller resources derive from
	derived   map[string]entry  // per-caller resources by kind and weights: callers with equal weights share one
	ports     []servicePort     // Envoy and Istio nodes: one cluster per service port
}

func newService(s *optimizer.Service, called bool) (*service, error) {
	svcKey := s.Key()
	sv := &service{name: svcKey, src: s, index: map[string]int{}, servable: len(s.Pods) > 0}
	seen := map[string]string{}
	var firstErr error
	for i := range s.Pods {
		p := s.Pods[i]
		p.Name, p.Address = s.PodKey(&p), s.Endpoint(&p)
		sv.index[p.Name] = i
		ep := pod{name: p.Name, node: p.Node, capacity: p.CapacityWeight(), sidecar: p.HasSidecar()}
		err := func() error {
			if p.Address == "" {
				return fmt.Errorf("%w: pod %q (service %q) has no address", ErrIncompleteTopology, p.Name, svcKey)
			}
			host, port, err := parseAddress(p.Address)
			if err != nil {
				return fmt.Errorf("%w: pod %q (service %q): address %q: %v", ErrIncompleteTopology, p.Name, svcKey, p.Address, err)
			}
			key := net2key(host, port)
			if other, dup := seen[key]; dup {
				return fmt.Errorf("%w: pod %q (service %q): address %q is also pod %q's", ErrIncompleteTopology, p.Name, svcKey, p.Address, other)
			}
			seen[key] = p.Name
			ep.host, ep.port, ep.hasAddress = host, port, true
			return nil
		}()
		if err != nil {
			sv.servable = false
			if firstErr == nil {
				firstErr = err
			}
		}
		if badWeight(ep.capacity) {
			return nil, fmt.Errorf("%w: pod %q (service %q): capacity weight %v", ErrInvalidAllocation, p.Name, svcKey, ep.capacity)
		}
		sv.pods = append(sv.pods, ep)
	}
	if called && firstErr != nil {
		return nil, firstErr
	}
	if called && len(s.Pods) == 0 {
		return nil, fmt.Errorf("%w: service %q is called but has no pods", ErrIncompleteTopology, svcKey)
	}
	return sv, nil
}

func badWeight(w float64) bool { return math.IsNaN(w) || math.IsInf(w, 0) || w < 0 }

func net2key(host string, port uint32) string { return host + "|" + strconv.Itoa(int(port)) }

// parseAddress splits "IP:PORT"; Envoy's EDS needs an IP, not a host name.
func parseAddress(s string) (string, uint32, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return "", 0, fmt.Errorf("want IP:PORT (%v)", err)
	}
	if ap.Port() == 0 {
		return "", 0, errors.New("port 0")
	}
	return ap.Addr().Unmap().String(), uint32(ap.Port()), nil
}

// callPlan is one caller pod's weights to one callee service, in the callee's pod order.
type callPlan struct {
	callee  *service
	weights []int64
}

type builder struct {
	enc        Encoding
	lb         LBPolicy
	domain     string // the cluster's DNS domain
	services   map[string]*service
	order      []*service
	podService map[string]*service
	envoy      [EndpointSet]Set // plain Envoy nodes' listeners, routes and clusters: the same for every node
	skipped    []string
}

// checkAllocation validates a against the topology and turns every caller's fractions into
// integer weights. It returns, per caller pod, its plans ordered by callee service name.
func (b *builder) checkAllocation(a *optimizer.Allocation) (map[string][]callPlan, error) {
	plans := map[string][]callPlan{}
	seenCall := map[[2]string]bool{}
	for _, c := range a.Calls {
		call := c.From + " → " + c.To
		from, okF := b.services[c.From]
		to, okT := b.services[c.To]
		switch {
		case !okF:
			return nil, fmt.Errorf("%w: call %s: unknown service %q", ErrInvalidAllocation, call, c.From)
		case !okT:
			return nil, fmt.Errorf("%w: call %s: unknown service %q", ErrInvalidAllocation, call, c.To)
		case seenCall[[2]string{c.From, c.To}]:
			return nil, fmt.Errorf("%w: call %s: listed twice", ErrInvalidAllocation, call)
		}
		seenCall[[2]string{c.From, c.To}] = true
		fractions := make(map[string][]float64, len(from.pods))
		seenRoute := make(map[[2]string]bool, len(c.Routes))
		for _, r := range c.Routes {
			if _, ok := from.index[r.Caller]; !ok {
				return nil, fmt.Errorf("%w: call %s: route from %q: not a pod of %q", ErrInvalidAllocation, call, r.Caller, c.From)
			}
			qi, ok := to.index[r.Callee]
			if !ok {
				return nil, fmt.Errorf("%w: call %s: route %s → %s: %q is not a pod of %q", ErrInvalidAllocation, call, r.Caller, r.Callee, r.Callee, c.To)
			}
			if math.IsNaN(r.Fraction) || math.IsInf(r.Fraction, 0) || r.Fraction < 0 || r.Fraction > 1+FractionTolerance {
				return nil, fmt.Errorf("%w: call %s: route %s → %s: fraction %v", ErrInvalidAllocation, call, r.Caller, r.Callee, r.Fraction)
			}
			if seenRoute[[2]string{r.Caller, r.Callee}] {
				return nil, fmt.Errorf("%w: call %s: route %s → %s: listed twice", ErrInvalidAllocation, call, r.Caller, r.Callee)
			}
			seenRoute[[2]string{r.Caller, r.Callee}] = true
			f := fractions[r.Caller]
			if f == nil {
				f = make([]float64, len(to.pods))
				fractions[r.Caller] = f
			}
			f[qi] = r.Fraction
		}
		for _, p := range from.pods {
			f := fractions[p.name]
			if f == nil {
				return nil, fmt.Errorf("%w: call %s: caller pod %q has no routes", ErrInvalidAllocation, call, p.name)
			}
			var sum float64
			for _, x := range f {
				sum += x
			}
			if math.Abs(sum-1) > FractionTolerance {
				return nil, fmt.Errorf("%w: call %s: caller pod %q: fractions sum to %v, not 1", ErrInvalidAllocation, call, p.name, sum)
			}
			plans[p.name] = append(plans[p.name], callPlan{callee: to, weights: optimizer.LargestRemainder(f, WeightTotal)})
		}
	}
	for _, ps := range plans {
		sort.Slice(ps, func(i, j int) bool { return ps[i].callee.name < ps[j].callee.name })
	}
	return plans, nil
}

// capacityWeights apportions WeightTotal over the pods' capacity weights. When every capacity
// is zero the pods share equally.
func capacityWeights(pods []pod) []int64 {
	w := make([]float64, len(pods))
	var sum float64
	for i, p := range pods {
		w[i] = p.capacity
		sum += p.capacity
	}
	if !(sum > 0) {
		for i := range w {
			w[i] = 1
		}
	}
	return optimizer.LargestRemainder(w, WeightTotal)
}

// buildShared builds the resources every caller of s shares.
func (b *builder) buildShared(s *service) error {
	n := len(s.pods)
	s.locality = make([]*core.Locality, n)
	s.lbEps = make([][]*endpoint.LbEndpoint, n)
	s.fallback = make([]*endpoint.LbEndpoint, n)
	s.rrWeights = capacityWeights(s.pods)
	s.allPods = b.lb == LBLeastRequest
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", b.enc, s.name)
	if s.allPods { // round-robin versions stay what they were before LBPolicy existed
		fmt.Fprintf(h, "lb=%s\x00", b.lb)
	}
	for i, p := range s.pods {
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00%d\x00%d\x00", p.name, p.node, p.host, p.port, max(s.rrWeights[i], 1))
	}
	h.Sum(s.sum[:0])
	for i, p := range s.pods {
		s.locality[i] = &core.Locality{Zone: p.node, SubZone: p.name}
		s.lbEps[i] = []*endpoint.LbEndpoint{lbEndpoint(p.host, p.port)}
		// Failover tier: at priority 1 every pod keeps a non-zero weight (its capacity share,
		// at least 1), never 0, which gRPC would reject.
		s.fallback[i] = lbEndpoint(p.host, p.port)
		s.fallback[i].LoadBalancingWeight = wrapperspb.UInt32(uint32(max(s.rrWeights[i], 1)))
	}
	var err error
	if s.listener, err = newEntry(s.name, apiListener(s.name)); err != nil {
		return err
	}
	switch b.enc {
	case EncodingLocality:
		if s.cluster, err = newEntry(s.name, edsCluster(s.name, b.lb)); err != nil {
			return err
		}
		if s.route, err = newEntry(s.name, routeConfig(s.name, &route.RouteAction{
			ClusterSpecifier: &route.RouteAction_Cluster{Cluster: s.name}})); err != nil {
			return err
		}
		if s.rrCLA, err = derivedEntry(s, "assignment", func() types.Resource { return b.assignment(s, s.name, s.rrWeights) }, s.rrWeights); err != nil {
			return err
		}
	case EncodingWeightedClusters:
		s.podClus = make([]entry, n)
		s.podCLA = make([]entry, n)
		for i := range s.pods {
			name := podClusterName(s.name, s.pods[i].name)
			if s.podClus[i], err = newEntry(name, edsCluster(name, b.lb)); err != nil {
				return err
			}
			one := make([]int64, n)
			one[i] = 1
			if s.podCLA[i], err = newEntry(name, b.assignment(s, name, one)); err != nil {
				return err
			}
		}
		if s.rrRoute, err = derivedEntry(s, "route", func() types.Resource { return b.weightedRoute(s, s.rrWeights) }, s.rrWeights); err != nil {
			return err
		}
	}
	return nil
}

// podClusterName names the per-pod cluster of the weighted-clusters encoding.
func podClusterName(svc, pod string) string { return svc + "/" + pod }

// FailoverSubZone is the sub_zone of the priority-1 locality that holds a caller's zero-flow
// pods. A '/' cannot occur in a Kubernetes pod name, so it never collides with a pod's.
const FailoverSubZone = "edgeflow/failover"

var failoverLocality = &core.Locality{SubZone: FailoverSubZone}

// assignment is a ClusterLoadAssignment of s's pods: one locality per pod with a positive
// weight, at priority 0 with that weight; every other pod in one failover locality at
// priority 1, endpoints weighted by capacity (Envoy honours endpoint weights inside a
// locality; gRPC round-robins them). One failover locality instead of one per pod keeps the
// assignment about as small as a plain endpoint list, which is what every push carries.
func (b *builder) assignment(s *service, name string, weights []int64) *endpoint.ClusterLoadAssignment {
	if s.allPods {
		return allPodsAssignment(name, s.fallback)
	}
	return assignment(name, s.locality, s.lbEps, s.fallback, weights)
}

// AllPodsSubZone is the sub_zone of LBLeastRequest's one locality, which holds every pod of
// the callee. Like FailoverSubZone it cannot collide with a pod's name.
const AllPodsSubZone = "edgeflow/all"

var allPodsLocality = &core.Locality{SubZone: AllPodsSubZone}

// allPodsAssignment is LBLeastRequest's ClusterLoadAssignment: one locality at priority 0
// holding eps, every pod's endpoint weighted by capacity.
func allPodsAssignment(name string, eps []*endpoint.LbEndpoint) *endpoint.ClusterLoadAssignment {
	return &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{
		localityEndpoints(allPodsLocality, eps, 1, 0),
	}}
}

// assignment is the ClusterLoadAssignment name of pods with localities locs, endpoints eps
// and failover endpoints fallback (each indexed by pod), weighted by weights.
func assignment(name string, locs []*core.Locality, eps [][]*endpoint.LbEndpoint, fallback []*endpoint.LbEndpoint, weights []int64) *endpoint.ClusterLoadAssignment {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: name}
	var failover []*endpoint.LbEndpoint
	for i, w := range weights {
		if w > 0 {
			cla.Endpoints = append(cla.Endpoints, localityEndpoints(locs[i], eps[i], w, 0))
		} else {
			failover = append(failover, fallback[i])
		}
	}
	if len(failover) > 0 {
		cla.Endpoints = append(cla.Endpoints, localityEndpoints(failoverLocality, failover, 1, 1))
	}
	return cla
}

// weightedRoute is s's route splitting over its per-pod clusters by weight.
func (b *builder) weightedRoute(s *service, weights []int64) *route.RouteConfiguration {
	var ws []*route.WeightedCluster_ClusterWeight
	unused := false
	for i, w := range weights {
		if w > 0 {
			ws = append(ws, clusterWeight(podClusterName(s.name, s.pods[i].name), w))
		} else {
			unused = true
		}
	}
	rc := routeConfig(s.name, &route.RouteAction{ClusterSpecifier: &route.RouteAction_WeightedClusters{
		WeightedClusters: &route.WeightedCluster{Clusters: ws}}})
	if unused {
		// An unreachable second route (after the catch-all) names every per-pod cluster, so a
		// client keeps all of them active and a later weight shift never has it add a cluster:
		// grpc-go applies a new route before its cluster manager has the new cluster and fails
		// the RPCs picked for it in between ("unknown cluster selected for RPC").
		all := make([]*route.WeightedCluster_ClusterWeight, len(s.pods))
		for i, p := range s.pods {
			all[i] = clusterWeight(podClusterName(s.name, p.name), 1)
		}
		vh := rc.VirtualHosts[0]
		vh.Routes = append(vh.Routes, &route.Route{
			Name:  KeepClustersRoute,
			Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: ""}},
			Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_WeightedClusters{
				WeightedClusters: &route.WeightedCluster{Clusters: all}}}},
		})
	}
	return rc
}

// KeepClustersRoute names the unreachable route of the weighted-clusters encoding that keeps
// every per-pod cluster of a service referenced.
const KeepClustersRoute = "edgeflow-keep-clusters-active"

// node assembles one node's resources: the planned services of calls, every other servable
// service round-robin.
func (b *builder) node(calls []callPlan) (*NodeResources, error) {
	planned := make(map[string][]int64, len(calls))
	for _, c := range calls {
		planned[c.callee.name] = c.weights
	}
	var sets [numSets][]entry
	for _, s := range b.order {
		if !s.servable {
			continue
		}
		w, isPlanned := planned[s.name]
		sets[ListenerSet] = append(sets[ListenerSet], s.listener)
		switch b.enc {
		case EncodingLocality:
			sets[RouteSet] = append(sets[RouteSet], s.route)
			sets[ClusterSet] = append(sets[ClusterSet], s.cluster)
			cla := s.rrCLA
			if isPlanned {
				var err error
				if cla, err = derivedEntry(s, "assignment", func() types.Resource { return b.assignment(s, s.name, w) }, w); err != nil {
					return nil, err
				}
			}
			sets[EndpointSet] = append(sets[EndpointSet], cla)
		case EncodingWeightedClusters:
			rt := s.rrRoute
			if isPlanned {
				var err error
				if rt, err = derivedEntry(s, "route", func() types.Resource { return b.weightedRoute(s, w) }, w); err != nil {
					return nil, err
				}
			}
			sets[RouteSet] = append(sets[RouteSet], rt)
			sets[ClusterSet] = append(sets[ClusterSet], s.podClus...)
			sets[EndpointSet] = append(sets[EndpointSet], s.podCLA...)
		}
	}
	nr := &NodeResources{}
	for i := range sets {
		nr.Sets[i] = makeSet(sets[i])
	}
	return nr, nil
}

// entry is a validated resource with its content hash.
type entry struct {
	name string
	res  types.Resource
	sum  [sha256.Size]byte
}

// validator is what the generated protos' ValidateAll gives.
type validator interface{ ValidateAll() error }

func newEntry(name string, r types.Resource) (entry, error) {
	if v, ok := r.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			return entry{}, fmt.Errorf("xds: generated %T %q is invalid: %w", r, name, err)
		}
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		return entry{}, fmt.Errorf("xds: marshal %q: %w", name, err)
	}
	return entry{name: name, res: r, sum: sha256.Sum256(data)}, nil
}

// derivedEntry is a per-caller resource of service s: a deterministic function of s's shared
// content and the caller's weights, so its content hash is computed from those instead of
// marshalling it (which dominated translation time at thousands of callers), and callers with
// the same weights share one resource (memory, validation). It is validated like every other
// resource.
func derivedEntry(s *service, kind string, build func() types.Resource, weights []int64) (entry, error) {
	return s.derive(&s.sum, s.name, kind, build, weights, true)
}

// derive is derivedEntry for a resource named name whose shared content hashes to base. It
// validates the resource only when validate is set (see Translation.Resources).
func (s *service) derive(base *[sha256.Size]byte, name, kind string, build func() types.Resource, weights []int64, validate bool) (entry, error) {
	key := make([]byte, 0, len(kind)+8*len(weights))
	key = append(key, kind...)
	for _, w := range weights {
		key = binary.LittleEndian.AppendUint64(key, uint64(w))
	}
	if e, ok := s.derived[string(key)]; ok {
		return e, nil
	}
	r := build()
	if validate {
		if err := r.(validator).ValidateAll(); err != nil {
			return entry{}, fmt.Errorf("xds: generated %s %q is invalid: %w", kind, name, err)
		}
	}
	h := sha256.New()
	h.Write(base[:])
	h.Write(key)
	e := entry{name: name, res: r}
	h.Sum(e.sum[:0])
	if s.derived == nil {
		s.derived = map[string]entry{}
	}
	s.derived[string(key)] = e
	return e, nil
}

// makeSet sorts entries by name and derives the set's version from names and content hashes.
func makeSet(es []entry) Set {
	sort.Slice(es, func(i, j int) bool { return es[i].name < es[j].name })
	h := sha256.New()
	items := make([]types.Resource, len(es))
	for i, e := range es {
		h.Write([]byte(e.name))
		h.Write([]byte{0})
		h.Write(e.sum[:])
		items[i] = e.res
	}
	if len(es) == 0 {
		return Set{}
	}
	return Set{Version: hex.EncodeToString(h.Sum(nil)[:8]), Items: items}
}

// Assignment returns the named ClusterLoadAssignment of the node, or nil.
func (n *NodeResources) Assignment(name string) *endpoint.ClusterLoadAssignment {
	for _, r := range n.Sets[EndpointSet].Items {
		if c := r.(*endpoint.ClusterLoadAssignment); c.GetClusterName() == name {
			return c
		}
	}
	return nil
}

// Route returns the named RouteConfiguration of the node, or nil.
func (n *NodeResources) Route(name string) *route.RouteConfiguration {
	for _, r := range n.Sets[RouteSet].Items {
		if c := r.(*route.RouteConfiguration); c.GetName() == name {
			return c
		}
	}
	return nil
}

// Listener returns the named Listener of the node, or nil.
func (n *NodeResources) Listener(name string) *listener.Listener {
	for _, r := range n.Sets[ListenerSet].Items {
		if c := r.(*listener.Listener); c.GetName() == name {
			return c
		}
	}
	return nil
}

// Cluster returns the named Cluster of the node, or nil.
func (n *NodeResources) Cluster(name string) *cluster.Cluster {
	for _, r := range n.Sets[ClusterSet].Items {
		if c := r.(*cluster.Cluster); c.GetName() == name {
			return c
		}
	}
	return nil
}
