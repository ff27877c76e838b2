package xds

import (
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The proto builders below produce what both kinds of client accept: grpc-go's xDS client
// (api_listener → RDS → EDS clusters with ROUND_ROBIN, which it runs as
// xds_wrr_locality{round_robin}, honouring locality weights) and Envoy (the same clusters with
// locality_weighted_lb_config, which gRPC ignores).

// mustAny packs m; it panics only on a proto the binary cannot marshal, a programming error.
func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic("xds: packing " + string(m.ProtoReflect().Descriptor().FullName()) + ": " + err.Error())
	}
	return a
}

// adsSource points a resource's dependencies at the same ADS stream.
func adsSource() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

// apiListener is the Listener a proxyless gRPC client resolves for target xds:///name: an HTTP
// connection manager taking its routes from RDS resource name, and the router filter.
func apiListener(name string) *listener.Listener {
	m := &hcm.HttpConnectionManager{
		StatPrefix: name,
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource: adsSource(), RouteConfigName: name,
		}},
		HttpFilters: []*hcm.HttpFilter{{
			Name:       "envoy.filters.http.router",
			ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})},
		}},
	}
	if err := m.ValidateAll(); err != nil { // the Listener's own validation does not look inside the Any
		panic("xds: generated HttpConnectionManager is invalid: " + err.Error())
	}
	return &listener.Listener{Name: name, ApiListener: &listener.ApiListener{ApiListener: mustAny(m)}}
}

// routeConfig is a RouteConfiguration with one catch-all virtual host and route.
func routeConfig(name string, action *route.RouteAction) *route.RouteConfiguration {
	return &route.RouteConfiguration{
		Name: name,
		VirtualHosts: []*route.VirtualHost{{
			Name:    name,
			Domains: []string{"*"},
			Routes: []*route.Route{{
				Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: ""}},
				Action: &route.Route_Route{Route: action},
			}},
		}},
	}
}

func clusterWeight(name string, w int64) *route.WeightedCluster_ClusterWeight {
	return &route.WeightedCluster_ClusterWeight{Name: name, Weight: wrapperspb.UInt32(uint32(w))}
}

// edsCluster is a round-robin cluster whose endpoints come from EDS over ADS, with locality
// weights enabled for Envoy.
func edsCluster(name string) *cluster.Cluster {
	return &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: adsSource()},
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
		CommonLbConfig: &cluster.Cluster_CommonLbConfig{
			LocalityConfigSpecifier: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
				LocalityWeightedLbConfig: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig{},
			},
		},
	}
}

func lbEndpoint(host string, port uint32) *endpoint.LbEndpoint {
	return &endpoint.LbEndpoint{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
		Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
			Protocol:      core.SocketAddress_TCP,
			Address:       host,
			PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
		}}},
	}}}
}

// localityEndpoints is one callee pod's locality. loc and eps are shared between assignments
// (read-only), only the weight and priority are this assignment's own.
func localityEndpoints(loc *core.Locality, eps []*endpoint.LbEndpoint, weight int64, priority uint32) *endpoint.LocalityLbEndpoints {
	return &endpoint.LocalityLbEndpoints{
		Locality:            loc,
		LbEndpoints:         eps,
		LoadBalancingWeight: wrapperspb.UInt32(uint32(weight)),
		Priority:            priority,
	}
}
