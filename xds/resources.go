package xds

import (
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	leastrequestv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	wrrlocalityv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/wrr_locality/v3"
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

// grpcCluster is the cluster proxyless gRPC nodes get for lb: bandsGRPCCluster for LBBands,
// else edsCluster.
func grpcCluster(name string, lb LBPolicy) *cluster.Cluster {
	if lb == LBBands {
		return bandsGRPCCluster(name)
	}
	return edsCluster(name, lb)
}

// Extension names of the load-balancing policies LBBands' gRPC cluster names (the names
// Envoy registers them under; grpc-go looks them up by type URL).
const (
	wrrLocalityPolicyName  = "envoy.load_balancing_policies.wrr_locality"
	leastRequestPolicyName = "envoy.load_balancing_policies.least_request"
)

// bandsGRPCCluster is LBBands' cluster for proxyless gRPC: EDS over ADS, lb_policy
// ROUND_ROBIN and load_balancing_policy WrrLocality{LeastRequest{choice_count 2}}, so that
// grpc-go picks a locality (a band) by its weight and then an endpoint by least-request.
//
// What grpc-go 1.85 does with it:
//   - internal/xds/xdsclient/xdsresource/unmarshal_cds.go,
//     validateClusterAndConstructClusterUpdate: lb_policy is switched on first (ROUND_ROBIN,
//     RING_HASH and LEAST_REQUEST pass; anything else NACKs the cluster even when
//     load_balancing_policy is set), then a load_balancing_policy replaces it and its JSON is
//     parsed by the balancer registry, so a policy's own ParseConfig can NACK the cluster.
//     The bare LEAST_REQUEST enum would run least_request_experimental over all endpoints of
//     a priority, locality weights ignored — hence WrrLocality.
//   - internal/xds/xdsclient/xdslbregistry/xdslbregistry.go, ConvertToServiceConfig: the
//     first policy whose type URL has a converter wins; unknown types are skipped; none at
//     all, or more than 16 levels of nesting, NACKs.
//   - internal/xds/xdsclient/xdslbregistry/converter/converter.go,
//     convertWRRLocalityProtoToServiceConfig: endpoint_picking_policy converted recursively
//     into xds_wrr_locality_experimental's childPolicy (a weighted_target over localities by
//     locality weight, internal/xds/balancer/wrrlocality/balancer.go, UpdateClientConnState).
//   - same file, convertLeastRequestProtoToServiceConfig: reads choice_count only (default
//     2); active_request_bias, slow_start_config, locality_lb_config, enable_full_scan and
//     selection_method are ignored.
//   - balancer/leastrequest/leastrequest.go, bb.ParseConfig: choice_count < 2 is rejected
//     (the cluster NACKed), > 10 clamped to 10; picker.Pick draws choice_count of the READY
//     endpoints uniformly and takes the one with fewest RPCs in flight: endpoint weights are
//     ignored.
//
// common_lb_config is left unset: grpc-go ignores it, and Envoy rejects
// locality_weighted_lb_config beside a load_balancing_policy. Envoy rejects this cluster in any
// case (its WrrLocality takes only ClientSideWeightedRoundRobin to pick endpoints,
// checkEndpointPicking): it is for proxyless nodes only; Envoy nodes get envoyCluster.
func bandsGRPCCluster(name string) *cluster.Cluster {
	lr := &leastrequestv3.LeastRequest{ChoiceCount: wrapperspb.UInt32(LeastRequestChoiceCount)}
	wrr := &wrrlocalityv3.WrrLocality{EndpointPickingPolicy: &cluster.LoadBalancingPolicy{
		Policies: []*cluster.LoadBalancingPolicy_Policy{{TypedExtensionConfig: &core.TypedExtensionConfig{
			Name: leastRequestPolicyName, TypedConfig: mustAny(lr)}}},
	}}
	return &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: adsSource()},
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
		LoadBalancingPolicy: &cluster.LoadBalancingPolicy{Policies: []*cluster.LoadBalancingPolicy_Policy{{
			TypedExtensionConfig: &core.TypedExtensionConfig{Name: wrrLocalityPolicyName, TypedConfig: mustAny(wrr)},
		}}},
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
// EnvoyListenerAddress:bind (port, or port plus TranslateConfig.EgressPortOffset), one filter chain with an HTTP connection manager (codec AUTO, so
// HTTP/1.1 and HTTP/2 — gRPC — both work) that takes RouteConfiguration RouteName(port) from
// ADS and ends in the router filter.
func outboundListener(port, bind uint32) *listener.Listener {
	name := ListenerName(bind)
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
		Address:          socketAddress(EnvoyListenerAddress, bind),
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
//
// For LBBands it is LEAST_REQUEST with locality_weighted_lb_config (a band is picked by its
// locality weight) and least_request_lb_config {choice_count 2, active_request_bias
// ActiveRequestBias under runtime key ActiveRequestBiasRuntimeKey}. What Envoy does with it
// (source/extensions/load_balancing_policies/least_request/least_request_lb.{h,cc},
// common/load_balancer_impl.cc):
//   - ZoneAwareLoadBalancerBase::hostSourceToUse picks a locality by weight only when
//     locality_weighted_lb_config is set (the legacy enum's config is converted by
//     TypedLeastRequestLbConfig's constructor, convertLocalityLbConfigTo);
//   - inside the locality, EdfLoadBalancerBase::refresh skips the weighted (EDF) schedule
//     when all hosts' weights are equal and none is in slow start: the pick is then P2C
//     over choice_count random hosts, fewest active requests, and the bias has no effect —
//     unless, in newer Envoys, the bias is set explicitly and the runtime feature
//     envoy.reloadable_features.least_request_lb_active_request_bias_forces_weighted is on
//     (LeastRequestLoadBalancer::refresh, alwaysUseWeightedSelection);
//   - with unequal weights (pods of different capacity in a band) each host's weight is
//     load_balancing_weight / (active + 1)^bias (LeastRequestLoadBalancer::hostWeight);
//   - a negative or NaN bias is not rejected but replaced by 1.0 with a warning
//     (LeastRequestLoadBalancer::refresh), which CheckClusters refuses to serve.
func envoyCluster(name string, lb LBPolicy) *cluster.Cluster {
	c := edsCluster(name, lb)
	if lb == LBBands {
		c.LbPolicy = cluster.Cluster_LEAST_REQUEST
		c.LbConfig = &cluster.Cluster_LeastRequestLbConfig_{LeastRequestLbConfig: &cluster.Cluster_LeastRequestLbConfig{
			ChoiceCount:       wrapperspb.UInt32(LeastRequestChoiceCount),
			ActiveRequestBias: &core.RuntimeDouble{DefaultValue: ActiveRequestBias, RuntimeKey: ActiveRequestBiasRuntimeKey},
		}}
	}
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
