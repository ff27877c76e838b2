package istio

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/edgeflow/edgeflow/optimizer"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// bookinfo is a managed set: reviews (one port, listed twice), ratings in another namespace
// with two ports, and details without ports (no filter).
func bookinfo() []optimizer.Service {
	return []optimizer.Service{
		{Name: "reviews", Ports: []optimizer.Port{{Name: "http", Port: 9080}, {Name: "http-again", Port: 9080}}},
		{Name: "ratings", Namespace: "shop", Ports: []optimizer.Port{{Port: 9443}, {Port: 9080, TargetPort: 8080}}},
		{Name: "details"},
	}
}

var testConfig = Config{XDSAddress: "edgeflow.edgeflow.svc.cluster.local:18000"}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs (-want +got; go test -update rewrites it):\n%s", path, diff)
	}
}

func TestEnvoyFiltersGolden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
	}{
		{"envoyfilters.yaml", testConfig},
		{"envoyfilters-domain.yaml", Config{Namespace: "mesh-root", XDSAddress: "10.96.0.20:18000", ClusterDomain: "edge.example"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := MarshalYAML(EnvoyFilters(tt.cfg, bookinfo()))
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tt.name, got)
		})
	}
	t.Run("bootstrap-override.json", func(t *testing.T) {
		got, err := BootstrapOverride(Config{XDSAddress: "10.96.0.20:18000", ConnectTimeout: 2500e6})
		if err != nil {
			t.Fatal(err)
		}
		golden(t, "bootstrap-override.json", got)
	})
	t.Run("bootstrap-override-tls.json", func(t *testing.T) {
		got, err := BootstrapOverride(Config{XDSAddress: "edgeflow.edgeflow.svc.cluster.local:18000", TLS: true,
			TLSServerSANs: []string{"spiffe://cluster.local/ns/edgeflow/sa/edgeflow"}})
		if err != nil {
			t.Fatal(err)
		}
		golden(t, "bootstrap-override-tls.json", got)
	})
}

func TestEnvoyFiltersShape(t *testing.T) {
	t.Parallel()
	filters := EnvoyFilters(testConfig, bookinfo())
	var names []string
	for _, f := range filters {
		names = append(names, f.Name)
		if f.Namespace != DefaultNamespace || f.Labels[ManagedByLabel] != ManagedByValue {
			t.Errorf("%s: namespace %q labels %v", f.Name, f.Namespace, f.Labels)
		}
		// Only sidecars that have the bootstrap cluster (the pods labelled to use it) get the
		// patches: any other sidecar would reject a cluster naming edgeflow-xds.
		if diff := cmp.Diff(map[string]string{EDSLabel: EDSLabelValue}, f.Spec.GetWorkloadSelector().GetLabels()); diff != "" {
			t.Errorf("%s: workload selector (-want +got):\n%s", f.Name, diff)
		}
		for _, p := range f.Spec.ConfigPatches {
			if p.Patch.Operation != networking.EnvoyFilter_Patch_MERGE {
				t.Errorf("%s: %v patch; only MERGEs (the edgeflow-xds cluster is never ADDed over CDS)", f.Name, p.Patch.Operation)
			}
		}
	}
	wantNames := []string{"edgeflow-eds.default", "edgeflow-eds.shop"}
	if diff := cmp.Diff(wantNames, names); diff != "" {
		t.Fatalf("filter names (-want +got):\n%s", diff)
	}

	// shop (ratings): one MERGE per port, sorted, matched by exact cluster name.
	var merged []string
	for _, p := range filters[1].Spec.ConfigPatches {
		name := p.Match.GetCluster().GetName()
		merged = append(merged, name)
		if p.Patch.Operation != networking.EnvoyFilter_Patch_MERGE || p.Match.Context != networking.EnvoyFilter_SIDECAR_OUTBOUND {
			t.Errorf("%s: patch %v", name, p)
		}
		if p.Match.GetCluster().GetSubset() != "" || p.Match.GetCluster().GetService() != "" {
			t.Errorf("%s: matched by more than the exact name: %v", name, p.Match.GetCluster())
		}
		want := edsPatch(name)
		if diff := cmp.Diff(want, decodeCluster(t, p), protocmp.Transform()); diff != "" {
			t.Errorf("%s: merge value (-want +got):\n%s", name, diff)
		}
	}
	wantMerged := []string{"outbound|9080||ratings.shop.svc.cluster.local", "outbound|9443||ratings.shop.svc.cluster.local"}
	if diff := cmp.Diff(wantMerged, merged); diff != "" {
		t.Errorf("merged clusters (-want +got):\n%s", diff)
	}
	if got := len(filters[0].Spec.ConfigPatches); got != 1 {
		t.Errorf("reviews: %d patches for one distinct port, want 1", got)
	}

	// The cluster domain names the clusters.
	for _, f := range EnvoyFilters(Config{XDSAddress: "1.2.3.4:1", ClusterDomain: "edge.example"}, bookinfo()) {
		for _, p := range f.Spec.ConfigPatches {
			if name := p.Match.GetCluster().GetName(); !strings.HasSuffix(name, ".svc.edge.example") {
				t.Errorf("cluster %s with ClusterDomain edge.example", name)
			}
		}
	}
}

// TestXDSCluster: the bootstrap's edgeflow-xds cluster is a valid Envoy cluster; with TLS it
// presents the sidecar's workload certificate and checks edgeflow's against the mesh root,
// both from istio-agent's SDS cluster, exactly as Istio's bootstrap names them.
func TestXDSCluster(t *testing.T) {
	t.Parallel()
	plain := XDSCluster(testConfig)
	if err := plain.ValidateAll(); err != nil {
		t.Errorf("edgeflow-xds cluster does not validate: %v", err)
	}
	if plain.GetType() != clusterv3.Cluster_STRICT_DNS || plain.TransportSocket != nil {
		t.Errorf("plain cluster: type %v, transport socket %v; want STRICT_DNS and none", plain.GetType(), plain.TransportSocket)
	}
	c := XDSCluster(Config{XDSAddress: testConfig.XDSAddress, TLS: true, TLSServerSANs: []string{"spiffe://cluster.local/ns/edgeflow/sa/edgeflow"}})
	if err := c.ValidateAll(); err != nil {
		t.Errorf("TLS edgeflow-xds cluster does not validate: %v", err)
	}
	ts := c.GetTransportSocket()
	if ts.GetName() != "envoy.transport_sockets.tls" {
		t.Fatalf("transport socket %q, want envoy.transport_sockets.tls", ts.GetName())
	}
	tc := &tlsv3.UpstreamTlsContext{}
	if err := ts.GetTypedConfig().UnmarshalTo(tc); err != nil {
		t.Fatal(err)
	}
	if err := tc.ValidateAll(); err != nil {
		t.Errorf("UpstreamTlsContext does not validate: %v", err)
	}
	if tc.GetSni() != "edgeflow.edgeflow.svc.cluster.local" {
		t.Errorf("SNI %q, want the address's host", tc.GetSni())
	}
	certs := tc.GetCommonTlsContext().GetTlsCertificateSdsSecretConfigs()
	root := tc.GetCommonTlsContext().GetCombinedValidationContext().GetValidationContextSdsSecretConfig()
	if len(certs) != 1 || certs[0].GetName() != "default" || root.GetName() != "ROOTCA" {
		t.Fatalf("SDS secrets %v / %v, want default and ROOTCA", certs, root)
	}
	for _, sds := range []*tlsv3.SdsSecretConfig{certs[0], root} {
		src := sds.GetSdsConfig().GetApiConfigSource()
		if src.GetApiType() != corev3.ApiConfigSource_GRPC || len(src.GetGrpcServices()) != 1 ||
			src.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName() != "sds-grpc" {
			t.Errorf("secret %s: SDS source %v, want gRPC to the bootstrap's sds-grpc", sds.GetName(), src)
		}
	}
	sans := tc.GetCommonTlsContext().GetCombinedValidationContext().GetDefaultValidationContext().GetMatchTypedSubjectAltNames()
	if len(sans) != 1 || sans[0].GetSanType() != tlsv3.SubjectAltNameMatcher_URI || sans[0].GetMatcher().GetExact() != "spiffe://cluster.local/ns/edgeflow/sa/edgeflow" {
		t.Errorf("SAN match %v", sans)
	}
	if ip := XDSCluster(Config{XDSAddress: "10.0.0.1:1", TLS: true, TLSAnyServer: true}); ip.GetTransportSocket() == nil {
		t.Error("no transport socket for an IP address with TLS")
	} else {
		tc := &tlsv3.UpstreamTlsContext{}
		if err := ip.GetTransportSocket().GetTypedConfig().UnmarshalTo(tc); err != nil || tc.GetSni() != "" {
			t.Errorf("IP address: SNI %q (err %v), want none", tc.GetSni(), err)
		}
		// TLSAnyServer: the mesh root alone decides, as asked.
		if sans := tc.GetCommonTlsContext().GetCombinedValidationContext().GetDefaultValidationContext().GetMatchTypedSubjectAltNames(); len(sans) != 0 {
			t.Errorf("TLSAnyServer: SAN match %v, want none", sans)
		}
	}
}

// TestBootstrapConfigMaps: one ConfigMap per namespace of a managed service, owned, holding
// the bootstrap override under the key Istio's injector mounts.
func TestBootstrapConfigMaps(t *testing.T) {
	t.Parallel()
	cms := BootstrapConfigMaps(testConfig, bookinfo())
	var namespaces []string
	want, err := BootstrapOverride(testConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms {
		namespaces = append(namespaces, cm.Namespace)
		if cm.Name != BootstrapConfigMapName || cm.Labels[ManagedByLabel] != ManagedByValue {
			t.Errorf("%s/%s: labels %v", cm.Namespace, cm.Name, cm.Labels)
		}
		if diff := cmp.Diff(map[string]string{"custom_bootstrap.json": string(want)}, cm.Data); diff != "" {
			t.Errorf("%s: data (-want +got):\n%s", cm.Namespace, diff)
		}
	}
	if diff := cmp.Diff([]string{"default", "shop"}, namespaces); diff != "" {
		t.Errorf("namespaces (-want +got):\n%s", diff)
	}
	if got := BootstrapConfigMaps(testConfig, nil); len(got) != 0 {
		t.Errorf("%d ConfigMaps for no services", len(got))
	}
	// The override is an Envoy bootstrap (strict protojson), with edgeflow-xds static.
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(want, b); err != nil {
		t.Fatal(err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Error(err)
	}
	if cs := b.GetStaticResources().GetClusters(); len(cs) != 1 || cs[0].GetName() != XDSClusterName || cs[0].GetType() == clusterv3.Cluster_EDS {
		t.Errorf("static clusters %v, want the non-EDS edgeflow-xds", cs)
	}
	patch := string(PodTemplatePatch())
	for _, want := range []string{"sidecar.istio.io/bootstrapOverride: edgeflow-bootstrap", `edgeflow.io/eds: "true"`} {
		if !strings.Contains(patch, want) {
			t.Errorf("pod template patch lacks %q:\n%s", want, patch)
		}
	}
}

func decodeCluster(t *testing.T, p *networking.EnvoyFilter_EnvoyConfigObjectPatch) *clusterv3.Cluster {
	t.Helper()
	b, err := protojson.Marshal(p.Patch.Value)
	if err != nil {
		t.Fatal(err)
	}
	c := &clusterv3.Cluster{}
	if err := protojson.Unmarshal(b, c); err != nil {
		t.Fatalf("patch value is not an Envoy cluster: %v", err)
	}
	return c
}

func TestEnvoyFiltersDeterministic(t *testing.T) {
	t.Parallel()
	want, err := MarshalYAML(EnvoyFilters(testConfig, bookinfo()))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		services := bookinfo()
		rng.Shuffle(len(services), func(i, j int) { services[i], services[j] = services[j], services[i] })
		for i := range services {
			ports := slices.Clone(services[i].Ports)
			rng.Shuffle(len(ports), func(i, j int) { ports[i], ports[j] = ports[j], ports[i] })
			services[i].Ports = ports
		}
		got, err := MarshalYAML(EnvoyFilters(testConfig, services))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(want), string(got)); diff != "" {
			t.Fatalf("output depends on input order (-want +got):\n%s", diff)
		}
	}
}

func TestEnvoyFiltersEdgeCases(t *testing.T) {
	t.Parallel()
	t.Run("no services", func(t *testing.T) {
		if got := EnvoyFilters(testConfig, nil); len(got) != 0 {
			t.Errorf("no services: got %d filters, want 0", len(got))
		}
	})
	t.Run("duplicate service", func(t *testing.T) {
		s := []optimizer.Service{
			{Name: "a", Namespace: "default", Ports: []optimizer.Port{{Port: 1}}},
			{Name: "a", Ports: []optimizer.Port{{Port: 2}}},
		}
		got := EnvoyFilters(Config{XDSAddress: "1.2.3.4:1"}, s)
		if len(got) != 1 {
			t.Errorf("got %d filters for one service named twice, want 1", len(got))
		}
	})
	t.Run("ip address", func(t *testing.T) {
		c := XDSCluster(Config{XDSAddress: "[fd00::1]:18000"})
		if c.GetType() != clusterv3.Cluster_STATIC {
			t.Errorf("type %v for an IP, want STATIC", c.GetType())
		}
		if err := c.Validate(); err != nil {
			t.Error(err)
		}
	})
	t.Run("invalid config panics", func(t *testing.T) {
		defer func() {
			if r := recover(); r == nil {
				t.Error("no panic for an invalid config")
			}
		}()
		EnvoyFilters(Config{}, nil)
	})
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg Config
		ok  bool
	}{
		{Config{XDSAddress: "edgeflow:18000"}, true},
		{Config{XDSAddress: "10.0.0.1:1"}, true},
		{Config{XDSAddress: "[::1]:65535"}, true},
		{Config{}, false},
		{Config{XDSAddress: "edgeflow"}, false},
		{Config{XDSAddress: ":18000"}, false},
		{Config{XDSAddress: "edgeflow:0"}, false},
		{Config{XDSAddress: "edgeflow:65536"}, false},
		{Config{XDSAddress: "edgeflow:http"}, false},
		{Config{XDSAddress: "edgeflow:1", ConnectTimeout: -1}, false},
		{Config{XDSAddress: "edgeflow:1", ClusterDomain: "edge.example"}, true},
		{Config{XDSAddress: "edgeflow:1", ClusterDomain: "Not A Domain"}, false},
		{Config{XDSAddress: "edgeflow:1", TLS: true, TLSServerName: "x", TLSServerSANs: []string{"y"}}, true},
		{Config{XDSAddress: "edgeflow:1", TLSServerName: "x"}, false},
		{Config{XDSAddress: "edgeflow:1", TLSServerSANs: []string{"y"}}, false},
		// TLS names edgeflow's identity, or says explicitly that any mesh certificate will do.
		{Config{XDSAddress: "edgeflow:1", TLS: true}, false},
		{Config{XDSAddress: "edgeflow:1", TLS: true, TLSServerName: "x"}, false},
		{Config{XDSAddress: "edgeflow:1", TLS: true, TLSAnyServer: true}, true},
		{Config{XDSAddress: "edgeflow:1", TLS: true, TLSAnyServer: true, TLSServerSANs: []string{"y"}}, false},
		{Config{XDSAddress: "edgeflow:1", TLSAnyServer: true}, false},
		{Config{XDSAddress: "edgeflow:1", TLS: true, TLSServerSANs: []string{""}}, false},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if (err == nil) != tt.ok {
			t.Errorf("%+v: Validate() = %v, want ok=%v", tt.cfg, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v does not wrap ErrInvalidConfig", tt.cfg, err)
		}
		if _, berr := BootstrapOverride(tt.cfg); (berr == nil) != tt.ok {
			t.Errorf("%+v: BootstrapOverride error %v, want ok=%v", tt.cfg, berr, tt.ok)
		}
	}
}

// TestOneFilterPerNamespace: however many Services a tenant labels in a namespace, edgeflow
// writes one EnvoyFilter for that namespace, carrying every one of its services' ports (by
// service name, then port; a service repeated by name once), annotated with the namespace.
// Before, each service got a filter of its own in the filters' namespace.
func TestOneFilterPerNamespace(t *testing.T) {
	t.Parallel()
	var services []optimizer.Service
	for i := range 50 {
		ns := []string{"tenant", "shop"}[i%2]
		services = append(services, optimizer.Service{Name: fmt.Sprintf("svc-%02d", i), Namespace: ns, Ports: []optimizer.Port{{Port: 80}, {Port: 8080}}})
	}
	services = append(services, optimizer.Service{Name: "svc-00", Namespace: "tenant", Ports: []optimizer.Port{{Port: 9}}}, optimizer.Service{Name: "no-ports", Namespace: "empty"})
	filters := EnvoyFilters(testConfig, services)
	var names []string
	for _, f := range filters {
		names = append(names, f.Name)
		ns := strings.TrimPrefix(f.Name, "edgeflow-eds.")
		if f.Annotations[FilterNamespaceAnnotation] != ns || !ownedFilter(testConfig, f) {
			t.Errorf("%s: annotations %v, owned %v", f.Name, f.Annotations, ownedFilter(testConfig, f))
		}
		if got := len(f.Spec.ConfigPatches); got != 50 {
			t.Errorf("%s: %d patches, want 50 (25 services × 2 ports)", f.Name, got)
		}
		var clusters []string
		for _, p := range f.Spec.ConfigPatches {
			clusters = append(clusters, p.Match.GetCluster().GetName())
		}
		if first := "outbound|80||svc-0" + map[string]string{"shop": "1", "tenant": "0"}[ns] + "." + ns + ".svc.cluster.local"; clusters[0] != first {
			t.Errorf("%s: clusters start %v, want %s first", f.Name, clusters[:2], first)
		}
	}
	if want := []string{"edgeflow-eds.shop", "edgeflow-eds.tenant"}; !slices.Equal(names, want) {
		t.Errorf("filters %v, want %v: one per namespace with ports", names, want)
	}
}
