// Package istio checks edgeflow's EnvoyFilters against Istio's own control plane: istiod's
// pilot runs in-process (istio.io/istio/pilot/test/xds), takes the filters as the YAML a person
// would apply, and a sidecar asks it for its clusters over a real ADS stream. It is a module of
// its own because Istio is a large dependency (a cold build of the test takes ~10 min on 2
// cores): run it with `cd e2e/istio && go test -count=1 ./...`.
package istio

import (
	"context"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
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

	"github.com/edgeflow/edgeflow/optimizer"
	efistio "github.com/edgeflow/edgeflow/xds/istio"
)

const (
	// sidecarID is productpage-0's sidecar, as istio-agent names it: sidecar~IP~POD.NS~NS.svc.cluster.local.
	sidecarID = "sidecar~10.0.0.1~productpage-0.default~default.svc.cluster.local"

	reviewsCluster = "outbound|9080||reviews.default.svc.cluster.local"
	ratingsCluster = "outbound|9080||ratings.default.svc.cluster.local"
)

// kubeObjects is Bookinfo's corner: productpage calls reviews (managed by edgeflow) and ratings
// (not managed). Each service has a ready pod and an EndpointSlice, as the kubelet and the
// EndpointSlice controller would leave them.
var kubeObjects = service("productpage", "10.0.0.1", "10.96.0.1") +
	"---\n" + service("reviews", "10.0.0.2", "10.96.0.2") +
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
// clusters.
func connectSidecar(s *xdsfake.FakeDiscoveryServer) *xds.AdsTest {
	return s.ConnectADS().WithType(v3.ClusterType).WithID(sidecarID).WithTimeout(10 * time.Second).
		WithMetadata(model.NodeMetadata{
			Namespace:    "default",
			Labels:       map[string]string{"app": "productpage"},
			WorkloadName: "productpage",
			ClusterID:    "Kubernetes",
			IstioVersion: "1.31.0",
		})
}

// sidecarClusters connects to pilot as productpage-0's sidecar and returns the clusters of its
// CDS response, which it ACKs, by name.
func sidecarClusters(t *testing.T, s *xdsfake.FakeDiscoveryServer) map[string]*clusterv3.Cluster {
	t.Helper()
	return decodeClusters(t, connectSidecar(s).RequestResponseAck(t, nil))
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
	for _, cfg := range []efistio.Config{
		{XDSAddress: "edgeflow.edgeflow.svc.cluster.local:18000"},
		{XDSAddress: "10.96.0.100:18000", BootstrapCluster: true},
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

func TestSidecarTakesManagedEDSFromEdgeflow(t *testing.T) {
	tests := []struct {
		name string
		cfg  efistio.Config
		// addsCluster: the edgeflow-xds cluster comes over CDS (an EnvoyFilter ADD), not from
		// the sidecar's bootstrap.
		addsCluster bool
	}{
		{"cds-cluster", efistio.Config{XDSAddress: "edgeflow.edgeflow.svc.cluster.local:18000"}, true},
		{"bootstrap-cluster", efistio.Config{XDSAddress: "10.96.0.100:18000", BootstrapCluster: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			generated := efistio.EnvoyFilters(tt.cfg, managed)
			filters, err := efistio.MarshalYAML(generated)
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
			clusters := sidecarClusters(t, s)

			// The edgeflow-xds cluster: added exactly as generated, or absent when the
			// bootstrap defines it.
			xdsCluster, ok := clusters[efistio.XDSClusterName]
			if ok != tt.addsCluster {
				t.Fatalf("edgeflow-xds cluster present = %v, want %v", ok, tt.addsCluster)
			}
			if ok {
				if diff := cmp.Diff(efistio.XDSCluster(tt.cfg), xdsCluster, protocmp.Transform()); diff != "" {
					t.Errorf("edgeflow-xds cluster from pilot (-generated +pilot):\n%s", diff)
				}
			}

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
			if eds.GetEdsConfig().GetAds() != nil {
				t.Errorf("%s: EDS still from istiod's ADS", reviewsCluster)
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
			t.Logf("%s eds_cluster_config from pilot: %s", ratingsCluster, protojson.Format(ratings.GetEdsClusterConfig()))
			if ratings.GetEdsClusterConfig().GetEdsConfig().GetAds() == nil {
				t.Errorf("%s: EDS not from ADS: %v", ratingsCluster, ratings.GetEdsClusterConfig())
			}
			if ratings.GetCommonLbConfig().GetLocalityWeightedLbConfig() != nil {
				t.Errorf("%s: has locality_weighted_lb_config", ratingsCluster)
			}
			// Apart from EDS source and locality weighting, reviews is built like ratings:
			// the filter changed nothing else (mTLS transport sockets, circuit breakers, …).
			if diff := cmp.Diff(normalised(ratings, "ratings"), normalised(reviews, "reviews"), protocmp.Transform()); diff != "" {
				t.Errorf("reviews differs from ratings beyond EDS and locality weighting (-ratings +reviews):\n%s", diff)
			}
		})
	}
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
	ctx := context.Background()
	cfg := efistio.Config{XDSAddress: "10.96.0.100:18000", BootstrapCluster: true}
	client := istiofake.NewSimpleClientset()
	r, err := efistio.NewReconciler(efistio.ReconcilerConfig{Filters: cfg, Client: client})
	if err != nil {
		t.Fatal(err)
	}
	s := xdsfake.NewFakeDiscoveryServer(t, xdsfake.FakeOptions{KubernetesObjectString: kubeObjects})
	ads := connectSidecar(s)
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
