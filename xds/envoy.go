package xds

import (
	"crypto/sha256"
	"fmt"
	"sort"
	"strconv"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeflow/edgeflow/optimizer"
)

// This file builds what plain Envoy and Istio nodes get (NodeKind Envoy and IstioSidecar).
//
// Both get, per service port, a ClusterLoadAssignment named as Istio names the port's outbound
// cluster ("outbound|PORT||NAME.NS.svc.DOMAIN", DOMAIN the TranslateConfig's ClusterDomain),
// holding the caller's weights in the locality encoding whatever the Translation's Encoding
// (which is about gRPC clients): one locality per callee pod with a positive weight at priority
// 0, the others in the priority-1 failover locality; endpoints on the port's target port, with
// Istio's mTLS metadata when the pod has a sidecar (optimizer.Pod.HasSidecar). An Istio node
// and an Envoy node of the same pod share these entries.
//
// Listener layout of plain Envoy nodes. An app reaches service NAME.NS on port P by dialling
// EnvoyListenerAddress:P with NAME (or NAME.NS, NAME.NS.svc, NAME.NS.svc.cluster.local, each
// with or without ":P") as its :authority or Host — e.g. with a pod hostAlias that maps those
// names to 127.0.0.1, so the app keeps dialling NAME:P. Services share ports (Bookinfo's four
// all use 9080), so there is one listener per port number, not per service: ListenerName(P) on
// EnvoyListenerAddress:P, whose RouteConfiguration RouteName(P) has one virtual host per
// service with that port, matched by those names. A name two services on one port would share
// (NAME in two namespaces) is given to neither; the qualified names still reach both. Binding
// on loopback keeps the listeners private to the pod; it collides with an app of the pod that
// itself listens on 0.0.0.0:P — Istio avoids that with iptables redirection (listeners with
// bind_to_port false behind one on 15001), which plain Envoy mode does not set up; instead
// TranslateConfig.EgressPortOffset moves every listener to P+offset (the app dials that port).

// EnvoyListenerAddress is the address plain Envoy nodes' outbound listeners bind.
const EnvoyListenerAddress = "127.0.0.1"

// ListenerName names a plain Envoy node's listener that binds port ("127.0.0.1_9080", as Istio
// names its outbound listeners ADDRESS_PORT): the service port plus
// TranslateConfig.EgressPortOffset.
func ListenerName(port uint32) string {
	return EnvoyListenerAddress + "_" + strconv.FormatUint(uint64(port), 10)
}

// RouteName names the RouteConfiguration of a plain Envoy node's listener for port: the port
// number, as Istio names its outbound HTTP route configurations.
func RouteName(port uint32) string { return strconv.FormatUint(uint64(port), 10) }

// servicePort is one port of a servable service, as Envoy and Istio nodes get it.
type servicePort struct {
	port     uint32                   // the service port
	cluster  string                   // Istio's outbound cluster name for it
	kind     string                   // derived-entry key prefix of its assignments
	lbEps    [][]*endpoint.LbEndpoint // per pod: its endpoint on the target port, with Istio's metadata
	fallback []*endpoint.LbEndpoint   // per pod, for the failover locality: weighted by capacity
	sum      [sha256.Size]byte        // content its assignments derive from, with s.sum
	rrCLA    entry                    // round-robin assignment
}

// buildPorts builds s's service ports (after buildShared). A port out of range, a second port
// with the same number, or a port on which two pods would share an endpoint (pods given the
// same host, which only offline files can do) is skipped and noted in b.skipped.
func (b *builder) buildPorts(s *service) error {
	src := s.src
	if len(src.Ports) == 0 {
		b.skipped = append(b.skipped, fmt.Sprintf("service %q has no ports: Envoy nodes do not get it, Istio nodes get its assignment under the service key", s.name))
		// Istio nodes get the locality-encoded assignment under the service key instead
		// (kindNode); the round-robin one is validated here, as in buildShared.
		_, err := derivedEntry(s, "assignment", func() types.Resource { return b.assignment(s, s.name, s.rrWeights) }, s.rrWeights)
		return err
	}
	seen := map[int32]bool{}
	for k, p := range src.Ports {
		if p.Port < 1 || p.Port > 65535 || p.TargetPort < 0 || p.TargetPort > 65535 {
			b.skipped = append(b.skipped, fmt.Sprintf("service %q: port %d (target %d) out of range: not served to Envoy and Istio nodes", s.name, p.Port, p.TargetPort))
			continue
		}
		if seen[p.Port] {
			b.skipped = append(b.skipped, fmt.Sprintf("service %q: port %d listed twice: the second is not served", s.name, p.Port))
			continue
		}
		seen[p.Port] = true
		target := uint32(p.TargetPort)
		if target == 0 {
			target = uint32(p.Port)
		}
		sp := servicePort{
			port:     uint32(p.Port),
			cluster:  src.IstioClusterName(p.Port, b.domain),
			kind:     "port|" + strconv.Itoa(int(p.Port)) + "|",
			lbEps:    make([][]*endpoint.LbEndpoint, len(s.pods)),
			fallback: make([]*endpoint.LbEndpoint, len(s.pods)),
		}
		h := sha256.New()
		fmt.Fprintf(h, "%x\x00%s\x00%s=%s\x00", s.sum, sp.cluster, tlsModeKey, tlsModeIstio)
		for _, pd := range s.pods {
			fmt.Fprintf(h, "%t\x00", pd.sidecar)
		}
		owner := map[string]string{}
		clash := ""
		for i, pd := range s.pods {
			// The first port is served where the pod is (optimizer.Service.Endpoint: its
			// Address, else IP and the first port's target port); the others on the pod's host
			// and their own target port.
			port := pd.port
			if k > 0 {
				port = target
			}
			key := net2key(pd.host, port)
			if other, dup := owner[key]; dup {
				clash = fmt.Sprintf("service %q: port %d: pods %q and %q would share endpoint %s:%d: not served to Envoy and Istio nodes", s.name, p.Port, other, pd.name, pd.host, port)
				break
			}
			owner[key] = pd.name
			fmt.Fprintf(h, "%d\x00", port)
			sp.lbEps[i] = []*endpoint.LbEndpoint{istioLbEndpoint(pd.host, port, pd.sidecar)}
			sp.fallback[i] = istioLbEndpoint(pd.host, port, pd.sidecar)
			sp.fallback[i].LoadBalancingWeight = wrapperspb.UInt32(uint32(max(s.rrWeights[i], 1)))
		}
		if clash != "" {
			b.skipped = append(b.skipped, clash)
			continue
		}
		h.Sum(sp.sum[:0])
		var err error
		if sp.rrCLA, err = s.derive(&sp.sum, sp.cluster, sp.kind, func() types.Resource { return sp.assignment(s, s.rrWeights) }, s.rrWeights, true); err != nil {
			return err
		}
		s.ports = append(s.ports, sp)
	}
	return nil
}

// assignment is the port's ClusterLoadAssignment with the given weights of s's pods.
func (sp *servicePort) assignment(s *service, weights []int64) *endpoint.ClusterLoadAssignment {
	if s.allPods {
		return allPodsAssignment(sp.cluster, sp.fallback)
	}
	if s.bands != nil {
		return bandAssignment(sp.cluster, s.bands, sp.fallback, weights)
	}
	return assignment(sp.cluster, s.locality, sp.lbEps, sp.fallback, weights)
}

// buildEnvoyShared builds what every plain Envoy node gets alike: one listener and one
// RouteConfiguration per port number, one cluster per service port. It checks them with
// Envoy's rules (CheckListeners, CheckRouteConfigs, CheckClusters, checkEnvoyRefs).
func (b *builder) buildEnvoyShared() error {
	byPort := map[uint32][]vhostSpec{}
	var clusters []entry
	var rr [][]entry // per service: its ports' round-robin assignments, for the reference check
	for _, s := range b.order {
		if !s.servable || len(s.ports) == 0 {
			continue
		}
		var eds []entry
		for k := range s.ports {
			sp := &s.ports[k]
			byPort[sp.port] = append(byPort[sp.port], vhostSpec{src: s.src, cluster: sp.cluster})
			e, err := newEntry(sp.cluster, envoyCluster(sp.cluster, b.lb))
			if err != nil {
				return err
			}
			clusters = append(clusters, e)
			eds = append(eds, sp.rrCLA)
		}
		rr = append(rr, eds)
	}
	ports := make([]uint32, 0, len(byPort))
	for p := range byPort {
		ports = append(ports, p)
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i] < ports[j] })
	var listeners, routes []entry
	for _, p := range ports {
		bind := p + b.egressOffset
		if bind > 65535 {
			b.skipped = append(b.skipped, fmt.Sprintf("port %d: with egress port offset %d the listener would bind %d, past 65535: Envoy nodes get no listener for it", p, b.egressOffset, bind))
			continue
		}
		l, err := newEntry(ListenerName(bind), outboundListener(p, bind))
		if err != nil {
			return err
		}
		r, err := newEntry(RouteName(p), portRouteConfig(p, bind, byPort[p], b.domain))
		if err != nil {
			return err
		}
		listeners, routes = append(listeners, l), append(routes, r)
	}
	b.envoy[ListenerSet] = makeSet(listeners)
	b.envoy[RouteSet] = makeSet(routes)
	b.envoy[ClusterSet] = makeSet(clusters)
	nr := &NodeResources{}
	copy(nr.Sets[:EndpointSet], b.envoy[:])
	var eds []entry
	for _, es := range rr {
		eds = append(eds, es...)
	}
	nr.Sets[EndpointSet] = makeSet(eds)
	if err := CheckEnvoy(nr); err != nil {
		return fmt.Errorf("xds: generated Envoy resources break Envoy's rules: %w", err)
	}
	return nil
}

// vhostSpec is one service on a port.
type vhostSpec struct {
	src     *optimizer.Service
	cluster string
}

// portRouteConfig is the RouteConfiguration of port's listener (which binds bind): one virtual
// host per service (named FQDN:PORT, as Istio names them), sorted by name, matched by the
// service's names with and without ":PORT", and with ":BIND" when the listener binds another
// port; a name two of the services share is left out of both.
func portRouteConfig(port, bind uint32, svcs []vhostSpec, domain string) *route.RouteConfiguration {
	ps := ":" + strconv.FormatUint(uint64(port), 10)
	suffixes := []string{"", ps}
	if bind != port {
		suffixes = append(suffixes, ":"+strconv.FormatUint(uint64(bind), 10))
	}
	type vh struct {
		name, cluster string
		domains       []string
	}
	vhs := make([]vh, len(svcs))
	count := map[string]int{}
	for i, s := range svcs {
		ns := s.src.NamespaceOrDefault()
		fqdn := s.src.FQDN(domain)
		v := vh{name: fqdn + ps, cluster: s.cluster}
		seen := map[string]bool{}
		for _, d := range []string{s.src.Name, s.src.Name + "." + ns, s.src.Name + "." + ns + ".svc", fqdn} {
			for _, sfx := range suffixes {
				dd := d + sfx
				if !seen[dd] {
					seen[dd] = true
					v.domains = append(v.domains, dd)
					count[dd]++
				}
			}
		}
		vhs[i] = v
	}
	sort.Slice(vhs, func(i, j int) bool { return vhs[i].name < vhs[j].name })
	rc := &route.RouteConfiguration{Name: RouteName(port)}
	for _, v := range vhs {
		var domains []string
		for _, d := range v.domains {
			if count[d] == 1 {
				domains = append(domains, d)
			}
		}
		rc.VirtualHosts = append(rc.VirtualHosts, virtualHost(v.name, domains, v.cluster))
	}
	return rc
}

// kindNode assembles the resources of an Envoy or Istio node with the given plans.
func (b *builder) kindNode(kind NodeKind, calls []callPlan) *NodeResources {
	planned := make(map[string][]int64, len(calls))
	for _, c := range calls {
		planned[c.callee.name] = c.weights
	}
	var eds []entry
	for _, s := range b.order {
		if !s.servable {
			continue
		}
		w, isPlanned := planned[s.name]
		if !isPlanned {
			w = s.rrWeights
		}
		if len(s.src.Ports) == 0 {
			if kind == IstioSidecar {
				// No Istio cluster name exists: the assignment under the service key, the
				// entry proxyless nodes with these weights get (locality encoding).
				e, _ := s.derive(&s.sum, s.name, "assignment", func() types.Resource { return b.assignment(s, s.name, w) }, w, false)
				eds = append(eds, e)
			}
			continue
		}
		for k := range s.ports {
			sp := &s.ports[k]
			if !isPlanned {
				eds = append(eds, sp.rrCLA)
				continue
			}
			e, _ := s.derive(&sp.sum, sp.cluster, sp.kind, func() types.Resource { return sp.assignment(s, w) }, w, false)
			eds = append(eds, e)
		}
	}
	nr := &NodeResources{}
	if kind == Envoy {
		copy(nr.Sets[:EndpointSet], b.envoy[:])
	}
	nr.Sets[EndpointSet] = makeSet(eds)
	return nr
}
