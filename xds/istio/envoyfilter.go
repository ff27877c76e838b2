// Package istio makes Istio sidecars take the endpoints of edgeflow's managed services from
// edgeflow instead of istiod. EnvoyFilters generates the EnvoyFilters that point the EDS of
// those services' outbound clusters at edgeflow's xDS server; Reconciler keeps them in a cluster
// through Istio's client-go. Istio keeps everything else (listeners, routes, mTLS).
package istio

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"
	clientnetworking "istio.io/client-go/pkg/apis/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/edgeflow/edgeflow/optimizer"
)

// ErrInvalidConfig is wrapped by Config.Validate's errors.
var ErrInvalidConfig = errors.New("xds/istio: invalid config")

const (
	// XDSClusterName is the sidecar cluster that reaches edgeflow's xDS server.
	XDSClusterName = "edgeflow-xds"
	// ManagedByLabel and ManagedByValue mark every EnvoyFilter edgeflow owns; Reconciler lists,
	// updates and deletes only filters carrying them.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "edgeflow"
	// DefaultNamespace is Istio's default root namespace: a filter there without a workload
	// selector applies to every sidecar of the mesh.
	DefaultNamespace = "istio-system"
	// DefaultConnectTimeout is the edgeflow-xds cluster's connect timeout when Config has none.
	DefaultConnectTimeout = time.Second
	// EDSInitialFetchTimeout bounds how long a sidecar waits for edgeflow's first answer for a
	// managed cluster. istiod's own EDS config waits forever ("0s"), which would hold a starting
	// sidecar's clusters, and so its readiness, for as long as edgeflow is unreachable; after
	// this timeout the cluster starts without endpoints and takes them when edgeflow answers.
	EDSInitialFetchTimeout = 15 * time.Second
	// BootstrapOverrideKey is the ConfigMap key Istio's injector mounts for the
	// sidecar.istio.io/bootstrapOverride annotation.
	BootstrapOverrideKey = "custom_bootstrap.json"

	httpProtocolOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	clusterFilterName      = XDSClusterName
	serviceFilterPrefix    = "edgeflow-eds."
)

// Config says where the filters live and how sidecars reach edgeflow.
type Config struct {
	// Namespace holds the filters; "" means DefaultNamespace. Use Istio's root namespace so the
	// filters apply to every sidecar.
	Namespace string
	// XDSAddress is HOST:PORT of edgeflow's xDS server as sidecars reach it, e.g.
	// "edgeflow.edgeflow.svc.cluster.local:18000". An IP host gives a STATIC cluster, a name a
	// STRICT_DNS one.
	XDSAddress string
	// ConnectTimeout of the edgeflow-xds cluster; 0 means DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// BootstrapCluster says the sidecars define the edgeflow-xds cluster in their bootstrap
	// (BootstrapOverride through the sidecar.istio.io/bootstrapOverride annotation), so the
	// filters do not ADD it over CDS.
	//
	// Real Envoy needs this: it accepts an api_config_source only on a cluster its bootstrap
	// defines (SubscriptionFactoryImpl::subscriptionFromConfigSource checks the cluster
	// manager's primary clusters, which are the bootstrap's static non-EDS clusters: "must have
	// a statically defined non-EDS cluster: … does not exist, was added via api, or is an EDS
	// cluster"). istiod accepts and sends an edgeflow-xds cluster ADDed over CDS, but by Envoy's
	// source a sidecar would then reject each managed cluster naming it. (Read from Envoy's
	// source; no Envoy binary was run.)
	BootstrapCluster bool
}

func (c Config) namespace() string { return cmp.Or(c.Namespace, DefaultNamespace) }

func (c Config) connectTimeout() time.Duration {
	return cmp.Or(c.ConnectTimeout, DefaultConnectTimeout)
}

// Validate checks XDSAddress (HOST:PORT with a port in 1..65535) and ConnectTimeout (not
// negative).
func (c Config) Validate() error {
	host, port, err := net.SplitHostPort(c.XDSAddress)
	if err != nil {
		return fmt.Errorf("%w: XDSAddress %q: %v", ErrInvalidConfig, c.XDSAddress, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); host == "" || err != nil || n == 0 {
		return fmt.Errorf("%w: XDSAddress %q: want HOST:PORT with a port in 1..65535", ErrInvalidConfig, c.XDSAddress)
	}
	if c.ConnectTimeout < 0 {
		return fmt.Errorf("%w: ConnectTimeout %v is negative", ErrInvalidConfig, c.ConnectTimeout)
	}
	return nil
}

// EnvoyFilters returns the EnvoyFilters that make sidecars take the EDS of services' outbound
// clusters from edgeflow, sorted by name. They apply to every sidecar's outbound clusters
// (context SIDECAR_OUTBOUND, no workload selector) in cfg's namespace:
//
//   - "edgeflow-xds" ADDs the edgeflow-xds cluster (HTTP/2 to cfg.XDSAddress); it is left out
//     when cfg.BootstrapCluster is set.
//   - "edgeflow-eds.NAME.NAMESPACE", one per service with ports, MERGEs into each port's
//     cluster outbound|PORT||NAME.NAMESPACE.svc.cluster.local an EDS config of its own (an
//     api_config_source over gRPC to edgeflow-xds, not istiod's ADS), service_name = the
//     cluster's name (the ClusterLoadAssignment edgeflow serves), and
//     common_lb_config.locality_weighted_lb_config.
//
// One filter per service rather than one for all: adding or removing a managed service creates
// or deletes its own object and leaves the others' resourceVersions alone, so an update touches
// only what changed, a conflict or a rejected write affects one service, and `kubectl get
// envoyfilters` shows which services are managed. Subset clusters
// (outbound|PORT|SUBSET|HOST) are matched by exact name, so they stay istiod's.
//
// Services without ports get no filter; ports repeated in a service count once. cfg must be
// valid (Validate); EnvoyFilters panics otherwise. It is pure and deterministic.
func EnvoyFilters(cfg Config, services []optimizer.Service) []*clientnetworking.EnvoyFilter {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	var out []*clientnetworking.EnvoyFilter
	if !cfg.BootstrapCluster {
		out = append(out, newFilter(cfg, clusterFilterName, []*networking.EnvoyFilter_EnvoyConfigObjectPatch{{
			ApplyTo: networking.EnvoyFilter_CLUSTER,
			Match:   &networking.EnvoyFilter_EnvoyConfigObjectMatch{Context: networking.EnvoyFilter_SIDECAR_OUTBOUND},
			Patch: &networking.EnvoyFilter_Patch{
				Operation: networking.EnvoyFilter_Patch_ADD,
				Value:     toStruct(XDSCluster(cfg)),
			},
		}}))
	}
	for _, s := range services {
		ports := servicePorts(s)
		if len(ports) == 0 {
			continue
		}
		patches := make([]*networking.EnvoyFilter_EnvoyConfigObjectPatch, len(ports))
		for i, port := range ports {
			name := s.IstioClusterName(port)
			patches[i] = &networking.EnvoyFilter_EnvoyConfigObjectPatch{
				ApplyTo: networking.EnvoyFilter_CLUSTER,
				Match: &networking.EnvoyFilter_EnvoyConfigObjectMatch{
					Context: networking.EnvoyFilter_SIDECAR_OUTBOUND,
					ObjectTypes: &networking.EnvoyFilter_EnvoyConfigObjectMatch_Cluster{
						Cluster: &networking.EnvoyFilter_ClusterMatch{Name: name},
					},
				},
				Patch: &networking.EnvoyFilter_Patch{
					Operation: networking.EnvoyFilter_Patch_MERGE,
					Value:     toStruct(edsPatch(name)),
				},
			}
		}
		out = append(out, newFilter(cfg, FilterName(s), patches))
	}
	slices.SortFunc(out, func(a, b *clientnetworking.EnvoyFilter) int { return cmp.Compare(a.Name, b.Name) })
	// Two services with the same name and namespace would give two filters of one name: keep
	// the first, as a Kubernetes namespace holds one Service of a name.
	return slices.CompactFunc(out, func(a, b *clientnetworking.EnvoyFilter) bool { return a.Name == b.Name })
}

// FilterName is the name of the EnvoyFilter for s: "edgeflow-eds.NAME.NAMESPACE". Service and
// namespace names are DNS labels, so the name is a valid, unambiguous object name.
func FilterName(s optimizer.Service) string {
	return serviceFilterPrefix + s.Name + "." + s.NamespaceOrDefault()
}

// servicePorts returns s's service ports, sorted and without repeats.
func servicePorts(s optimizer.Service) []int32 {
	ports := make([]int32, 0, len(s.Ports))
	for _, p := range s.Ports {
		ports = append(ports, p.Port)
	}
	slices.Sort(ports)
	return slices.Compact(ports)
}

func newFilter(cfg Config, name string, patches []*networking.EnvoyFilter_EnvoyConfigObjectPatch) *clientnetworking.EnvoyFilter {
	return &clientnetworking.EnvoyFilter{
		TypeMeta: metav1.TypeMeta{APIVersion: clientnetworking.SchemeGroupVersion.String(), Kind: "EnvoyFilter"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: cfg.namespace(),
			Labels:    map[string]string{ManagedByLabel: ManagedByValue},
		},
		Spec: networking.EnvoyFilter{ConfigPatches: patches},
	}
}

// XDSCluster is the edgeflow-xds cluster: cfg.XDSAddress over HTTP/2 (gRPC), STATIC for an IP
// and STRICT_DNS for a name. cfg must be valid.
func XDSCluster(cfg Config) *clusterv3.Cluster {
	host, portStr, _ := net.SplitHostPort(cfg.XDSAddress)
	port, _ := strconv.ParseUint(portStr, 10, 16)
	discovery := clusterv3.Cluster_STRICT_DNS
	if net.ParseIP(host) != nil {
		discovery = clusterv3.Cluster_STATIC
	}
	http2, err := anypb.New(&httpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
					Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
				},
			},
		},
	})
	if err != nil {
		panic(err) // a message of a linked type always marshals
	}
	return &clusterv3.Cluster{
		Name:                 XDSClusterName,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: discovery},
		ConnectTimeout:       durationpb.New(cfg.connectTimeout()),
		TypedExtensionProtocolOptions: map[string]*anypb.Any{
			httpProtocolOptionsKey: http2,
		},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: XDSClusterName,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{
				LbEndpoints: []*endpointv3.LbEndpoint{{
					HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
						Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
							Address:       host,
							PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
						}}},
					}},
				}},
			}},
		},
	}
}

// EDSConfig is the EDS config source of a managed cluster: edgeflow's xDS server over gRPC
// through the edgeflow-xds cluster, xDS v3, EDSInitialFetchTimeout.
func EDSConfig() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:  corev3.ApiVersion_V3,
		InitialFetchTimeout: durationpb.New(EDSInitialFetchTimeout),
		ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
			ApiType:             corev3.ApiConfigSource_GRPC,
			TransportApiVersion: corev3.ApiVersion_V3,
			GrpcServices: []*corev3.GrpcService{{
				TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
					EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: XDSClusterName},
				},
			}},
		}},
	}
}

// edsPatch is the part of Istio's cluster `name` that edgeflow replaces.
func edsPatch(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			ServiceName: name,
			EdsConfig:   EDSConfig(),
		},
		CommonLbConfig: &clusterv3.Cluster_CommonLbConfig{
			LocalityConfigSpecifier: &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
				LocalityWeightedLbConfig: &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig{},
			},
		},
	}
}

// toStruct turns an Envoy message into the Struct an EnvoyFilter patch carries, with the
// proto field names Istio's documentation uses.
func toStruct(m proto.Message) *structpb.Struct {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		panic(err) // every message here is built above from linked types
	}
	s := &structpb.Struct{}
	if err := protojson.Unmarshal(b, s); err != nil {
		panic(err)
	}
	return s
}

// BootstrapOverride is the Envoy bootstrap fragment that defines the edgeflow-xds cluster
// statically, as JSON for a ConfigMap's BootstrapOverrideKey. Pods annotated
// sidecar.istio.io/bootstrapOverride: CONFIGMAP get it merged into their sidecar's bootstrap;
// use it with Config.BootstrapCluster.
func BootstrapOverride(cfg Config) ([]byte, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &bootstrapv3.Bootstrap{StaticResources: &bootstrapv3.Bootstrap_StaticResources{
		Clusters: []*clusterv3.Cluster{XDSCluster(cfg)},
	}}
	raw, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("xds/istio: bootstrap override: %w", err)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		return nil, fmt.Errorf("xds/istio: bootstrap override: %w", err)
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// MarshalYAML renders filters as a multi-document YAML stream (kubectl apply -f, or the
// ConfigString of Istio's test server).
func MarshalYAML(filters []*clientnetworking.EnvoyFilter) ([]byte, error) {
	var out bytes.Buffer
	for i, f := range filters {
		// Status is server-owned and empty here; leave it out of what a person applies.
		doc := struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta       `json:"metadata"`
			Spec            *networking.EnvoyFilter `json:"spec"`
		}{f.TypeMeta, f.ObjectMeta, &f.Spec}
		b, err := yaml.Marshal(doc)
		if err != nil {
			return nil, fmt.Errorf("xds/istio: EnvoyFilter %s/%s: %w", f.Namespace, f.Name, err)
		}
		if i > 0 {
			out.WriteString("---\n")
		}
		out.Write(b)
	}
	return out.Bytes(), nil
}
