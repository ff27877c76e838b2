package istio

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	clientnetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiofake "istio.io/client-go/pkg/clientset/versioned/fake"
	"istio.io/istio/pilot/pkg/model"
	v3 "istio.io/istio/pilot/pkg/xds/v3"
	xdsfake "istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/adsc"
	"istio.io/istio/pkg/config"
	"istio.io/istio/pkg/config/schema/gvk"
	"istio.io/istio/pkg/config/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeflow/edgeflow/optimizer"
	efistio "github.com/edgeflow/edgeflow/xds/istio"
)

// The default Istio mode checked against Istio's own pilot: the Bookinfo topology of
// examples/bookinfo.yaml, its nodes as Kubernetes Nodes with locality labels, its pods as Pods
// and EndpointSlices; edgeflow manages productpage, reviews and ratings (details is
// unmanaged); the user has a DestinationRule of their own on reviews (ISTIO_MUTUAL, outlier
// detection). Each caller pod connects to pilot as its sidecar would (its IP, labels and
// locality) over a real ADS stream, and the ClusterLoadAssignments pilot sends it are compared
// with edgeflow's plan.

// userReviewsRule is the user's own DestinationRule on reviews.
func userReviewsRule() *clientnetworkingv1.DestinationRule {
	return &clientnetworkingv1.DestinationRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.istio.io/v1", Kind: "DestinationRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "reviews", Namespace: "default", CreationTimestamp: metav1.Unix(1000, 0)},
		Spec: networking.DestinationRule{
			Host: "reviews",
			TrafficPolicy: &networking.TrafficPolicy{
				Tls: &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_ISTIO_MUTUAL},
				OutlierDetection: &networking.OutlierDetection{
					Consecutive_5XxErrors: wrapperspb.UInt32(7),
					Interval:              durationpb.New(15 * time.Second),
					BaseEjectionTime:      durationpb.New(45 * time.Second),
				},
			},
			Subsets: []*networking.Subset{{Name: "v1", Labels: map[string]string{"version": "v1"}}},
		},
	}
}

// bookinfo reads examples/bookinfo.yaml; perNode keeps each node its own locality (subzone =
// node), else the nodes lose their subzones and share a zone two by two.
func bookinfo(t *testing.T, perNode bool) *optimizer.Topology {
	t.Helper()
	f, err := os.Open("../../examples/bookinfo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	topo, err := optimizer.ParseTopology(f, "bookinfo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for i := range topo.Nodes {
		r, z, _ := optimizer.SplitLocality(topo.Nodes[i].Locality)
		if r == "" {
			t.Fatalf("examples/bookinfo.yaml: node %s has no locality", topo.Nodes[i].Name)
		}
		if !perNode {
			topo.Nodes[i].Locality = r + "/" + z
		}
	}
	// Give every pod an IP, as the cluster would.
	for si := range topo.Services {
		for pi := range topo.Services[si].Pods {
			topo.Services[si].Pods[pi].IP = fmt.Sprintf("10.1.%d.%d", si+1, pi+1)
		}
	}
	return topo
}

// managedOnly is topo without details (an unmanaged service: no rule may touch it).
func managedOnly(topo *optimizer.Topology) *optimizer.Topology {
	m := topo.Clone()
	m.Services = slices.DeleteFunc(m.Services, func(s optimizer.Service) bool { return s.Name == "details" })
	m.Calls = slices.DeleteFunc(m.Calls, func(c optimizer.Call) bool { return c.To == "details" })
	return m
}

// kubeYAML is the cluster of topo as the kubelet, scheduler and EndpointSlice controller leave
// it: labelled Nodes, Services, running Pods on their nodes, EndpointSlices.
func kubeYAML(topo *optimizer.Topology) string {
	var docs []string
	for _, n := range topo.Nodes {
		r, z, s := optimizer.SplitLocality(n.Locality)
		labels := fmt.Sprintf("    topology.kubernetes.io/region: %s\n    topology.kubernetes.io/zone: %s\n", r, z)
		if s != "" {
			labels += "    topology.istio.io/subzone: " + s + "\n"
		}
		docs = append(docs, fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n  labels:\n%s", n.Name, labels))
	}
	for si, s := range topo.Services {
		docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: %[1]s
  namespace: default
  labels: {app: %[1]s}
spec:
  clusterIP: 10.96.0.%[2]d
  selector: {app: %[1]s}
  ports:
  - {name: http, port: 9080, targetPort: 9080}
`, s.Name, si+1))
		var eps []string
		for _, p := range s.Pods {
			docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: default
  labels: {app: %[2]s, version: v1, security.istio.io/tlsMode: istio}
spec:
  nodeName: %[3]s
  containers: [{name: app, image: app}]
status:
  phase: Running
  conditions: [{type: Ready, status: "True"}]
  podIP: %[4]s
  podIPs: [{ip: %[4]s}]
`, p.Name, s.Name, p.Node, p.IP))
			eps = append(eps, fmt.Sprintf("- addresses: [%s]\n  conditions: {ready: true}\n  nodeName: %s\n  targetRef: {kind: Pod, name: %s, namespace: default}\n", p.IP, p.Node, p.Name))
		}
		docs = append(docs, fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-abcde
  namespace: default
  labels: {kubernetes.io/service-name: %[1]s}
addressType: IPv4
ports:
- {name: http, port: 9080, protocol: TCP}
endpoints:
%[2]s`, s.Name, strings.Join(eps, "")))
	}
	return strings.Join(docs, "---\n")
}

// drConfig is rule as pilot's config store holds it.
func drConfig(dr *clientnetworkingv1.DestinationRule) config.Config {
	return config.Config{
		Meta: config.Meta{
			GroupVersionKind:  gvk.DestinationRule,
			Name:              dr.Name,
			Namespace:         dr.Namespace,
			Labels:            dr.Labels,
			Annotations:       dr.Annotations,
			CreationTimestamp: dr.CreationTimestamp.Time,
		},
		Spec: proto.Clone(&dr.Spec),
	}
}

func newPilot(t *testing.T, topo *optimizer.Topology, rules ...*clientnetworkingv1.DestinationRule) *xdsfake.FakeDiscoveryServer {
	var configs []config.Config
	for _, dr := range rules {
		configs = append(configs, drConfig(dr))
	}
	return xdsfake.NewFakeDiscoveryServer(t, xdsfake.FakeOptions{KubernetesObjectString: kubeYAML(topo), Configs: configs})
}

// sidecar connects to s as the sidecar of pod p of service svc over ADS (CDS and EDS), with the
// pod's locality, and waits for its endpoints.
func sidecar(t *testing.T, s *xdsfake.FakeDiscoveryServer, topo *optimizer.Topology, svc string, p optimizer.Pod) *adsc.ADSC {
	t.Helper()
	var locality string
	for _, n := range topo.Nodes {
		if n.Name == p.Node {
			locality = n.Locality
		}
	}
	r, z, sz := optimizer.SplitLocality(locality)
	labels := map[string]string{"app": svc, "version": "v1", "security.istio.io/tlsMode": "istio"}
	proxy := &model.Proxy{
		ID:              p.Name + ".default",
		IPAddresses:     []string{p.IP},
		ConfigNamespace: "default",
		Locality:        &corev3.Locality{Region: r, Zone: z, SubZone: sz},
		Labels:          labels,
		Metadata: &model.NodeMetadata{Namespace: "default", Labels: labels, WorkloadName: svc,
			ClusterID: "Kubernetes", IstioVersion: "1.31.0"},
	}
	return s.Connect(proxy, []string{v3.ClusterType, v3.EndpointType}, []string{v3.ClusterType, v3.EndpointType})
}

func clusterName(svc string) string { return "outbound|9080||" + svc + ".default.svc.cluster.local" }

// localityWeights returns the load-balancing weight of every locality of cla that has endpoints
// ("region/zone/subzone", trailing empty parts dropped).
func localityWeights(cla *endpointv3.ClusterLoadAssignment) map[string]uint32 {
	out := map[string]uint32{}
	for _, lle := range cla.GetEndpoints() {
		if len(lle.GetLbEndpoints()) == 0 {
			continue
		}
		l := strings.TrimRight(lle.GetLocality().GetRegion()+"/"+lle.GetLocality().GetZone()+"/"+lle.GetLocality().GetSubZone(), "/")
		out[l] += lle.GetLoadBalancingWeight().GetValue()
	}
	return out
}

// ruleFor returns rule's distribute entry for caller locality from.
func ruleFor(dr *clientnetworkingv1.DestinationRule, from string) map[string]uint32 {
	for _, d := range dr.Spec.GetTrafficPolicy().GetLoadBalancer().GetLocalityLbSetting().GetDistribute() {
		if d.GetFrom() == from {
			return d.GetTo()
		}
	}
	return nil
}

// planned returns, for the call edge caller → callee, the plan's share (in points of 100) of
// the caller locality's traffic sent to each callee locality.
func planned(p *efistio.LocalityPlan, caller, callee, from string) map[string]float64 {
	out := map[string]float64{}
	c := p.Allocation.Call(caller, callee)
	for _, r := range c.Routes {
		if r.Caller == optimizer.GroupedPodName(caller, from) {
			to := strings.TrimPrefix(r.Callee, callee+"@")
			out[to] += 100 * r.Fraction
		}
	}
	return out
}

// checkFollows connects every caller pod of managed's call edges to s as its sidecar and
// checks that pilot's locality weights for each managed callee are edgeflow's rule for the
// caller's locality exactly, and the plan's shares within the rounding the report gives. It
// returns the largest difference from the plan in points.
func checkFollows(t *testing.T, s *xdsfake.FakeDiscoveryServer, managed *optimizer.Topology, p *efistio.LocalityPlan,
	rules []*clientnetworkingv1.DestinationRule) float64 {
	t.Helper()
	byCallee := map[string]map[string]*clientnetworkingv1.DestinationRule{} // caller → callee → rule
	for _, dr := range rules {
		caller := strings.TrimSuffix(dr.Annotations[efistio.CallerAnnotation], ".default")
		callee := strings.TrimSuffix(dr.Annotations[efistio.CalleeAnnotation], ".default")
		if byCallee[caller] == nil {
			byCallee[caller] = map[string]*clientnetworkingv1.DestinationRule{}
		}
		byCallee[caller][callee] = dr
	}
	var worst float64
	checked := 0
	for _, svc := range managed.Services {
		callees := byCallee[svc.Name]
		if len(callees) == 0 {
			continue
		}
		for _, pod := range svc.Pods {
			conn := sidecar(t, s, managed, svc.Name, pod)
			from := p.Grouping.GroupOf(pod.Node)
			eps := conn.GetEndpoints()
			for callee, dr := range callees {
				cla := eps[clusterName(callee)]
				if cla == nil {
					t.Fatalf("%s: pilot sent no assignment for %s", pod.Name, clusterName(callee))
				}
				got := localityWeights(cla)
				want := ruleFor(dr, from)
				if len(want) == 0 {
					t.Fatalf("%s: edgeflow's rule %s has no entry for the caller's locality %q", pod.Name, dr.Name, from)
				}
				if !maps.Equal(got, want) {
					t.Errorf("%s (locality %s) → %s: pilot's locality weights %v, edgeflow's rule %v", pod.Name, from, callee, got, want)
				}
				plan := planned(p, svc.Name, callee, from)
				for loc, w := range got {
					d := math.Abs(float64(w) - plan[loc])
					worst = max(worst, d)
					// Rounding moves a weight by less than 1 point; the floor of 1 for every
					// locality the plan gives less than a point takes at most one point per
					// such locality from the others.
					floored := 0
					for l := range got {
						if plan[l] < 1 {
							floored++
						}
					}
					if d > 1+float64(floored) {
						t.Errorf("%s → %s, locality %s: pilot's weight %d, plan %.2f points", pod.Name, callee, loc, w, plan[loc])
					}
				}
				checked++
			}
		}
	}
	if checked == 0 {
		t.Fatal("no caller sidecar was checked")
	}
	t.Logf("checked %d (caller sidecar, managed callee) pairs; largest difference between pilot's weights and the plan: %.2f points", checked, worst)
	return worst
}

func TestIstioValidatesTheDestinationRules(t *testing.T) {
	t.Parallel()
	for _, perNode := range []bool{true, false} {
		managed := managedOnly(bookinfo(t, perNode))
		p, err := efistio.PlanLocalities(managed, optimizer.LATA, optimizer.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rules, rep := efistio.DestinationRules(efistio.RulesConfig{}, p, []*clientnetworkingv1.DestinationRule{userReviewsRule()})
		if len(rules) == 0 {
			t.Fatalf("no rules: %+v", rep)
		}
		for _, dr := range rules {
			// What istiod's validating webhook and istioctl validate run on a DestinationRule.
			warnings, err := validation.ValidateDestinationRule(drConfig(dr))
			if err != nil {
				t.Errorf("DestinationRule %s/%s rejected by Istio's validation: %v", dr.Namespace, dr.Name, err)
			}
			if warnings != nil {
				t.Logf("DestinationRule %s: Istio warns: %v", dr.Name, warnings)
			}
		}
	}
}

func TestSidecarsFollowTheDestinationRules(t *testing.T) {
	t.Parallel()
	topo := bookinfo(t, true)
	managed := managedOnly(topo)
	user := userReviewsRule()
	p, err := efistio.PlanLocalities(managed, optimizer.LATA, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Grouping.Granularity() != "node" || len(p.Grouping.Groups) != len(topo.Nodes) {
		t.Fatalf("each node has its own locality, but the plan is made per %s over %d localities", p.Grouping.Granularity(), len(p.Grouping.Groups))
	}
	rules, rep := efistio.DestinationRules(efistio.RulesConfig{}, p, []*clientnetworkingv1.DestinationRule{user})
	if got := len(rules); got != 2 {
		t.Fatalf("%d rules, want 2 (productpage → reviews, reviews → ratings): %+v", got, rep.Edges)
	}
	s := newPilot(t, topo, append([]*clientnetworkingv1.DestinationRule{user}, rules...)...)
	worst := checkFollows(t, s, managed, p, rules)
	t.Logf("bookinfo, a locality per node: %d objects (DestinationRules); largest difference from the plan %.2f points", len(rules), worst)

	// The user's TLS and outlier detection are still on reviews' cluster, for productpage's
	// sidecar (which takes edgeflow's rule).
	pp := topo.Services[slices.IndexFunc(topo.Services, func(s optimizer.Service) bool { return s.Name == "productpage" })]
	conn := sidecar(t, s, managed, "productpage", pp.Pods[0])
	reviews := conn.GetClusters()[clusterName("reviews")]
	if reviews == nil {
		reviews = conn.GetEdsClusters()[clusterName("reviews")]
	}
	if reviews == nil {
		t.Fatal("productpage's sidecar has no reviews cluster")
	}
	if od := reviews.GetOutlierDetection(); od.GetConsecutive_5Xx().GetValue() != 7 || od.GetBaseEjectionTime().AsDuration() != 45*time.Second {
		t.Errorf("reviews cluster lost the user's outlier detection: %v", od)
	}
	if !usesIstioMTLS(reviews) {
		t.Errorf("reviews cluster lost the user's ISTIO_MUTUAL TLS: transport socket %v, matches %v", reviews.GetTransportSocket(), reviews.GetTransportSocketMatches())
	}
	if reviews.GetCommonLbConfig().GetLocalityWeightedLbConfig() == nil {
		t.Error("reviews cluster has no locality_weighted_lb_config")
	}

	// details is not managed: what every sidecar gets for it is byte-identical to a mesh
	// without edgeflow's rules.
	bare := newPilot(t, topo, user)
	// The check is not vacuous: without edgeflow's rules pilot's weights are not the rule's.
	if got := localityWeights(sidecar(t, bare, managed, "productpage", pp.Pods[0]).GetEndpoints()[clusterName("reviews")]); maps.Equal(got, ruleFor(rules[0], p.Grouping.GroupOf(pp.Pods[0].Node))) {
		t.Fatalf("without edgeflow's rules pilot already gives %v", got)
	}
	for _, svc := range []string{"productpage", "reviews"} {
		si := slices.IndexFunc(topo.Services, func(s optimizer.Service) bool { return s.Name == svc })
		for _, pod := range topo.Services[si].Pods {
			with, without := sidecar(t, s, managed, svc, pod), sidecar(t, bare, managed, svc, pod)
			name := clusterName("details")
			if !sameBytes(with.GetEndpoints()[name], without.GetEndpoints()[name]) {
				t.Errorf("%s: details' assignment differs from a mesh without edgeflow", pod.Name)
			}
			if !sameBytes(anyCluster(with, name), anyCluster(without, name)) {
				t.Errorf("%s: details' cluster differs from a mesh without edgeflow", pod.Name)
			}
		}
	}

	// A latency change: the reconciler rewrites the rules, pilot's output follows on the live
	// streams.
	client := istiofake.NewSimpleClientset(user)
	r, err := efistio.NewRulesReconciler(efistio.RulesReconcilerConfig{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := r.Reconcile(ctx, p); err != nil {
		t.Fatal(err)
	}
	conns := map[string]*adsc.ADSC{}
	for _, pod := range pp.Pods {
		conns[pod.Name] = sidecar(t, s, managed, "productpage", pod)
	}
	slow := managed.Clone()
	for i, l := range slow.Latency {
		if (l.From == "n1" && l.To == "n3") || (l.From == "n3" && l.To == "n1") || (l.From == "n2" && l.To == "n3") {
			slow.Latency[i].MS = 60 // n3 becomes far from n1 and n2
		}
	}
	p2, err := efistio.PlanLocalities(slow, optimizer.LATA, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Reconcile(ctx, p2); err != nil {
		t.Fatal(err)
	}
	written := mirrorRules(t, client, s)
	var after *clientnetworkingv1.DestinationRule
	for _, dr := range written {
		if dr.Name == "edgeflow.productpage.reviews.default" {
			after = dr
		}
	}
	before := rules[slices.IndexFunc(rules, func(dr *clientnetworkingv1.DestinationRule) bool {
		return dr.Name == "edgeflow.productpage.reviews.default"
	})]
	if after == nil || proto.Equal(&after.Spec, &before.Spec) {
		t.Fatal("the latency change did not change productpage → reviews' rule")
	}
	for _, pod := range pp.Pods {
		from := p2.Grouping.GroupOf(pod.Node)
		want := ruleFor(after, from)
		deadline := time.Now().Add(20 * time.Second)
		for {
			got := localityWeights(conns[pod.Name].GetEndpoints()[clusterName("reviews")])
			if maps.Equal(got, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: pilot's weights for reviews stayed %v after the rule changed to %v", pod.Name, got, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	checkFollows(t, s, slow, p2, written)
}

func TestSidecarsFollowZoneLevelRules(t *testing.T) {
	t.Parallel()
	topo := bookinfo(t, false) // two nodes per zone, no subzones
	managed := managedOnly(topo)
	p, err := efistio.PlanLocalities(managed, optimizer.LATA, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Grouping.Granularity() != "locality" || len(p.Grouping.Groups) != 2 {
		t.Fatalf("nodes share zones two by two, but the plan is made per %s over %d localities", p.Grouping.Granularity(), len(p.Grouping.Groups))
	}
	for _, g := range p.Grouping.Groups {
		if len(g.Nodes) != 2 || strings.Count(g.Locality, "/") != 1 {
			t.Errorf("group %+v: want a zone of two nodes", g)
		}
	}
	rules, rep := efistio.DestinationRules(efistio.RulesConfig{}, p, nil)
	if len(rules) == 0 {
		t.Fatalf("no rules: %+v", rep.Edges)
	}
	s := newPilot(t, topo, rules...)
	worst := checkFollows(t, s, managed, p, rules)
	t.Logf("bookinfo, two nodes per zone: %d DestinationRules; largest difference from the zone plan %.2f points", len(rules), worst)
}

// mirrorRules makes pilot's config store hold exactly the DestinationRules client holds, as
// istiod's Kubernetes config controller would, and returns edgeflow's.
func mirrorRules(t *testing.T, client *istiofake.Clientset, s *xdsfake.FakeDiscoveryServer) []*clientnetworkingv1.DestinationRule {
	t.Helper()
	list, err := client.NetworkingV1().DestinationRules(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stale := map[string]config.Config{}
	for _, c := range s.Store().List(gvk.DestinationRule, metav1.NamespaceAll) {
		stale[c.Namespace+"/"+c.Name] = c
	}
	var ours []*clientnetworkingv1.DestinationRule
	for _, dr := range list.Items {
		if dr.Labels[efistio.ManagedByLabel] == efistio.ManagedByValue {
			ours = append(ours, dr)
		}
		key := dr.Namespace + "/" + dr.Name
		old, ok := stale[key]
		delete(stale, key)
		var err error
		switch {
		case !ok:
			_, err = s.Store().Create(drConfig(dr))
		case !proto.Equal(old.Spec.(proto.Message), &dr.Spec):
			_, err = s.Store().Update(drConfig(dr))
		}
		if err != nil {
			t.Fatalf("DestinationRule %s into pilot: %v", key, err)
		}
	}
	for _, c := range stale {
		if err := s.Store().Delete(gvk.DestinationRule, c.Name, c.Namespace, nil); err != nil {
			t.Fatal(err)
		}
	}
	return ours
}

func anyCluster(c *adsc.ADSC, name string) *clusterv3.Cluster {
	if cl := c.GetClusters()[name]; cl != nil {
		return cl
	}
	return c.GetEdsClusters()[name]
}

func sameBytes(a, b proto.Message) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	ab, err1 := proto.MarshalOptions{Deterministic: true}.Marshal(a)
	bb, err2 := proto.MarshalOptions{Deterministic: true}.Marshal(b)
	return err1 == nil && err2 == nil && string(ab) == string(bb)
}

// usesIstioMTLS says whether c's upstream TLS is Istio's mutual TLS (the SDS "default"
// certificate), as pilot builds it for ISTIO_MUTUAL.
func usesIstioMTLS(c *clusterv3.Cluster) bool {
	s := fmt.Sprint(c.GetTransportSocket(), c.GetTransportSocketMatches())
	return strings.Contains(s, "envoy.transport_sockets.tls") && strings.Contains(s, "default")
}
