package istio

// Envoy's rules that istiod's pilot does not check, encoded from Envoy's source so that a
// configuration a real sidecar would reject fails here (no Envoy binary can be run here).
//
//  1. A config source's backing cluster. Envoy builds every xDS subscription that is not ADS
//     (an EDS cluster's eds_config, an SDS secret's sds_config, …) in
//     SubscriptionFactoryImpl::subscriptionFromConfigSource
//     (envoyproxy/envoy source/common/config/subscription_factory_impl.cc), which for an
//     api_config_source first calls
//     Utility::checkApiConfigSourceSubscriptionBackingCluster(cm_.primaryClusters(), api_config_source)
//     (source/common/config/utility.cc). That skips AGGREGATED_GRPC and AGGREGATED_DELTA_GRPC,
//     takes cluster_names[0] when set, else, for a gRPC source, grpc_services[0].envoy_grpc's
//     cluster_name, and Utility::validateClusterName throws unless the name is among the
//     primary clusters — the bootstrap's static_resources clusters that are not EDS:
//       "{type} must have a statically defined non-EDS cluster: '{name}' does not exist, was
//       added via api, or is an EDS cluster"
//     A cluster that throws there fails the whole CDS update (NACK).
//  2. An EDS update without the cluster's assignment is ignored, the old endpoints kept:
//     EdsClusterImpl::onConfigUpdate (source/extensions/clusters/eds/eds.cc) returns at once
//     when resources is empty ("Missing ClusterLoadAssignment for {} in onConfigUpdate()",
//     update_empty_), and its delta overload drops removed_resources and calls it with the
//     added ones only. So a response must never omit (SOTW) or remove (delta) an assignment the
//     sidecar subscribed to and held: it must send it, empty if need be.
//
// The bootstrap is Istio's own: pilot-agent's generator (istio.io/istio pkg/bootstrap) renders
// the template the sidecar image ships (tools/packaging/common/envoy_bootstrap.json), and the
// bootstrap override is appended as Envoy's --config-yaml merge appends repeated fields.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"istio.io/istio/pkg/bootstrap"
	"istio.io/istio/pkg/bootstrap/platform"
	"istio.io/istio/pkg/config/mesh"
)

// staticCluster is a cluster of a bootstrap's static_resources.
type staticCluster struct {
	Name string `json:"name"`
	Type string `json:"type"` // "" is Envoy's default, STATIC
}

// istioBootstrapJSON renders the bootstrap pilot-agent gives the sidecar sidecarID, from the
// template of the istio.io/istio module this test builds against.
func istioBootstrapJSON(t *testing.T) []byte {
	t.Helper()
	template := filepath.Join(istioModuleDir(t), "tools", "packaging", "common", "envoy_bootstrap.json")
	pc := mesh.DefaultProxyConfig()
	pc.ConfigPath = t.TempDir()
	node, err := bootstrap.GetNodeMetaData(bootstrap.MetadataOptions{
		ID:                         sidecarID,
		Platform:                   &platform.Unknown{},
		InstanceIPs:                []string{"10.0.0.1"},
		ProxyConfig:                pc,
		EnvoyStatusPort:            15021,
		EnvoyPrometheusPort:        15090,
		WorkloadIdentitySocketFile: "socket",
	})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := bootstrap.New(bootstrap.Config{Node: node}).WriteTo(template, &b); err != nil {
		t.Fatalf("rendering Istio's bootstrap template %s: %v", template, err)
	}
	return b.Bytes()
}

// staticClusters returns the static clusters of a bootstrap (JSON) and of the overrides
// merged into it, in order.
func staticClusters(t *testing.T, bootstraps ...[]byte) []staticCluster {
	t.Helper()
	var out []staticCluster
	for _, b := range bootstraps {
		var doc struct {
			StaticResources struct {
				Clusters []staticCluster `json:"clusters"`
			} `json:"static_resources"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("bootstrap: %v", err)
		}
		out = append(out, doc.StaticResources.Clusters...)
	}
	return out
}

// primaryClusters is what Envoy's cluster manager counts as primary: the static clusters
// that are not EDS.
func primaryClusters(static []staticCluster) map[string]bool {
	out := map[string]bool{}
	for _, c := range static {
		if c.Type != "EDS" {
			out[c.Name] = true
		}
	}
	return out
}

// apiConfigSourceProblems applies rule 1 to every api_config_source anywhere in clusters
// (inside Any-typed configs too, such as a TLS transport socket's SDS sources): each problem
// is Envoy's error text, prefixed by the cluster's name. A typed config this binary cannot
// decode is a problem too, so the check never passes by not looking.
func apiConfigSourceProblems(clusters []*clusterv3.Cluster, primary map[string]bool) []string {
	var problems []string
	for _, c := range clusters {
		walkMessages(c.ProtoReflect(), func(m protoreflect.Message) {
			switch v := m.Interface().(type) {
			case *corev3.ApiConfigSource:
				if err := checkBackingCluster(primary, v); err != "" {
					problems = append(problems, c.GetName()+": "+err)
				}
			case *anypb.Any:
				if _, err := v.UnmarshalNew(); err != nil {
					problems = append(problems, fmt.Sprintf("%s: cannot check inside %s: %v", c.GetName(), v.GetTypeUrl(), err))
				}
			}
		})
	}
	return problems
}

// checkBackingCluster is Utility::checkApiConfigSourceSubscriptionBackingCluster with
// validateClusterName: "" when Envoy accepts s, else its error text.
func checkBackingCluster(primary map[string]bool, s *corev3.ApiConfigSource) string {
	switch s.GetApiType() {
	case corev3.ApiConfigSource_AGGREGATED_GRPC, corev3.ApiConfigSource_AGGREGATED_DELTA_GRPC:
		return ""
	}
	var name string
	switch {
	case len(s.GetClusterNames()) > 0:
		name = s.GetClusterNames()[0]
	case s.GetApiType() == corev3.ApiConfigSource_GRPC || s.GetApiType() == corev3.ApiConfigSource_DELTA_GRPC:
		if len(s.GetGrpcServices()) == 0 {
			return "envoy.config.core.v3.ApiConfigSource: API configs must have either a gRPC service or a cluster name defined"
		}
		if s.GetGrpcServices()[0].GetEnvoyGrpc() == nil {
			return "" // google_grpc: no cluster to check
		}
		name = s.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName()
	default:
		return ""
	}
	if primary[name] {
		return ""
	}
	return fmt.Sprintf("envoy.config.core.v3.ApiConfigSource must have a statically defined non-EDS cluster: '%s' does not exist, was added via api, or is an EDS cluster", name)
}

// walkMessages calls visit on m and every message inside it, Any payloads included.
func walkMessages(m protoreflect.Message, visit func(protoreflect.Message)) {
	visit(m)
	if a, ok := m.Interface().(*anypb.Any); ok {
		if inner, err := a.UnmarshalNew(); err == nil {
			walkMessages(inner.ProtoReflect(), visit)
		}
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				walkMessages(v.List().Get(i).Message(), visit)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				walkMessages(mv.Message(), visit)
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			walkMessages(v.Message(), visit)
		}
		return true
	})
}

// edsStream applies rule 2 to one EDS stream: feed it the sidecar's requests and the
// server's responses in order; each response that omits (SOTW) or removes (delta) an
// assignment the sidecar subscribed to and held is a problem.
type edsStream struct {
	subscribed map[string]bool
	held       map[string]bool
}

func newEDSStream() *edsStream {
	return &edsStream{subscribed: map[string]bool{}, held: map[string]bool{}}
}

// sotwRequest records a SOTW request's resource_names (the whole subscription).
func (s *edsStream) sotwRequest(names []string) {
	s.subscribed = map[string]bool{}
	for _, n := range names {
		s.subscribed[n] = true
	}
	for n := range s.held {
		if !s.subscribed[n] {
			delete(s.held, n) // Envoy drops what it unsubscribed from
		}
	}
}

// sotwResponse checks a SOTW response carrying the named assignments.
func (s *edsStream) sotwResponse(names []string) []string {
	var problems []string
	for n := range s.held {
		if s.subscribed[n] && !slices.Contains(names, n) {
			problems = append(problems, fmt.Sprintf("SOTW EDS response omits %s, which the sidecar subscribed to and held: Envoy keeps its stale endpoints", n))
		}
	}
	for _, n := range names {
		if s.subscribed[n] {
			s.held[n] = true
		}
	}
	slices.Sort(problems)
	return problems
}

// deltaResponse checks a delta response carrying the named assignments and removing others.
func (s *edsStream) deltaResponse(names, removed []string) []string {
	var problems []string
	for _, n := range removed {
		if s.held[n] && s.subscribed[n] {
			problems = append(problems, fmt.Sprintf("delta EDS response removes %s, which the sidecar subscribed to and held: Envoy ignores removed_resources for EDS and keeps its stale endpoints", n))
		}
		delete(s.held, n)
	}
	for _, n := range names {
		s.held[n] = true
	}
	return problems
}

// deltaSubscribe records a delta request's subscriptions.
func (s *edsStream) deltaSubscribe(subscribe, unsubscribe []string) {
	for _, n := range subscribe {
		s.subscribed[n] = true
	}
	for _, n := range unsubscribe {
		delete(s.subscribed, n)
		delete(s.held, n)
	}
}

// clustersOf returns the clusters of m by name, sorted.
func clustersOf(m map[string]*clusterv3.Cluster) []*clusterv3.Cluster {
	out := make([]*clusterv3.Cluster, 0, len(m))
	for _, c := range m {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *clusterv3.Cluster) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}
