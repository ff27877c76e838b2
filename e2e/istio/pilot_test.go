// Package istio checks edgeflow's per-pod Istio mode against Istio's own control plane:
// istiod's pilot runs in-process (istio.io/istio/pilot/test/xds), takes the EnvoyFilters as the
// YAML a person would apply, and a sidecar asks it for its clusters over a real ADS stream;
// what pilot sends is then checked against Envoy's rules that pilot does not check
// (envoyrules_test.go), with the bootstrap pilot-agent renders from Istio's own template plus
// edgeflow's bootstrap override. It is a module of its own because Istio is a large
// dependency (a cold build of the test takes ~10 min on 2 cores): run it with
// `cd e2e/istio && go test -count=1 ./...`.
package istio

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"
	clientnetworking "istio.io/client-go/pkg/apis/networking/v1alpha3"
	istiofake "istio.io/client-go/pkg/clientset/versioned/fake"
	"istio.io/istio/pilot/pkg/model"
	"istio.io/istio/pilot/pkg/xds"
	v3 "istio.io/istio/pilot/pkg/xds/v3"
	xdsfake "istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/config"
	"istio.io/istio/pkg/config/schema/gvk"
	"istio.io/istio/pkg/config/validation/envoyfilter"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/edgeflow/edgeflow/optimizer"
	efistio "github.com/edgeflow/edgeflow/xds/istio"
)

const (
	// sidecarID is productpage-0's sidecar, as istio-agent names it: sidecar~IP~POD.NS~NS.svc.cluster.local.
	// The pod carries edgeflow's label (EDSLabel); productpage-1 (plainSidecarID) does not.
	sidecarID      = "sidecar~10.0.0.1~productpage-0.default~default.svc.cluster.local"
	plainSidecarID = "sidecar~10.0.0.4~productpage-1.default~default.svc.cluster.local"

	reviewsCluster = "outbound|9080||reviews.default.svc.cluster.local"
	ratingsCluster = "outbound|9080||ratings.default.svc.cluster.local"
)

// kubeObjects is Bookinfo's corner: productpage calls reviews (managed by edgeflow) and ratings
// (not managed). Each service has a ready pod and an EndpointSlice, as the kubelet and the
// EndpointSlice controller would leave them. productpage-0 opted in to edgeflow's EDS (the label
// pilot matches the EnvoyFilters' workloadSelector against: it takes a proxy's labels from its
// pod); productpage-1 did not.
var kubeObjects = strings.Replace(service("productpage", "10.0.0.1", "10.96.0.1"), "    app: productpage\nspec:\n  containers",
	"    app: productpage\n    "+efistio.EDSLabel+": \""+efistio.EDSLabelValue+"\"\nspec:\n  containers", 1) + `---
apiVersion: v1
kind: Pod
metadata:
  name: productpage-1
  namespace: default
  labels:
    app: productpage
spec:
  containers:
  - name: productpage
    image: productpage
status:
  phase: Running
  conditions:
  - status: "True"
    type: Ready
  podIP: 10.0.0.4
  podIPs:
  - ip: 10.0.0.4
` + "---\n" + service("reviews", "10.0.0.2", "10.96.0.2") +
	"---\n" + service("ratings", "10.0.0.3", "10.96.0.3")

func service(name, podIP, clusterIP string) string {
	return strings.NewReplacer("NAME", name, "PODIP", podIP, "CLUSTERIP", clusterIP).Replace(`apiVersion: v1
kind: Service
metadata:
  name: NAME
  namespace: default
  labels:
    app: NAME
spec:
  clusterIP: CLUSTERIP
  selector:
    app: NAME
  ports:
  - name: http
    port: 9080
    targetPort: 9080
---
apiVersion: v1
kind: Pod
metadata:
  name: NAME-0
  namespace: default
  labels:
    app: NAME
spec:
  containers:
  - name: NAME
    image: NAME
status:
  phase: Running
  conditions:
  - status: "True"
    type: Ready
  podIP: PODIP
  podIPs:
  - ip: PODIP
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: NAME-abcde
  namespace: default
  labels:
    kubernetes.io/service-name: NAME
addressType: IPv4
endpoints:
- addresses:
  - PODIP
  conditions:
    ready: true
  targetRef:
    kind: Pod
    name: NAME-0
    namespace: default
ports:
- name: http
  port: 9080
  protocol: TCP
`)
}

// managed is what edgeflow's watcher reports for the cluster above: only reviews carries
// edgeflow.io/managed=true.
var managed = []optimizer.Service{{
	Name:  "reviews",
	Ports: []optimizer.Port{{Name: "http", Port: 9080}},
	Pods:  []optimizer.Pod{{Name: "reviews-0", IP: "10.0.0.2"}},
}}

// connectSidecar opens an ADS stream to pilot as productpage-0's sidecar would, asking for
// clusters; opted says the pod carries edgeflow's label (EDSLabel: it has the bootstrap
// override and takes EDS from edgeflow).
func connectSidecar(s *xdsfake.FakeDiscoveryServer, opted bool) *xds.AdsTest {
	labels, id := map[string]string{"app": "productpage"}, plainSidecarID
	if opted {
		labels[efistio.EDSLabel] = efistio.EDSLabelValue
		id = sidecarID
	}
	return s.ConnectADS().WithType(v3.ClusterType).WithID(id).WithTimeout(10 * time.Second).
		WithMetadata(model.NodeMetadata{
			Namespace:    "default",
			Labels:       labels,
			WorkloadName: "productpage",
			ClusterID:    "Kubernetes",
			IstioVersion: "1.31.0",
		})
}

// sidecarClusters connects to pilot as productpage-0's sidecar and returns the clusters of its
// CDS response, which it ACKs, by name.
func sidecarClusters(t *testing.T, s *xdsfake.FakeDiscoveryServer, opted bool) map[string]*clusterv3.Cluster {
	t.Helper()
	return decodeClusters(t, connectSidecar(s, opted).RequestResponseAck(t, nil))
}

func decodeClusters(t *testing.T, resp *discovery.DiscoveryResponse) map[string]*clusterv3.Cluster {
	t.Helper()
	out := make(map[string]*clusterv3.Cluster, len(resp.Resources))
	for _, r := range resp.Resources {
		c := &clusterv3.Cluster{}
		if err := r.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		out[c.Name] = c
	}
	return out
}

// edsFromEdgeflow says whether c takes its endpoints from edgeflow (and weighs localities).
func edsFromEdgeflow(c *clusterv3.Cluster) bool {
	return proto.Equal(c.GetEdsClusterConfig().GetEdsConfig(), efistio.EDSConfig()) &&
		c.GetCommonLbConfig().GetLocalityWeightedLbConfig() != nil
}

// edsFromIstiod says whether c is istiod's own: EDS over ADS, no locality weighting.
func edsFromIstiod(c *clusterv3.Cluster) bool {
	return c.GetEdsClusterConfig().GetEdsConfig().GetAds() != nil &&
		c.GetCommonLbConfig().GetLocalityWeightedLbConfig() == nil
}

// asConfig is f as pilot's config store holds it.
func asConfig(f *clientnetworking.EnvoyFilter) config.Config {
	return config.Config{
		Meta: config.Meta{
			GroupVersionKind: gvk.EnvoyFilter,
			Name:             f.Name,
			Namespace:        f.Namespace,
			Labels:           f.Labels,
		},
		Spec: &f.Spec,
	}
}

func TestIstioValidatesTheFilters(t *testing.T) {
	t.Parallel()
	for _, cfg := range []efistio.Config{
		{XDSAddress: "edgeflow.edgeflow.svc.cluster.local:18000"},
		{XDSAddress: "10.96.0.100:18000", ClusterDomain: "edge.example", TLS: true, TLSAnyServer: true},
	} {
		for _, f := range efistio.EnvoyFilters(cfg, managed) {
			// What istiod's validating webhook and istioctl validate run on an EnvoyFilter.
			warnings, err := envoyfilter.ValidateEnvoyFilter(asConfig(f))
			if err != nil {
				t.Errorf("EnvoyFilter %s rejected by Istio's validation: %v", f.Name, err)
			}
			if warnings != nil {
				t.Logf("EnvoyFilter %s: Istio's validation warns: %v", f.Name, warnings)
			}
		}
	}
}

// TestSidecarTakesManagedEDSFromEdgeflow: with the per-pod filters in pilot, a sidecar of a
// pod labelled edgeflow.io/eds=true takes the managed service's endpoints from edgeflow (and
// nothing else changes), one without the label keeps istiod's; for both, pilot's clusters
// with the bootstrap that sidecar has (Istio's, plus edgeflow's override for the labelled one)
// pass Envoy's config-source rule.
func TestSidecarTakesManagedEDSFromEdgeflow(t *testing.T) {
	t.Parallel()
	istioBootstrap := istioBootstrapJSON(t)
	for _, cfg := range []efistio.Config{
		{XDSAddress: "edgeflow.edgeflow.svc.cluster.local:18000"},
		{XDSAddress: "10.96.0.100:18000", TLS: true, TLSServerSANs: []string{"spiffe://cluster.local/ns/edgeflow/sa/edgeflow"}},
	} {
		name := "plaintext"
		if cfg.TLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			generated := efistio.EnvoyFilters(cfg, managed)
			filters, err := efistio.MarshalYAML(generated)
			if err != nil {
				t.Fatal(err)
			}
			override, err := efistio.BootstrapOverride(cfg)
			if err != nil {
				t.Fatal(err)
			}
			s := xdsfake.NewFakeDiscoveryServer(t, xdsfake.FakeOptions{
				KubernetesObjectString: kubeObjects,
				ConfigString:           string(filters),
			})
			if got := len(s.Store().List(gvk.EnvoyFilter, efistio.DefaultNamespace)); got != len(generated) {
				t.Fatalf("pilot holds %d EnvoyFilters, want %d, from:\n%s", got, len(generated), filters)
			}

			t.Run("labelled sidecar", func(t *testing.T) {
				clusters := sidecarClusters(t, s, true)
				if _, ok := clusters[efistio.XDSClusterName]; ok {
					t.Error("pilot sends an edgeflow-xds cluster over CDS; it must come from the bootstrap only")
				}
				checkManaged(t, clusters)
				static := staticClusters(t, istioBootstrap, override)
				if problems := apiConfigSourceProblems(clustersOf(clusters), primaryClusters(static)); len(problems) > 0 {
					t.Errorf("a sidecar with Istio's bootstrap and edgeflow's override would reject pilot's clusters:\n%s", strings.Join(problems, "\n"))
				}
				// The override is what makes them acceptable: without it, the same clusters fail.
				without := apiConfigSourceProblems(clustersOf(clusters), primaryClusters(staticClusters(t, istioBootstrap)))
				if len(without) != 1 || !strings.Contains(without[0], "'edgeflow-xds' does not exist") {
					t.Errorf("without the bootstrap override: problems %v, want one naming edgeflow-xds", without)
				}
				// The bootstrap cluster's own SDS sources (with TLS) name sds-grpc, a static
				// cluster of Istio's bootstrap.
				if !slices.ContainsFunc(static, func(c staticCluster) bool { return c.Name == "sds-grpc" }) {
					t.Errorf("Istio's rendered bootstrap has no sds-grpc cluster: %v", static)
				}
				t.Logf("static clusters of the sidecar's bootstrap: %v", static)
				overrideClusters := decodeBootstrapClusters(t, override)
				if problems := apiConfigSourceProblems(overrideClusters, primaryClusters(static)); len(problems) > 0 {
					t.Errorf("the bootstrap override's own config sources break Envoy's rule:\n%s", strings.Join(problems, "\n"))
				}
			})
			t.Run("unlabelled sidecar", func(t *testing.T) {
				clusters := sidecarClusters(t, s, false)
				for _, name := range []string{reviewsCluster, ratingsCluster} {
					if c := clusters[name]; c == nil || !edsFromIstiod(c) {
						t.Errorf("%s of a sidecar without edgeflow's label does not take EDS from istiod: %v", name, c.GetEdsClusterConfig())
					}
				}
				if problems := apiConfigSourceProblems(clustersOf(clusters), primaryClusters(staticClusters(t, istioBootstrap))); len(problems) > 0 {
					t.Errorf("a sidecar with Istio's bootstrap would reject pilot's clusters:\n%s", strings.Join(problems, "\n"))
				}
			})
		})
	}
}

// decodeBootstrapClusters is the static clusters of a bootstrap override, decoded strictly.
func decodeBootstrapClusters(t *testing.T, override []byte) []*clusterv3.Cluster {
	t.Helper()
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(override, b); err != nil {
		t.Fatal(err)
	}
	return b.GetStaticResources().GetClusters()
}

// checkManaged checks a labelled sidecar's clusters: reviews from edgeflow, ratings istiod's,
// and reviews otherwise built exactly like ratings.
func checkManaged(t *testing.T, clusters map[string]*clusterv3.Cluster) {
	t.Helper()
	// reviews: EDS from edgeflow, not from istiod's ADS, with locality weights.
	reviews := clusters[reviewsCluster]
	if reviews == nil {
		t.Fatalf("no %s among %d clusters", reviewsCluster, len(clusters))
	}
	t.Logf("%s from pilot:\n%s", reviewsCluster, protojson.Format(reviews))
	if reviews.GetType() != clusterv3.Cluster_EDS {
		t.Errorf("%s: type %v, want EDS", reviewsCluster, reviews.GetType())
	}
	eds := reviews.GetEdsClusterConfig()
	if eds.GetServiceName() != reviewsCluster {
		t.Errorf("%s: EDS service_name %q, want the cluster's name", reviewsCluster, eds.GetServiceName())
	}
	if diff := cmp.Diff(efistio.EDSConfig(), eds.GetEdsConfig(), protocmp.Transform()); diff != "" {
		t.Errorf("%s: eds_config (-edgeflow's +pilot's):\n%s", reviewsCluster, diff)
	}
	if reviews.GetCommonLbConfig().GetLocalityWeightedLbConfig() == nil {
		t.Errorf("%s: no common_lb_config.locality_weighted_lb_config", reviewsCluster)
	}
	if err := reviews.Validate(); err != nil {
		t.Errorf("%s does not validate: %v", reviewsCluster, err)
	}

	// ratings is not managed: istiod's cluster, untouched.
	ratings := clusters[ratingsCluster]
	if ratings == nil {
		t.Fatalf("no %s among %d clusters", ratingsCluster, len(clusters))
	}
	if !edsFromIstiod(ratings) {
		t.Errorf("%s: EDS not from istiod: %v", ratingsCluster, ratings.GetEdsClusterConfig())
	}
	// Apart from EDS source and locality weighting, reviews is built like ratings: the filter
	// changed nothing else (mTLS transport sockets, circuit breakers, …).
	if diff := cmp.Diff(normalised(ratings, "ratings"), normalised(reviews, "reviews"), protocmp.Transform()); diff != "" {
		t.Errorf("reviews differs from ratings beyond EDS and locality weighting (-ratings +reviews):\n%s", diff)
	}
}

// TestEnvoyRulesRejectTheOldDefault keeps the config-source check from becoming vacuous: the
// old default mode — an EnvoyFilter ADDing the edgeflow-xds cluster over CDS, the EDS patches
// for every sidecar, no bootstrap override — must fail it, with Envoy's error naming
// edgeflow-xds for the managed cluster, while istiod's own clusters pass.
func TestEnvoyRulesRejectTheOldDefault(t *testing.T) {
	t.Parallel()
	cfg := efistio.Config{XDSAddress: "edgeflow.edgeflow.svc.cluster.local:18000"}
	old := efistio.EnvoyFilters(cfg, managed)
	for _, f := range old {
		f.Spec.WorkloadSelector = nil // the old filters applied to every sidecar
	}
	add := efistio.EnvoyFilters(cfg, managed)[0].DeepCopy()
	add.Name = "edgeflow-xds"
	add.Spec.WorkloadSelector = nil
	add.Spec.ConfigPatches = []*networking.EnvoyFilter_EnvoyConfigObjectPatch{{
		ApplyTo: networking.EnvoyFilter_CLUSTER,
		Match:   &networking.EnvoyFilter_EnvoyConfigObjectMatch{Context: networking.EnvoyFilter_SIDECAR_OUTBOUND},
		Patch:   &networking.EnvoyFilter_Patch{Operation: networking.EnvoyFilter_Patch_ADD, Value: asStruct(t, efistio.XDSCluster(cfg))},
	}}
	filters, err := efistio.MarshalYAML(append(old, add))
	if err != nil {
		t.Fatal(err)
	}
	s := xdsfake.NewFakeDiscoveryServer(t, xdsfake.FakeOptions{KubernetesObjectString: kubeObjects, ConfigString: string(filters)})
	clusters := sidecarClusters(t, s, false)
	if _, ok := clusters[efistio.XDSClusterName]; !ok {
		t.Fatal("the old default's edgeflow-xds cluster did not reach the sidecar over CDS")
	}
	problems := apiConfigSourceProblems(clustersOf(clusters), primaryClusters(staticClusters(t, istioBootstrapJSON(t))))
	want := reviewsCluster + ": envoy.config.core.v3.ApiConfigSource must have a statically defined non-EDS cluster: 'edgeflow-xds' does not exist, was added via api, or is an EDS cluster"
	if !slices.Equal(problems, []string{want}) {
		t.Errorf("the old default's clusters: problems\n%s\nwant exactly\n%s", strings.Join(problems, "\n"), want)
	}
	t.Logf("old default, as Envoy would reject it: %s", strings.Join(problems, "; "))
}

// asStruct is m as an EnvoyFilter patch value (proto field names).
func asStruct(t *testing.T, m proto.Message) *structpb.Struct {
	t.Helper()
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out := &structpb.Struct{}
	if err := protojson.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// normalised is c without its name, EDS config and locality weighting, with the service name
// in its metadata and transport sockets replaced by SVC, so two services' clusters compare.
func normalised(c *clusterv3.Cluster, svc string) *clusterv3.Cluster {
	c = proto.Clone(c).(*clusterv3.Cluster)
	c.Name = ""
	c.EdsClusterConfig = nil
	if c.CommonLbConfig != nil {
		c.CommonLbConfig.LocalityConfigSpecifier = nil
	}
	b, err := protojson.Marshal(c)
	if err != nil {
		panic(err)
	}
	b = []byte(strings.ReplaceAll(string(b), svc, "SVC"))
	out := &clusterv3.Cluster{}
	if err := protojson.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}

// TestSidecarFollowsTheReconciler drives a live sidecar stream through changes of the managed
// set: the Reconciler writes the filters through Istio's clientset, and mirror hands what it
// wrote to pilot, as istiod's Kubernetes config controller would. Each change must reach the
// connected sidecar as a CDS push, without reconnecting.
func TestSidecarFollowsTheReconciler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := efistio.Config{XDSAddress: "10.96.0.100:18000"}
	client := istiofake.NewSimpleClientset()
	kube := kubefake.NewClientset()
	r, err := efistio.NewReconciler(efistio.ReconcilerConfig{Filters: cfg, Client: client, Kube: kube})
	if err != nil {
		t.Fatal(err)
	}
	s := xdsfake.NewFakeDiscoveryServer(t, xdsfake.FakeOptions{KubernetesObjectString: kubeObjects})
	ads := connectSidecar(s, true)
	clusters := decodeClusters(t, ads.RequestResponseAck(t, nil))
	if !edsFromIstiod(clusters[reviewsCluster]) || !edsFromIstiod(clusters[ratingsCluster]) {
		t.Fatal("before any filter, a cluster does not take EDS from istiod")
	}

	ratings := optimizer.Service{Name: "ratings", Ports: []optimizer.Port{{Port: 9080}}}
	steps := []struct {
		name                 string
		managed              []optimizer.Service
		reviewsEF, ratingsEF bool
	}{
		{"reviews managed", managed, true, false},
		{"ratings managed too", append(managed[:1:1], ratings), true, true},
		{"reviews no longer managed", []optimizer.Service{ratings}, false, true},
		{"nothing managed", nil, false, false},
	}
	for _, step := range steps {
		if err := r.Reconcile(ctx, step.managed); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		mirror(t, client, s, efistio.DefaultNamespace)
		// Take pushes until one shows the change (pilot may push more than once).
		deadline := time.Now().Add(20 * time.Second)
		for {
			resp := ads.ExpectResponse(t)
			ads.Request(t, &discovery.DiscoveryRequest{ResponseNonce: resp.Nonce, VersionInfo: resp.VersionInfo})
			problems := checkSources(decodeClusters(t, resp), map[string]bool{
				reviewsCluster: step.reviewsEF,
				ratingsCluster: step.ratingsEF,
			})
			if len(problems) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the pushed clusters never showed it:\n%s", step.name, strings.Join(problems, "\n"))
			}
		}
	}
	if err := r.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(mirrorList(t, client, efistio.DefaultNamespace)); n != 0 {
		t.Errorf("%d filters left after Uninstall", n)
	}
	if cms, err := kube.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{}); err != nil || len(cms.Items) != 0 {
		t.Errorf("ConfigMaps left after Uninstall: %v (%v)", cms, err)
	}
}

// checkSources says how clusters differ from want: cluster name -> EDS from edgeflow (true)
// or from istiod (false).
func checkSources(clusters map[string]*clusterv3.Cluster, want map[string]bool) []string {
	var problems []string
	for name, fromEdgeflow := range want {
		c := clusters[name]
		switch {
		case c == nil:
			problems = append(problems, "no cluster "+name)
		case fromEdgeflow && !edsFromEdgeflow(c):
			problems = append(problems, name+" does not take EDS from edgeflow: "+protojson.Format(c.GetEdsClusterConfig()))
		case !fromEdgeflow && !edsFromIstiod(c):
			problems = append(problems, name+" does not take EDS from istiod: "+protojson.Format(c.GetEdsClusterConfig()))
		}
	}
	return problems
}

func mirrorList(t *testing.T, client *istiofake.Clientset, ns string) []*clientnetworking.EnvoyFilter {
	t.Helper()
	list, err := client.NetworkingV1alpha3().EnvoyFilters(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// mirror makes pilot's config store hold exactly the EnvoyFilters client holds in ns.
func mirror(t *testing.T, client *istiofake.Clientset, s *xdsfake.FakeDiscoveryServer, ns string) {
	t.Helper()
	stale := map[string]config.Config{}
	for _, c := range s.Store().List(gvk.EnvoyFilter, ns) {
		stale[c.Name] = c
	}
	for _, f := range mirrorList(t, client, ns) {
		c := asConfig(f)
		old, ok := stale[f.Name]
		delete(stale, f.Name)
		var err error
		if ok {
			if proto.Equal(old.Spec.(proto.Message), &f.Spec) {
				continue
			}
			_, err = s.Store().Update(c)
		} else {
			_, err = s.Store().Create(c)
		}
		if err != nil {
			t.Fatalf("EnvoyFilter %s into pilot: %v", f.Name, err)
		}
	}
	for name := range stale {
		if err := s.Store().Delete(gvk.EnvoyFilter, name, ns, nil); err != nil {
			t.Fatalf("EnvoyFilter %s out of pilot: %v", name, err)
		}
	}
}
