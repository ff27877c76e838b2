package xds

import (
	"slices"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/proto"
)

// What one xDS resource names of the others: the one walker that make-before-break (which
// clusters may leave), the Envoy checks (is everything named served) and the push benchmark's
// client (what to subscribe to next) share.

const (
	hcmTypeURL      = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
	tcpProxyTypeURL = "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
)

// ClusterRefs adds to into the clusters r names: a RouteConfiguration's routes (cluster,
// weighted clusters, request mirrors); a Listener's inline route configurations and TCP
// proxies (its api_listener, default filter chain and filter chains). Other resources name no
// cluster.
func ClusterRefs(r types.Resource, into map[string]bool) {
	switch r := r.(type) {
	case *route.RouteConfiguration:
		routeClusterRefs(r, into)
	case *listener.Listener:
		walkListener(r, func(m *hcm.HttpConnectionManager) {
			if rc := m.GetRouteConfig(); rc != nil {
				routeClusterRefs(rc, into)
			}
		}, func(t *tcpproxy.TcpProxy) {
			if c := t.GetCluster(); c != "" {
				into[c] = true
			}
			for _, wc := range t.GetWeightedClusters().GetClusters() {
				into[wc.GetName()] = true
			}
		})
	}
}

// RouteConfigRefs returns the route configurations l's HTTP connection managers take over
// RDS, sorted, without duplicates.
func RouteConfigRefs(l *listener.Listener) []string {
	var out []string
	walkListener(l, func(m *hcm.HttpConnectionManager) {
		if name := m.GetRds().GetRouteConfigName(); name != "" {
			out = append(out, name)
		}
	}, nil)
	slices.Sort(out)
	return slices.Compact(out)
}

// EDSName is the ClusterLoadAssignment name an EDS cluster takes its endpoints from (its
// service_name, else its name); "" for other resources and cluster types.
func EDSName(r types.Resource) string {
	c, ok := r.(*cluster.Cluster)
	if !ok || c.GetType() != cluster.Cluster_EDS {
		return ""
	}
	if n := c.GetEdsClusterConfig().GetServiceName(); n != "" {
		return n
	}
	return c.GetName()
}

func routeClusterRefs(rc *route.RouteConfiguration, into map[string]bool) {
	for _, vh := range rc.GetVirtualHosts() {
		for _, rt := range vh.GetRoutes() {
			a := rt.GetRoute()
			if a == nil {
				continue
			}
			if c := a.GetCluster(); c != "" {
				into[c] = true
			}
			for _, wc := range a.GetWeightedClusters().GetClusters() {
				into[wc.GetName()] = true
			}
			for _, m := range a.GetRequestMirrorPolicies() {
				if c := m.GetCluster(); c != "" {
					into[c] = true
				}
			}
		}
	}
}

// walkListener calls onHCM for every HTTP connection manager of l and onTCP (when not nil) for
// every TCP proxy: its api_listener, default filter chain and filter chains.
func walkListener(l *listener.Listener, onHCM func(*hcm.HttpConnectionManager), onTCP func(*tcpproxy.TcpProxy)) {
	visit := func(typeURL string, unmarshal func(proto.Message) error) {
		switch typeURL {
		case hcmTypeURL:
			m := &hcm.HttpConnectionManager{}
			if unmarshal(m) == nil {
				onHCM(m)
			}
		case tcpProxyTypeURL:
			if onTCP == nil {
				return
			}
			t := &tcpproxy.TcpProxy{}
			if unmarshal(t) == nil {
				onTCP(t)
			}
		}
	}
	if a := l.GetApiListener().GetApiListener(); a != nil {
		visit(a.GetTypeUrl(), a.UnmarshalTo)
	}
	for _, fc := range append([]*listener.FilterChain{l.GetDefaultFilterChain()}, l.GetFilterChains()...) {
		for _, f := range fc.GetFilters() {
			if a := f.GetTypedConfig(); a != nil {
				visit(a.GetTypeUrl(), a.UnmarshalTo)
			}
		}
	}
}
