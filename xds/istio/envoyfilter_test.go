package istio

import (
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
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
	tests := []struct {
		name string
		cfg  Config
	}{
		{"envoyfilters.yaml", testConfig},
		{"envoyfilters-bootstrap.yaml", Config{Namespace: "mesh-root", XDSAddress: "10.96.0.20:18000", BootstrapCluster: true}},
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
}

func TestEnvoyFiltersShape(t *testing.T) {
	filters := EnvoyFilters(testConfig, bookinfo())
	var names []string
	for _, f := range filters {
		names = append(names, f.Name)
		if f.Namespace != DefaultNamespace || f.Labels[ManagedByLabel] != ManagedByValue {
			t.Errorf("%s: namespace %q labels %v", f.Name, f.Namespace, f.Labels)
		}
		if f.Spec.WorkloadSelector != nil || len(f.Spec.TargetRefs) > 0 {
			t.Errorf("%s: selects workloads; it must apply to every sidecar", f.Name)
		}
	}
	wantNames := []string{"edgeflow-eds.ratings.shop", "edgeflow-eds.reviews.default", "edgeflow-xds"}
	if diff := cmp.Diff(wantNames, names); diff != "" {
		t.Fatalf("filter names (-want +got):\n%s", diff)
	}

	// The ADD is a valid Envoy cluster, as Istio decodes it (strict protojson).
	add := filters[2].Spec.ConfigPatches[0]
	if add.Patch.Operation != networking.EnvoyFilter_Patch_ADD || add.Match.Context != networking.EnvoyFilter_SIDECAR_OUTBOUND {
		t.Fatalf("edgeflow-xds patch: %v", add)
	}
	added := decodeCluster(t, add)
	if err := added.Validate(); err != nil {
		t.Errorf("edgeflow-xds cluster does not validate: %v", err)
	}
	if diff := cmp.Diff(XDSCluster(testConfig), added, protocmp.Transform()); diff != "" {
		t.Errorf("edgeflow-xds cluster after the EnvoyFilter round trip (-want +got):\n%s", diff)
	}
	if added.GetType() != clusterv3.Cluster_STRICT_DNS {
		t.Errorf("cluster type %v for a DNS name, want STRICT_DNS", added.GetType())
	}

	// ratings.shop: one MERGE per port, sorted, matched by exact cluster name.
	var merged []string
	for _, p := range filters[0].Spec.ConfigPatches {
		name := p.Match.GetCluster().GetName()
		merged = append(merged, name)
		if p.Patch.Operation != networking.EnvoyFilter_Patch_MERGE || p.Match.Context != networking.EnvoyFilter_SIDECAR_OUTBOUND {
			t.Errorf("%s: patch %v", name, p)
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
	if got := len(filters[1].Spec.ConfigPatches); got != 1 {
		t.Errorf("reviews: %d patches for one distinct port, want 1", got)
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
	t.Run("no services", func(t *testing.T) {
		got := EnvoyFilters(testConfig, nil)
		if len(got) != 1 || got[0].Name != XDSClusterName {
			t.Errorf("got %d filters, want only the edgeflow-xds one", len(got))
		}
		if got := EnvoyFilters(Config{XDSAddress: "1.2.3.4:1", BootstrapCluster: true}, nil); len(got) != 0 {
			t.Errorf("bootstrap cluster, no services: got %d filters, want 0", len(got))
		}
	})
	t.Run("duplicate service", func(t *testing.T) {
		s := []optimizer.Service{
			{Name: "a", Namespace: "default", Ports: []optimizer.Port{{Port: 1}}},
			{Name: "a", Ports: []optimizer.Port{{Port: 2}}},
		}
		got := EnvoyFilters(Config{XDSAddress: "1.2.3.4:1", BootstrapCluster: true}, s)
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
