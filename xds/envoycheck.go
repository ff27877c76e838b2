package xds

import (
	"errors"
	"fmt"
	"math"
	"slices"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	leastrequestv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	wrrlocalityv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/wrr_locality/v3"
	"google.golang.org/protobuf/proto"
)

// The checks below are what an Envoy would reject in an xDS response, as far as they can be
// told without an Envoy, plus edgeflow's own requirements for the weights to take effect
// (marked "edgeflow:"). Translate runs them on the plain Envoy resources it builds; the tests'
// Envoy-like ADS client NACKs a response that fails them. Each returns the first problem,
// naming the resource.

// errEnvoyRule is wrapped by every check's error.
var errEnvoyRule = errors.New("envoy would reject")

func ruleErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errEnvoyRule}, args...)...)
}

// CheckListeners checks an LDS response: every listener valid, names and socket addresses
// unique, at least one filter chain, each ending in an HTTP connection manager that takes its
// routes from RDS over ADS (edgeflow) and whose HTTP filters end in the router (Envoy rejects a
// chain whose terminal filter is not last).
func CheckListeners(ls []*listener.Listener) error {
	names, addrs := map[string]bool{}, map[string]string{}
	for _, l := range ls {
		name := l.GetName()
		if err := l.ValidateAll(); err != nil {
			return ruleErr("listener %q: %v", name, err)
		}
		if names[name] {
			return ruleErr("listener %q: duplicate name", name)
		}
		names[name] = true
		if l.GetApiListener() != nil {
			return ruleErr("listener %q: api_listener (Envoy takes those only from its bootstrap)", name)
		}
		sa := l.GetAddress().GetSocketAddress()
		if sa == nil {
			return ruleErr("listener %q: no socket address", name)
		}
		addr := fmt.Sprintf("%s %s:%d", sa.GetProtocol(), sa.GetAddress(), sa.GetPortValue())
		if other, dup := addrs[addr]; dup {
			return ruleErr("listener %q: address %s is also listener %q's", name, addr, other)
		}
		addrs[addr] = name
		if len(l.GetFilterChains()) == 0 && l.GetDefaultFilterChain() == nil {
			return ruleErr("listener %q: no filter chains", name)
		}
		matches := map[string]bool{}
		for i, fc := range l.GetFilterChains() {
			m, err := proto.MarshalOptions{Deterministic: true}.Marshal(fc.GetFilterChainMatch())
			if err != nil {
				return ruleErr("listener %q: filter chain %d: %v", name, i, err)
			}
			if matches[string(m)] {
				return ruleErr("listener %q: filter chain %d: same match as another", name, i)
			}
			matches[string(m)] = true
			fs := fc.GetFilters()
			if len(fs) == 0 {
				return ruleErr("listener %q: filter chain %d: no filters", name, i)
			}
			if err := checkHCM(fs[len(fs)-1]); err != nil {
				return ruleErr("listener %q: filter chain %d: %v", name, i, err)
			}
		}
	}
	return nil
}

// checkHCM checks a listener's terminal network filter; it returns no rule error of its own.
func checkHCM(f *listener.Filter) error {
	m := &hcm.HttpConnectionManager{}
	if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(m) != nil {
		return fmt.Errorf("last filter %q is not an HTTP connection manager", f.GetName())
	}
	if err := m.ValidateAll(); err != nil {
		return err
	}
	rds := m.GetRds()
	if rds == nil {
		return errors.New("edgeflow: HTTP connection manager does not use RDS")
	}
	if rds.GetConfigSource().GetAds() == nil {
		return errors.New("edgeflow: RDS config source is not ADS")
	}
	hf := m.GetHttpFilters()
	if len(hf) == 0 {
		return errors.New("no HTTP filters")
	}
	for i, h := range hf {
		r := &router.Router{}
		isRouter := h.GetTypedConfig() != nil && h.GetTypedConfig().UnmarshalTo(r) == nil
		if last := i == len(hf)-1; isRouter != last {
			return fmt.Errorf("HTTP filter %d (%q): the router must be the last filter, and only it", i, h.GetName())
		}
	}
	return nil
}

// CheckRouteConfigs checks an RDS response: every RouteConfiguration valid, names unique;
// virtual host names and domains unique within one; every route names a cluster, or weighted
// clusters whose weights sum to 1 … 2³²−1.
func CheckRouteConfigs(rcs []*route.RouteConfiguration) error {
	names := map[string]bool{}
	for _, rc := range rcs {
		name := rc.GetName()
		if err := rc.ValidateAll(); err != nil {
			return ruleErr("route configuration %q: %v", name, err)
		}
		if names[name] {
			return ruleErr("route configuration %q: duplicate name", name)
		}
		names[name] = true
		vhosts, domains := map[string]bool{}, map[string]string{}
		for _, vh := range rc.GetVirtualHosts() {
			if vhosts[vh.GetName()] {
				return ruleErr("route configuration %q: duplicate virtual host %q", name, vh.GetName())
			}
			vhosts[vh.GetName()] = true
			for _, d := range vh.GetDomains() {
				if other, dup := domains[d]; dup {
					return ruleErr("route configuration %q: domain %q in virtual hosts %q and %q", name, d, other, vh.GetName())
				}
				domains[d] = vh.GetName()
			}
			for i, r := range vh.GetRoutes() {
				a := r.GetRoute()
				if a == nil {
					continue
				}
				if wc := a.GetWeightedClusters(); wc != nil {
					var sum uint64
					for _, c := range wc.GetClusters() {
						sum += uint64(c.GetWeight().GetValue())
					}
					if sum == 0 || sum > math.MaxUint32 {
						return ruleErr("route configuration %q: virtual host %q: route %d: weighted clusters sum to %d", name, vh.GetName(), i, sum)
					}
				} else if a.GetCluster() == "" {
					return ruleErr("route configuration %q: virtual host %q: route %d: no cluster", name, vh.GetName(), i)
				}
			}
		}
	}
	return nil
}

// CheckClusters checks a CDS response: every cluster valid, names unique, extension protocol
// options that unpack and validate, a load-balancing policy Envoy takes (checkLbPolicy);
// edgeflow: of type EDS with its EDS config from ADS and locality-weighted load balancing, so
// the assignments' locality weights are honoured.
func CheckClusters(cs []*cluster.Cluster) error {
	names := map[string]bool{}
	for _, c := range cs {
		name := c.GetName()
		if err := c.ValidateAll(); err != nil {
			return ruleErr("cluster %q: %v", name, err)
		}
		if names[name] {
			return ruleErr("cluster %q: duplicate name", name)
		}
		names[name] = true
		for ext, a := range c.GetTypedExtensionProtocolOptions() {
			m, err := a.UnmarshalNew()
			if err != nil {
				return ruleErr("cluster %q: protocol options %q: %v", name, ext, err)
			}
			if v, ok := m.(validator); ok {
				if err := v.ValidateAll(); err != nil {
					return ruleErr("cluster %q: protocol options %q: %v", name, ext, err)
				}
			}
		}
		if c.GetType() != cluster.Cluster_EDS {
			return ruleErr("cluster %q: edgeflow: type %v, not EDS", name, c.GetType())
		}
		if c.GetEdsClusterConfig().GetEdsConfig().GetAds() == nil {
			return ruleErr("cluster %q: edgeflow: EDS config is not ADS", name)
		}
		if err := checkLbPolicy(c); err != nil {
			return ruleErr("cluster %q: %v", name, err)
		}
	}
	return nil
}

// Type URLs of the load-balancing policies Envoy registers (TypedLoadBalancerFactory, one
// folder each under source/extensions/load_balancing_policies/), of those whose config
// go-control-plane has: what load_balancing_policy may name for Envoy to find a factory.
var envoyLbPolicies = map[string]bool{
	"type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin":                                        true,
	"type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest":                                    true,
	"type.googleapis.com/envoy.extensions.load_balancing_policies.random.v3.Random":                                                 true,
	"type.googleapis.com/envoy.extensions.load_balancing_policies.ring_hash.v3.RingHash":                                            true,
	"type.googleapis.com/envoy.extensions.load_balancing_policies.maglev.v3.Maglev":                                                 true,
	"type.googleapis.com/envoy.extensions.load_balancing_policies.wrr_locality.v3.WrrLocality":                                      true,
	"type.googleapis.com/envoy.extensions.load_balancing_policies.cluster_provided.v3.ClusterProvided":                              true,
	"type.googleapis.com/envoy.extensions.load_balancing_policies.subset.v3.Subset":                                                 true,
	"type.googleapis.com/envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin": true,
}

// checkLbPolicy checks a cluster's load-balancing policy; it returns no rule error of its own.
//
// With load_balancing_policy set, Envoy (source/common/upstream/upstream_impl.cc,
// ClusterInfoImpl::configureLbPolicies) ignores lb_policy and rejects the cluster when it
// also has lb_subset_config, or a common_lb_config with zone_aware_lb_config,
// locality_weighted_lb_config or consistent_hashing_lb_config, or when no policy of the list
// has a registered factory (the first that has one wins). edgeflow: that policy must weigh
// localities — WrrLocality, or RoundRobin / LeastRequest whose locality_lb_config has
// locality_weighted_lb_config — or the plan's locality weights are lost.
//
// Without it, edgeflow: common_lb_config.locality_weighted_lb_config must be set
// (ZoneAwareLoadBalancerBase::hostSourceToUse picks a locality by weight only then), and a
// LEAST_REQUEST cluster's active_request_bias must be finite and ≥ 0: Envoy does not reject
// another but runs 1.0 instead, with a warning (LeastRequestLoadBalancer::refresh).
// least_request_lb_config on a cluster of another lb_policy is ignored (each legacy policy's
// config constructor reads its own), which edgeflow never means to send. choice_count < 2 is
// the proto's own rule (ValidateAll).
func checkLbPolicy(c *cluster.Cluster) error {
	if lbp := c.GetLoadBalancingPolicy(); lbp != nil {
		if c.GetLbSubsetConfig() != nil {
			return errors.New("load_balancing_policy cannot be combined with lb_subset_config")
		}
		if cl := c.GetCommonLbConfig(); cl.GetZoneAwareLbConfig() != nil || cl.GetLocalityWeightedLbConfig() != nil || cl.GetConsistentHashingLbConfig() != nil {
			return errors.New("load_balancing_policy cannot be combined with common_lb_config's zone_aware_lb_config, locality_weighted_lb_config or consistent_hashing_lb_config")
		}
		for _, p := range lbp.GetPolicies() {
			tc := p.GetTypedExtensionConfig().GetTypedConfig()
			if !envoyLbPolicies[tc.GetTypeUrl()] {
				continue
			}
			var m interface {
				proto.Message
				ValidateAll() error
			}
			switch tc.GetTypeUrl() {
			case "type.googleapis.com/envoy.extensions.load_balancing_policies.wrr_locality.v3.WrrLocality":
				m = &wrrlocalityv3.WrrLocality{}
			case "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest":
				m = &leastrequestv3.LeastRequest{}
			case "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin":
				m = &roundrobinv3.RoundRobin{}
			default:
				return fmt.Errorf("edgeflow: load_balancing_policy %q does not weigh localities", p.GetTypedExtensionConfig().GetName())
			}
			if err := tc.UnmarshalTo(m); err != nil {
				return fmt.Errorf("load_balancing_policy %q: %v", p.GetTypedExtensionConfig().GetName(), err)
			}
			if err := m.ValidateAll(); err != nil {
				return fmt.Errorf("load_balancing_policy %q: %v", p.GetTypedExtensionConfig().GetName(), err)
			}
			switch m := m.(type) {
			case *wrrlocalityv3.WrrLocality:
				return checkEndpointPicking(m.GetEndpointPickingPolicy())
			case *leastrequestv3.LeastRequest:
				if m.GetLocalityLbConfig().GetLocalityWeightedLbConfig() != nil {
					return nil
				}
			case *roundrobinv3.RoundRobin:
				if m.GetLocalityLbConfig().GetLocalityWeightedLbConfig() != nil {
					return nil
				}
			}
			return fmt.Errorf("edgeflow: load_balancing_policy %q does not weigh localities", p.GetTypedExtensionConfig().GetName())
		}
		return errors.New("load_balancing_policy: no policy Envoy has a factory for")
	}
	if c.GetCommonLbConfig().GetLocalityWeightedLbConfig() == nil {
		return errors.New("edgeflow: no locality_weighted_lb_config")
	}
	if lr := c.GetLeastRequestLbConfig(); lr != nil {
		if c.GetLbPolicy() != cluster.Cluster_LEAST_REQUEST {
			return fmt.Errorf("edgeflow: least_request_lb_config on a %v cluster (ignored)", c.GetLbPolicy())
		}
		if b := lr.GetActiveRequestBias(); b != nil && (math.IsNaN(b.GetDefaultValue()) || math.IsInf(b.GetDefaultValue(), 0) || b.GetDefaultValue() < 0) {
			return fmt.Errorf("edgeflow: active_request_bias %v (Envoy would run 1.0)", b.GetDefaultValue())
		}
	}
	return nil
}

// CheckAssignments checks an EDS response: every assignment valid, cluster names unique; per
// priority, priorities contiguous from 0, localities unique and weighted (edgeflow: weight 0
// or none would drop a locality under locality-weighted load balancing), their weights summing
// to at most 2³²−1, endpoint addresses unique and endpoint weights per locality within 2³²−1.
func CheckAssignments(clas []*endpoint.ClusterLoadAssignment) error {
	names := map[string]bool{}
	for _, cla := range clas {
		name := cla.GetClusterName()
		if err := cla.ValidateAll(); err != nil {
			return ruleErr("assignment %q: %v", name, err)
		}
		if names[name] {
			return ruleErr("assignment %q: duplicate cluster name", name)
		}
		names[name] = true
		sums := map[uint32]uint64{}
		locs, addrs := map[string]bool{}, map[string]bool{}
		for _, l := range cla.GetEndpoints() {
			p := l.GetPriority()
			w := l.GetLoadBalancingWeight().GetValue()
			lk := fmt.Sprintf("%d %s/%s/%s", p, l.GetLocality().GetRegion(), l.GetLocality().GetZone(), l.GetLocality().GetSubZone())
			if w == 0 {
				return ruleErr("assignment %q: locality %s: edgeflow: no weight", name, lk)
			}
			if locs[lk] {
				return ruleErr("assignment %q: locality %s twice in one priority", name, lk)
			}
			locs[lk] = true
			sums[p] += uint64(w)
			var epSum uint64
			for _, e := range l.GetLbEndpoints() {
				sa := e.GetEndpoint().GetAddress().GetSocketAddress()
				if sa == nil {
					return ruleErr("assignment %q: locality %s: endpoint without socket address", name, lk)
				}
				a := fmt.Sprintf("%d %s:%d", p, sa.GetAddress(), sa.GetPortValue())
				if addrs[a] {
					return ruleErr("assignment %q: address %s twice in one priority", name, a)
				}
				addrs[a] = true
				epSum += uint64(max(e.GetLoadBalancingWeight().GetValue(), 1))
			}
			if epSum > math.MaxUint32 {
				return ruleErr("assignment %q: locality %s: endpoint weights sum to %d", name, lk, epSum)
			}
		}
		for p := uint32(0); p < uint32(len(sums)); p++ {
			if _, ok := sums[p]; !ok {
				return ruleErr("assignment %q: priorities not contiguous from 0 (%d missing)", name, p)
			}
			if sums[p] > math.MaxUint32 {
				return ruleErr("assignment %q: priority %d: locality weights sum to %d", name, p, sums[p])
			}
		}
	}
	return nil
}

// CheckEnvoy checks a plain Envoy node's resources type by type and across types: every
// listener's route configuration is served, every route's cluster is in CDS, and every EDS
// cluster has an assignment. (Envoy itself does not reject a route to an unknown cluster
// delivered by RDS — it answers 503 — but edgeflow never serves one.)
func CheckEnvoy(n *NodeResources) error {
	ls := typed[*listener.Listener](n.Sets[ListenerSet])
	rcs := typed[*route.RouteConfiguration](n.Sets[RouteSet])
	cs := typed[*cluster.Cluster](n.Sets[ClusterSet])
	clas := typed[*endpoint.ClusterLoadAssignment](n.Sets[EndpointSet])
	for _, err := range []error{CheckListeners(ls), CheckRouteConfigs(rcs), CheckClusters(cs), CheckAssignments(clas)} {
		if err != nil {
			return err
		}
	}
	return CheckRefs(ls, rcs, cs, clas)
}

// CheckRefs checks the references between types (see CheckEnvoy).
func CheckRefs(ls []*listener.Listener, rcs []*route.RouteConfiguration, cs []*cluster.Cluster, clas []*endpoint.ClusterLoadAssignment) error {
	have := func(n int, name func(int) string) map[string]bool {
		m := make(map[string]bool, n)
		for i := 0; i < n; i++ {
			m[name(i)] = true
		}
		return m
	}
	routes := have(len(rcs), func(i int) string { return rcs[i].GetName() })
	clusters := have(len(cs), func(i int) string { return cs[i].GetName() })
	assigned := have(len(clas), func(i int) string { return clas[i].GetClusterName() })
	for _, name := range RDSNames(ls) {
		if !routes[name] {
			return fmt.Errorf("route configuration %q: named by a listener, not served", name)
		}
	}
	for _, name := range routeClusters(rcs) {
		if !clusters[name] {
			return fmt.Errorf("cluster %q: named by a route, not served", name)
		}
	}
	for _, name := range EDSNames(cs) {
		if !assigned[name] {
			return fmt.Errorf("assignment %q: EDS cluster without one", name)
		}
	}
	return nil
}

// RDSNames lists the route configurations the listeners' HTTP connection managers name.
func RDSNames(ls []*listener.Listener) []string {
	var out []string
	for _, l := range ls {
		out = append(out, RouteConfigRefs(l)...)
	}
	return out
}

// routeClusters lists the clusters the route configurations' routes name.
func routeClusters(rcs []*route.RouteConfiguration) []string {
	named := map[string]bool{}
	for _, rc := range rcs {
		ClusterRefs(rc, named)
	}
	out := make([]string, 0, len(named))
	for name := range named {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// EDSNames lists the EDS resource names of the EDS clusters (service_name, else the name).
func EDSNames(cs []*cluster.Cluster) []string {
	var out []string
	for _, c := range cs {
		if name := EDSName(c); name != "" {
			out = append(out, name)
		}
	}
	return out
}

// typed returns a set's items as T (all of a set's items have its type).
func typed[T any](s Set) []T {
	out := make([]T, len(s.Items))
	for i, r := range s.Items {
		out[i] = r.(T)
	}
	return out
}

// CheckResponse checks the resources of one response of set i (ListenerSet … EndpointSet) with
// the rules Envoy rejects a response by.
func CheckResponse(i int, msgs []proto.Message) error {
	switch i {
	case ListenerSet:
		return CheckListeners(asAll[*listener.Listener](msgs))
	case RouteSet:
		return CheckRouteConfigs(asAll[*route.RouteConfiguration](msgs))
	case ClusterSet:
		return CheckClusters(asAll[*cluster.Cluster](msgs))
	default:
		return CheckAssignments(asAll[*endpoint.ClusterLoadAssignment](msgs))
	}
}

func asAll[T proto.Message](msgs []proto.Message) []T {
	out := make([]T, len(msgs))
	for i, m := range msgs {
		out[i] = m.(T)
	}
	return out
}

// checkEndpointPicking checks WrrLocality's endpoint_picking_policy as Envoy loads it
// (source/extensions/load_balancing_policies/wrr_locality/config.h, Factory::loadConfig): the
// first policy with a registered factory must be ClientSideWeightedRoundRobin ("Currently
// WrrLocalityLoadBalancer only supports ClientSideWeightedRoundRobinLoadBalancer as its
// endpoint picking policy"), and none at all is an error too ("No supported endpoint picking
// policy"). So Envoy rejects WrrLocality{LeastRequest}, which grpc-go takes: LBBands' gRPC
// cluster is for proxyless nodes only.
func checkEndpointPicking(lbp *cluster.LoadBalancingPolicy) error {
	const cswrr = "type.googleapis.com/envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin"
	for _, p := range lbp.GetPolicies() {
		switch url := p.GetTypedExtensionConfig().GetTypedConfig().GetTypeUrl(); {
		case url == cswrr:
			return nil
		case envoyLbPolicies[url]:
			return fmt.Errorf("WrrLocality's endpoint_picking_policy %q: Envoy takes only ClientSideWeightedRoundRobin there", p.GetTypedExtensionConfig().GetName())
		}
	}
	return errors.New("WrrLocality's endpoint_picking_policy: no policy Envoy has a factory for")
}
