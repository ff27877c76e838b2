package xds

import (
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The proto builders below produce what both kinds of client accept: grpc-go's xDS client
// (api_listener → RDS → EDS clusters with ROUND_ROBIN, which it runs as
// xds_wrr_locality{round_robin}, honouring locality weights, or LEAST_REQUEST, which it runs
// as least_request_experimental over the endpoints of a priority) and Envoy (the same clusters with
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

// edsCluster is a cluster whose endpoints come from EDS over ADS, with locality weights enabled
// for Envoy, balanced round-robin or, for LBLeastRequest, least-request (choice_count 2).
func edsCluster(name string, lb LBPolicy) *cluster.Cluster {
	c := &cluster.Cluster{
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
	if lb == LBLeastRequest {
		c.LbPolicy = cluster.Cluster_LEAST_REQUEST
		c.LbConfig = &cluster.Cluster_LeastRequestLbConfig_{LeastRequestLbConfig: &cluster.Cluster_LeastRequestLbConfig{
			ChoiceCount: wrapperspb.UInt32(LeastRequestChoiceCount),
		}}
	}
	return c
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

// The builders below are for plain Envoy and Istio nodes (NodeKind Envoy, IstioSidecar).

// Well-known Envoy extension names.
const (
	hcmFilterName          = "envoy.filters.network.http_connection_manager"
	routerFilterName       = "envoy.filters.http.router"
	httpProtocolOptionsExt = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
)

// Istio's endpoint metadata for a pod that takes Istio mTLS, exactly as istiod's EDS writes it
// (istio/istio pilot/pkg/networking/util/util.go, AppendLbEndpointMetadata: when the
// endpoint's TLS mode is set and not "disabled", FilterMetadata[EnvoyTransportSocketMetadataKey
// = "envoy.transport_socket_match"] = {model.TLSModeLabelShortname = "tlsMode":
// model.IstioMutualTLSModeLabel = "istio"}, constants in pilot/pkg/model/service.go). Istio's
// outbound clusters select their mTLS transport socket by it: transport_socket_matches entry
// "tlsMode-istio" with match {"tlsMode": "istio"} (pilot/pkg/networking/core/cluster_tls.go),
// which Envoy compares with the endpoint's "envoy.transport_socket_match" metadata; an endpoint
// without it gets the plaintext default. Istio puts no tlsMode under the "istio" key; its
// "istio" {"workload": "NAME;NS;CANONICAL;REVISION;CLUSTER"} entry is telemetry only and is
// left out, because the topology does not know the workload, its labels or the cluster id.
const (
	transportSocketMatchKey = "envoy.transport_socket_match"
	tlsModeKey              = "tlsMode"
	tlsModeIstio            = "istio"
)

// istioEndpointMetadata is shared, read-only, by every endpoint of Envoy and Istio nodes.
var istioEndpointMetadata = &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
	transportSocketMatchKey: {Fields: map[string]*structpb.Value{tlsModeKey: structpb.NewStringValue(tlsModeIstio)}},
}}

// istioLbEndpoint is lbEndpoint with Istio's mTLS metadata when the pod has a sidecar. istiod
// writes the metadata only for an endpoint whose pod is labelled security.istio.io/tlsMode=istio
// (AppendLbEndpointMetadata skips tlsMode "" and "disabled", and GetTLSModeFromEndpointLabels
// gives "disabled" without the label): a pod without a sidecar cannot answer the mTLS handshake
// the metadata would select.
func istioLbEndpoint(host string, port uint32, sidecar bool) *endpoint.LbEndpoint {
	e := lbEndpoint(host, port)
	if sidecar {
		e.Metadata = istioEndpointMetadata
	}
	return e
}

func socketAddress(host string, port uint32) *core.Address {
	return &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Protocol:      core.SocketAddress_TCP,
		Address:       host,
		PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
	}}}
}

// outboundListener is a plain Envoy node's listener for service port port: bound on
// EnvoyListenerAddress:port, one filter chain with an HTTP connection manager (codec AUTO, so
// HTTP/1.1 and HTTP/2 — gRPC — both work) that takes RouteConfiguration RouteName(port) from
// ADS and ends in the router filter.
func outboundListener(port uint32) *listener.Listener {
	name := ListenerName(port)
	m := &hcm.HttpConnectionManager{
		CodecType:  hcm.HttpConnectionManager_AUTO,
		StatPrefix: "outbound_" + name,
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource: adsSource(), RouteConfigName: RouteName(port),
		}},
		HttpFilters: []*hcm.HttpFilter{{
			Name:       routerFilterName,
			ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})},
		}},
	}
	if err := m.ValidateAll(); err != nil {
		panic("xds: generated HttpConnectionManager is invalid: " + err.Error())
	}
	return &listener.Listener{
		Name:             name,
		Address:          socketAddress(EnvoyListenerAddress, port),
		TrafficDirection: core.TrafficDirection_OUTBOUND,
		FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{{
			Name:       hcmFilterName,
			ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(m)},
		}}}},
	}
}

// virtualHost is one service's virtual host in a port's RouteConfiguration: requests whose
// :authority is one of domains go to cluster. The route has no timeout, as Istio's default
// (Envoy's own default of 15 s would cut long gRPC streams).
func virtualHost(name string, domains []string, cluster string) *route.VirtualHost {
	return &route.VirtualHost{
		Name:    name,
		Domains: domains,
		Routes: []*route.Route{{
			Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
			Action: &route.Route_Route{Route: &route.RouteAction{
				ClusterSpecifier: &route.RouteAction_Cluster{Cluster: cluster},
				Timeout:          durationpb.New(0),
			}},
		}},
	}
}

// envoyCluster is edsCluster for a plain Envoy node, which proxies HTTP/1.1 and HTTP/2: the
// upstream speaks what the downstream spoke (gRPC stays HTTP/2).
func envoyCluster(name string, lb LBPolicy) *cluster.Cluster {
	c := edsCluster(name, lb)
	c.TypedExtensionProtocolOptions = map[string]*anypb.Any{
		httpProtocolOptionsExt: mustAny(&upstreamhttp.HttpProtocolOptions{
			UpstreamProtocolOptions: &upstreamhttp.HttpProtocolOptions_UseDownstreamProtocolConfig{
				UseDownstreamProtocolConfig: &upstreamhttp.HttpProtocolOptions_UseDownstreamHttpConfig{
					HttpProtocolOptions:  &core.Http1ProtocolOptions{},
					Http2ProtocolOptions: &core.Http2ProtocolOptions{},
				},
			},
		}),
	}
	return c
}
