// Package istio makes Istio sidecars take the endpoints of edgeflow's managed services from
// edgeflow instead of istiod (per-pod mode, opt-in). EnvoyFilters generates the EnvoyFilters
// that point the EDS of those services' outbound clusters at edgeflow's xDS server, for the
// sidecars of pods labelled EDSLabel=EDSLabelValue; BootstrapConfigMaps the ConfigMaps whose
// bootstrap override (sidecar.istio.io/bootstrapOverride) gives those sidecars the static
// edgeflow-xds cluster; Reconciler keeps both in a cluster through Istio's and Kubernetes'
// client-go. Istio keeps everything else (listeners, routes, mTLS).
//
// Rules (Envoy's, read from its source; no Envoy binary was run):
//   - An EDS cluster's api_config_source must name a cluster the bootstrap defines statically
//     and that is not itself EDS: Envoy's SubscriptionFactoryImpl::subscriptionFromConfigSource
//     (source/common/config/subscription_factory_impl.cc) calls
//     Utility::checkApiConfigSourceSubscriptionBackingCluster(cm_.primaryClusters(), …)
//     (source/common/config/utility.cc), which throws "… must have a statically defined
//     non-EDS cluster: 'edgeflow-xds' does not exist, was added via api, or is an EDS
//     cluster". So the edgeflow-xds cluster comes only from the bootstrap override, never over
//     CDS, and only sidecars that have it (the pod label) get the EDS patches.
//   - Subset clusters (outbound|PORT|SUBSET|HOST) are not patched: their endpoints are the pods
//     matching the DestinationRule subset's labels, which edgeflow's topology does not hold, so
//     edgeflow cannot serve a correct per-subset assignment. They keep istiod's EDS.
package istio

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"
	clientnetworking "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/edgeflow/edgeflow/optimizer"
)

// ErrInvalidConfig is wrapped by Config.Validate's errors.
var ErrInvalidConfig = errors.New("xds/istio: invalid config")

const (
	// XDSClusterName is the sidecar cluster that reaches edgeflow's xDS server; it is defined
	// in the sidecar's bootstrap (BootstrapOverride).
	XDSClusterName = "edgeflow-xds"
	// ManagedByLabel and ManagedByValue mark every object edgeflow owns; Reconciler lists,
	// updates and deletes only objects carrying them.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "edgeflow"
	// EDSLabel and EDSLabelValue are the pod label that opts a pod's sidecar into taking the
	// managed services' endpoints from edgeflow: the EnvoyFilters' workloadSelector (which
	// matches labels, not annotations). Set it together with BootstrapAnnotation, never
	// alone: a sidecar with the patches but without the bootstrap cluster would reject them.
	EDSLabel      = "edgeflow.io/eds"
	EDSLabelValue = "true"
	// BootstrapAnnotation is the pod annotation by which Istio's injector mounts a ConfigMap's
	// BootstrapOverrideKey and has istio-agent pass it to Envoy (--config-yaml, merged into
	// the bootstrap); its value is BootstrapConfigMapName.
	BootstrapAnnotation = "sidecar.istio.io/bootstrapOverride"
	// BootstrapConfigMapName is the ConfigMap edgeflow manages in every namespace holding a
	// managed service.
	BootstrapConfigMapName = "edgeflow-bootstrap"
	// SDSClusterName, SDSCertName and SDSRootName are the bootstrap cluster of istio-agent's
	// SDS server and the names of the workload certificate and the mesh root it serves, as
	// Istio's own bootstrap template uses them (istio/istio
	// tools/packaging/common/envoy_bootstrap.json, cluster "sds-grpc"; pkg/model/
	// authentication.go SDSClusterName, SDSDefaultResourceName "default",
	// SDSRootResourceName "ROOTCA").
	SDSClusterName = "sds-grpc"
	SDSCertName    = "default"
	SDSRootName    = "ROOTCA"
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
	tlsTransportSocketName = "envoy.transport_sockets.tls"
	serviceFilterPrefix    = "edgeflow-eds."
)

// FilterNamespaceAnnotation is on every EnvoyFilter edgeflow writes: the namespace whose
// managed services it carries, the rest of its name (FilterName). With the label, the name
// and the filters' namespace, it is what makes a filter edgeflow's (ownedFilter).
const FilterNamespaceAnnotation = "edgeflow.io/namespace"

// Config says where the filters live and how sidecars reach edgeflow.
type Config struct {
	// Namespace holds the filters; "" means DefaultNamespace. Use Istio's root namespace so the
	// filters apply to the labelled pods of every namespace.
	Namespace string
	// XDSAddress is HOST:PORT of edgeflow's xDS server as sidecars reach it, e.g.
	// "edgeflow.edgeflow.svc.cluster.local:18000". An IP host gives a STATIC cluster, a name a
	// STRICT_DNS one.
	XDSAddress string
	// ConnectTimeout of the edgeflow-xds cluster; 0 means DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// ClusterDomain is the Kubernetes cluster's DNS domain in the names of Istio's clusters
	// ("" means optimizer.DefaultClusterDomain): the same value as the xDS server's.
	ClusterDomain string
	// TLS says the xDS port serves TLS: the edgeflow-xds cluster then gets a TLS transport
	// socket that presents the sidecar's own workload certificate (mutual TLS) and verifies
	// edgeflow's against the mesh root, both from istio-agent's SDS (SDSClusterName,
	// SDSCertName, SDSRootName), as Istio's bootstrap does for its own clusters. edgeflow's
	// serving certificate must then chain to the mesh's root CA.
	TLS bool
	// TLSServerName is the SNI the sidecar sends; "" means XDSAddress's host when it is a
	// name (none for an IP).
	TLSServerName string
	// TLSServerSANs are the subject alternative names (exact; a URI SAN when the name has
	// "://", as a SPIFFE id, else a DNS SAN) one of which edgeflow's certificate must carry:
	// edgeflow's own identity, typically its SPIFFE id
	// spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT. With TLS, Validate requires them
	// unless TLSAnyServer says otherwise.
	TLSServerSANs []string
	// TLSAnyServer, with TLS and no TLSServerSANs, has the sidecars accept any certificate the
	// mesh root signed as edgeflow's: any workload of the mesh that can be reached at
	// XDSAddress could then serve the sidecars their endpoints. It must be asked for.
	TLSAnyServer bool
}

func (c Config) namespace() string { return cmp.Or(c.Namespace, DefaultNamespace) }

func (c Config) connectTimeout() time.Duration {
	return cmp.Or(c.ConnectTimeout, DefaultConnectTimeout)
}

// Validate checks XDSAddress (HOST:PORT with a port in 1..65535), ConnectTimeout (not
// negative), ClusterDomain (a DNS name) and the TLS fields (only with TLS; with TLS, either
// TLSServerSANs or TLSAnyServer, not both).
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
	if c.ClusterDomain != "" {
		if errs := validation.IsDNS1123Subdomain(c.ClusterDomain); len(errs) > 0 {
			return fmt.Errorf("%w: ClusterDomain %q: %s", ErrInvalidConfig, c.ClusterDomain, strings.Join(errs, "; "))
		}
	}
	if !c.TLS && (c.TLSServerName != "" || len(c.TLSServerSANs) > 0 || c.TLSAnyServer) {
		return fmt.Errorf("%w: TLSServerName, TLSServerSANs or TLSAnyServer without TLS", ErrInvalidConfig)
	}
	if c.TLSAnyServer && len(c.TLSServerSANs) > 0 {
		return fmt.Errorf("%w: TLSAnyServer with TLSServerSANs %q: either any certificate the mesh root signed, or one carrying a SAN", ErrInvalidConfig, c.TLSServerSANs)
	}
	if c.TLS && len(c.TLSServerSANs) == 0 && !c.TLSAnyServer {
		return fmt.Errorf("%w: TLS without TLSServerSANs: the sidecars would take any certificate the mesh root signed for edgeflow's; "+
			"name edgeflow's SAN (its SPIFFE id), or set TLSAnyServer", ErrInvalidConfig)
	}
	for _, san := range c.TLSServerSANs {
		if san == "" {
			return fmt.Errorf("%w: TLSServerSANs %q: an empty SAN", ErrInvalidConfig, c.TLSServerSANs)
		}
	}
	return nil
}

// serverName is the SNI of the edgeflow-xds cluster's TLS.
func (c Config) serverName() string {
	if c.TLSServerName != "" {
		return c.TLSServerName
	}
	host, _, _ := net.SplitHostPort(c.XDSAddress)
	if net.ParseIP(host) != nil {
		return ""
	}
	return host
}

// EnvoyFilters returns the EnvoyFilters that make the sidecars of pods labelled
// EDSLabel=EDSLabelValue take the EDS of services' outbound clusters from edgeflow, sorted by
// name: "edgeflow-eds.NAMESPACE", one per namespace holding a service with ports, in cfg's
// namespace, each with that workloadSelector, MERGEs into each port's cluster
// outbound|PORT||NAME.NAMESPACE.svc.DOMAIN (context SIDECAR_OUTBOUND) of that namespace's
// services (by name, then port) an EDS config of its own (an api_config_source over gRPC to
// the bootstrap's edgeflow-xds cluster, not istiod's ADS), service_name = the cluster's name
// (the ClusterLoadAssignment edgeflow serves), and common_lb_config.locality_weighted_lb_config.
//
// No filter ADDs the edgeflow-xds cluster: Envoy would reject every cluster naming a cluster
// that came over CDS (see the package doc); the sidecars take it from BootstrapOverride.
//
// One filter per namespace, not per service: a tenant who can label Services in a namespace
// makes edgeflow write one object in cfg's namespace (usually istio-system) for all of them,
// however many it labels; adding or removing a managed service rewrites its namespace's filter
// only, so other namespaces' resourceVersions stay, and a conflict or a rejected write affects
// one namespace. Subset clusters (outbound|PORT|SUBSET|HOST) are matched by exact name, so they
// stay istiod's (package doc).
//
// Services without ports get no patch, a namespace without patches no filter; ports repeated
// in a service count once, and a service repeated in a namespace (by name) once, the first.
// cfg must be valid (Validate); EnvoyFilters panics otherwise. It is pure and deterministic.
func EnvoyFilters(cfg Config, services []optimizer.Service) []*clientnetworking.EnvoyFilter {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	byNS := map[string][]optimizer.Service{}
	for _, s := range services {
		ns := s.NamespaceOrDefault()
		if !slices.ContainsFunc(byNS[ns], func(o optimizer.Service) bool { return o.Name == s.Name }) {
			byNS[ns] = append(byNS[ns], s)
		}
	}
	var out []*clientnetworking.EnvoyFilter
	for _, ns := range slices.Sorted(maps.Keys(byNS)) {
		in := byNS[ns]
		slices.SortStableFunc(in, func(a, b optimizer.Service) int { return cmp.Compare(a.Name, b.Name) })
		var patches []*networking.EnvoyFilter_EnvoyConfigObjectPatch
		for _, s := range in {
			for _, port := range servicePorts(s) {
				patches = append(patches, clusterPatch(s.IstioClusterName(port, cfg.ClusterDomain)))
			}
		}
		if len(patches) > 0 {
			out = append(out, newFilter(cfg, FilterName(ns), ns, patches))
		}
	}
	return out
}

// clusterPatch MERGEs edgeflow's EDS config (edsPatch) into the sidecars' outbound cluster
// name, matched by exact name.
func clusterPatch(name string) *networking.EnvoyFilter_EnvoyConfigObjectPatch {
	return &networking.EnvoyFilter_EnvoyConfigObjectPatch{
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

// FilterName is the name of the EnvoyFilter of namespace ns's managed services:
// "edgeflow-eds.NAMESPACE". A namespace name is a DNS label, so the name is a valid,
// unambiguous object name.
func FilterName(ns string) string {
	return serviceFilterPrefix + ns
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

// ownedFilter says whether f is edgeflow's: labelled ManagedByLabel=ManagedByValue, in cfg's
// namespace, named "edgeflow-eds.NAMESPACE" and annotated FilterNamespaceAnnotation=NAMESPACE,
// as EnvoyFilters writes them, or one an earlier edgeflow wrote (legacyFilter). A filter with
// the label alone is someone else's: edgeflow never updates nor deletes it.
func ownedFilter(cfg Config, f *clientnetworking.EnvoyFilter) bool {
	ns := f.Annotations[FilterNamespaceAnnotation]
	return f.Labels[ManagedByLabel] == ManagedByValue && f.Namespace == cfg.namespace() &&
		len(validation.IsDNS1123Label(ns)) == 0 && f.Name == FilterName(ns) || legacyFilter(cfg, f)
}

// legacyFilter says whether f is a filter of one service as edgeflow wrote them before one per
// namespace: labelled, in cfg's namespace, named "edgeflow-eds.NAME.NAMESPACE", no
// FilterNamespaceAnnotation, and exactly the spec edgeflow wrote for that service (the
// workload selector, then one clusterPatch per port of its clusters, nothing else). Such a
// filter is deleted on the way to the namespace's (a copy anyone made does exactly what
// edgeflow's did).
func legacyFilter(cfg Config, f *clientnetworking.EnvoyFilter) bool {
	svc, ok := strings.CutPrefix(f.Name, serviceFilterPrefix)
	name, ns, two := strings.Cut(svc, ".")
	if !ok || !two || f.Labels[ManagedByLabel] != ManagedByValue || f.Namespace != cfg.namespace() ||
		f.Annotations[FilterNamespaceAnnotation] != "" || len(validation.IsDNS1123Label(name)) > 0 || len(validation.IsDNS1123Label(ns)) > 0 ||
		len(f.Spec.ConfigPatches) == 0 {
		return false
	}
	want := newFilter(cfg, f.Name, "", nil)
	host := "||" + name + "." + ns + ".svc." + cmp.Or(cfg.ClusterDomain, optimizer.DefaultClusterDomain)
	for _, p := range f.Spec.ConfigPatches {
		cluster := p.GetMatch().GetCluster().GetName()
		if !strings.HasPrefix(cluster, "outbound|") || !strings.HasSuffix(cluster, host) {
			return false
		}
		want.Spec.ConfigPatches = append(want.Spec.ConfigPatches, clusterPatch(cluster))
	}
	return proto.Equal(&f.Spec, &want.Spec)
}

func newFilter(cfg Config, name, namespace string, patches []*networking.EnvoyFilter_EnvoyConfigObjectPatch) *clientnetworking.EnvoyFilter {
	return &clientnetworking.EnvoyFilter{
		TypeMeta: metav1.TypeMeta{APIVersion: clientnetworking.SchemeGroupVersion.String(), Kind: "EnvoyFilter"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   cfg.namespace(),
			Labels:      map[string]string{ManagedByLabel: ManagedByValue},
			Annotations: map[string]string{FilterNamespaceAnnotation: namespace},
		},
		Spec: networking.EnvoyFilter{
			WorkloadSelector: &networking.WorkloadSelector{Labels: map[string]string{EDSLabel: EDSLabelValue}},
			ConfigPatches:    patches,
		},
	}
}

// XDSCluster is the edgeflow-xds cluster of the sidecars' bootstrap: cfg.XDSAddress over
// HTTP/2 (gRPC), STATIC for an IP and STRICT_DNS for a name, with a TLS transport socket when
// cfg.TLS (xdsTLS). cfg must be valid.
func XDSCluster(cfg Config) *clusterv3.Cluster {
	host, portStr, _ := net.SplitHostPort(cfg.XDSAddress)
	port, _ := strconv.ParseUint(portStr, 10, 16)
	discovery := clusterv3.Cluster_STRICT_DNS
	if net.ParseIP(host) != nil {
		discovery = clusterv3.Cluster_STATIC
	}
	http2 := mustAny(&httpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
					Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
				},
			},
		},
	})
	c := &clusterv3.Cluster{
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
	if cfg.TLS {
		c.TransportSocket = &corev3.TransportSocket{
			Name:       tlsTransportSocketName,
			ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(xdsTLS(cfg))},
		}
	}
	return c
}

// xdsTLS is the edgeflow-xds cluster's TLS: the sidecar's workload certificate (SDS secret
// SDSCertName) as its client certificate, edgeflow's verified against the mesh root (SDS
// secret SDSRootName) and, unless cfg.TLSAnyServer, matched against cfg.TLSServerSANs
// (match_typed_subject_alt_names), both certificates from istio-agent's SDS server through the bootstrap's
// SDSClusterName cluster, ALPN h2 — what Istio builds for a bootstrap cluster with
// ISTIO_MUTUAL TLS (istio/istio pkg/bootstrap/option/convert.go tlsContextConvert, and
// pkg/model/authentication.go ConstructSdsSecretConfig for the SDS config source).
func xdsTLS(cfg Config) *tlsv3.UpstreamTlsContext {
	var sans []*tlsv3.SubjectAltNameMatcher
	for _, san := range cfg.TLSServerSANs {
		typ := tlsv3.SubjectAltNameMatcher_DNS
		if strings.Contains(san, "://") {
			typ = tlsv3.SubjectAltNameMatcher_URI // a SPIFFE id
		}
		sans = append(sans, &tlsv3.SubjectAltNameMatcher{SanType: typ,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: san}}})
	}
	return &tlsv3.UpstreamTlsContext{
		Sni: cfg.serverName(),
		CommonTlsContext: &tlsv3.CommonTlsContext{
			AlpnProtocols:                  []string{"h2"},
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sdsSecret(SDSCertName)},
			ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{
				CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
					DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: sans},
					ValidationContextSdsSecretConfig: sdsSecret(SDSRootName),
				},
			},
		},
	}
}

// sdsSecret is secret name from istio-agent's SDS server, as Istio's
// ConstructSdsSecretConfig writes it.
func sdsSecret(name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{
		Name: name,
		SdsConfig: &corev3.ConfigSource{
			ResourceApiVersion: corev3.ApiVersion_V3,
			ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
				ApiType:                   corev3.ApiConfigSource_GRPC,
				TransportApiVersion:       corev3.ApiVersion_V3,
				SetNodeOnFirstMessageOnly: true,
				GrpcServices: []*corev3.GrpcService{{
					TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
						EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: SDSClusterName},
					},
				}},
			}},
		},
	}
}

// mustAny packs m, a message of a linked type (which always marshals).
func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}

// EDSConfig is the EDS config source of a managed cluster: edgeflow's xDS server over gRPC
// through the bootstrap's edgeflow-xds cluster, xDS v3, EDSInitialFetchTimeout.
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
// statically (XDSCluster), as JSON for a ConfigMap's BootstrapOverrideKey. istio-agent passes
// it to Envoy with --config-yaml, which Envoy merges into the bootstrap Istio generated (a
// repeated field such as static_resources.clusters is appended to), so the sidecar keeps
// Istio's own static clusters (xds-grpc, sds-grpc, …) and gains edgeflow-xds.
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

// BootstrapConfigMap is the ConfigMap BootstrapConfigMapName in namespace, holding
// BootstrapOverride(cfg) under BootstrapOverrideKey, labelled ManagedByLabel=ManagedByValue.
// Pods of namespace annotated BootstrapAnnotation: BootstrapConfigMapName get it.
func BootstrapConfigMap(cfg Config, namespace string) (*corev1.ConfigMap, error) {
	b, err := BootstrapOverride(cfg)
	if err != nil {
		return nil, err
	}
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      BootstrapConfigMapName,
			Namespace: namespace,
			Labels:    map[string]string{ManagedByLabel: ManagedByValue},
		},
		Data: map[string]string{BootstrapOverrideKey: string(b)},
	}, nil
}

// BootstrapConfigMaps returns BootstrapConfigMap for every namespace holding one of services
// (with ports or not: a caller's namespace needs it whatever it serves), sorted by namespace.
// cfg must be valid; it panics otherwise.
func BootstrapConfigMaps(cfg Config, services []optimizer.Service) []*corev1.ConfigMap {
	var namespaces []string
	for _, s := range services {
		namespaces = append(namespaces, s.NamespaceOrDefault())
	}
	slices.Sort(namespaces)
	namespaces = slices.Compact(namespaces)
	out := make([]*corev1.ConfigMap, len(namespaces))
	for i, ns := range namespaces {
		cm, err := BootstrapConfigMap(cfg, ns)
		if err != nil {
			panic(err)
		}
		out[i] = cm
	}
	return out
}

// PodTemplatePatch is what a caller workload's pod template needs for its sidecar to take the
// managed services' endpoints from edgeflow: the BootstrapAnnotation and the EDSLabel, as a
// strategic-merge patch of a Deployment (kubectl patch deployment NAME --patch-file …).
func PodTemplatePatch() []byte {
	return []byte(`spec:
  template:
    metadata:
      annotations:
        ` + BootstrapAnnotation + `: ` + BootstrapConfigMapName + `
      labels:
        ` + EDSLabel + `: "` + EDSLabelValue + `"
`)
}

// MarshalYAML renders filters as a multi-document YAML stream (kubectl apply -f, or the
// ConfigString of Istio's test server).
func MarshalYAML(filters []*clientnetworking.EnvoyFilter) ([]byte, error) {
	var out bytes.Buffer
	for i, f := range filters {
		if err := appendDoc(&out, i > 0, "EnvoyFilter", f.TypeMeta, f.ObjectMeta, &f.Spec); err != nil {
			return nil, err
		}
	}
	return out.Bytes(), nil
}

// appendDoc appends one Istio object to a multi-document YAML stream, after a separator unless
// it is the first: its type, metadata and spec (status is server-owned and empty here; it is
// left out of what a person applies).
func appendDoc(out *bytes.Buffer, separate bool, kind string, tm metav1.TypeMeta, om metav1.ObjectMeta, spec any) error {
	doc := struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        metav1.ObjectMeta `json:"metadata"`
		Spec            any               `json:"spec"`
	}{tm, om, spec}
	b, err := yaml.Marshal(doc)
	if err != nil {
		return fmt.Errorf("xds/istio: %s %s/%s: %w", kind, om.Namespace, om.Name, err)
	}
	if separate {
		out.WriteString("---\n")
	}
	out.Write(b)
	return nil
}
