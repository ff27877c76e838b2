package xds

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sort"
	"strconv"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeflow/edgeflow/optimizer"
)

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

	allPods   bool                     // LBLeastRequest, or a pooled service under LBBands: every assignment is one locality of all pods
	bands     []band                   // LBBands: the pods by node, ordered by node name; nil otherwise
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
				return fmt.Errorf("%w: pod %q (service %q) has no address (give the pod address: IP:PORT, or ip: IP with a port on the service)", ErrIncompleteTopology, p.Name, svcKey)
			}
			host, port, err := ParseAddress(p.Address)
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

// ParseAddress splits "IP:PORT"; Envoy's EDS needs an IP, not a host name.
func ParseAddress(s string) (string, uint32, error) {
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
	enc          Encoding
	lb           LBPolicy
	domain       string // the cluster's DNS domain
	egressOffset uint32 // TranslateConfig.EgressPortOffset
	services     map[string]*service
	order        []*service
	podService   map[string]*service
	envoy        [EndpointSet]Set // plain Envoy nodes' listeners, routes and clusters: the same for every node
	skipped      []string
	pooled       map[string]bool // LBBands: the services the allocation pools (optimizer.Allocation.Pooled)
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
	s.allPods = b.lb == LBLeastRequest || b.pooled[s.name]
	if b.lb == LBBands && !s.allPods {
		s.bands = podBands(s.pods)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", b.enc, s.name)
	if b.lb != LBRoundRobin { // round-robin versions stay what they were before LBPolicy existed
		fmt.Fprintf(h, "lb=%s\x00", b.lb)
	}
	if b.pooled[s.name] {
		fmt.Fprint(h, "pooled\x00")
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
		if s.cluster, err = newEntry(s.name, grpcCluster(s.name, b.lb)); err != nil {
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
	if s.bands != nil {
		return bandAssignment(name, s.bands, s.fallback, weights)
	}
	return assignment(name, s.locality, s.lbEps, s.fallback, weights)
}

// BandSubZone is the sub_zone of an LBBands locality (its zone is the band's node). Like
// FailoverSubZone it cannot collide with a pod's name.
const BandSubZone = "edgeflow/band"

// band is the callee pods on one node (LBBands).
type band struct {
	loc  *core.Locality
	pods []int // indices into the service's pods, in pod order
}

// podBands groups pods by node, ordered by node name.
func podBands(pods []pod) []band {
	index := map[string]int{}
	var bs []band
	for i, p := range pods {
		k, ok := index[p.node]
		if !ok {
			k = len(bs)
			index[p.node] = k
			bs = append(bs, band{loc: &core.Locality{Zone: p.node, SubZone: BandSubZone}})
		}
		bs[k].pods = append(bs[k].pods, i)
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].loc.GetZone() < bs[j].loc.GetZone() })
	return bs
}

// bandWeights is weights (a caller's, per pod) in the canonical form of LBBands: each band's
// sum on its first pod, 0 on its others. Callers whose plans differ only inside bands get the
// same form, so they share one assignment, and a plan that moves traffic only inside a band
// changes no version (nothing is pushed).
func bandWeights(bs []band, weights []int64) []int64 {
	out := make([]int64, len(weights))
	for _, bd := range bs {
		var sum int64
		for _, i := range bd.pods {
			sum += weights[i]
		}
		out[bd.pods[0]] = sum
	}
	return out
}

// bandAssignment is LBBands' ClusterLoadAssignment: at priority 0 one locality per band with
// a positive weight (the sum of weights over its pods), holding every pod of the band; the
// pods of the other bands in the failover locality at priority 1. Endpoints are eps (per pod,
// weighted by capacity), so least-request inside a band splits it by capacity where the
// client weighs endpoints (Envoy) and evenly where it does not (grpc-go's least_request).
func bandAssignment(name string, bs []band, eps []*endpoint.LbEndpoint, weights []int64) *endpoint.ClusterLoadAssignment {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: name}
	var failover []*endpoint.LbEndpoint
	for _, bd := range bs {
		var sum int64
		bandEps := make([]*endpoint.LbEndpoint, len(bd.pods))
		for k, i := range bd.pods {
			sum += weights[i]
			bandEps[k] = eps[i]
		}
		if sum > 0 {
			cla.Endpoints = append(cla.Endpoints, localityEndpoints(bd.loc, bandEps, sum, 0))
		} else {
			failover = append(failover, bandEps...)
		}
	}
	if len(failover) > 0 {
		cla.Endpoints = append(cla.Endpoints, localityEndpoints(failoverLocality, failover, 1, 1))
	}
	return cla
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
	var sets [NumSets][]entry
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
