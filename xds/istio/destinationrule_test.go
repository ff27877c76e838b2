package istio

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	typev1beta1 "istio.io/api/type/v1beta1"
	clientnetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiofake "istio.io/client-go/pkg/clientset/versioned/fake"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

func TestRoundWeights(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		n := 1 + rng.IntN(12)
		locs := make([]string, n)
		raw := make([]float64, n)
		var sum float64
		for j := range locs {
			locs[j] = string(rune('a' + j))
			if rng.IntN(3) > 0 { // some localities get nothing
				raw[j] = rng.Float64()
				sum += raw[j]
			}
		}
		if sum == 0 {
			raw[0], sum = 1, 1
		}
		shares := map[string]float64{}
		floored := 0
		for j, l := range locs {
			shares[l] = raw[j] / sum
			if shares[l]*DistributeTotal < 1 {
				floored++
			}
		}
		w, maxDev, tv := roundWeights(locs, shares)
		total := 0
		var dev, tvWant float64
		for _, l := range locs {
			if w[l] < 1 {
				t.Fatalf("case %d: locality %s weight %d < 1", i, l, w[l])
			}
			total += int(w[l])
			d := math.Abs(float64(w[l]) - shares[l]*DistributeTotal)
			dev = max(dev, d)
			tvWant += d / DistributeTotal / 2
			// Largest remainder: within a point, plus a point per floored locality.
			if d >= 1+float64(floored) {
				t.Errorf("case %d: locality %s weight %d for share %.4f (%d floored)", i, l, w[l], shares[l], floored)
			}
		}
		if total != DistributeTotal || len(w) != n {
			t.Fatalf("case %d: weights %v sum to %d over %d localities", i, w, total, len(w))
		}
		if math.Abs(dev-maxDev) > 1e-9 || math.Abs(tv-tvWant) > 1e-9 {
			t.Errorf("case %d: reported deviation %v / %v, measured %v / %v", i, maxDev, tv, dev, tvWant)
		}
	}
}

// shop: web (namespace front) calls api (namespace shop) on two localities, api calls db.
func shopTopology() *optimizer.Topology {
	return &optimizer.Topology{
		Nodes:   []optimizer.Node{{Name: "a", Locality: "r/z1"}, {Name: "b", Locality: "r/z2"}},
		Latency: []optimizer.Latency{{From: "a", To: "b", MS: 10}},
		Services: []optimizer.Service{
			{Name: "web", Namespace: "front", Selector: map[string]string{"app": "web", "tier": "front"},
				Pods: []optimizer.Pod{{Name: "web-0", Node: "a"}, {Name: "web-1", Node: "b"}}},
			// api's Service selects no pods: its sidecars cannot be selected (api → db gets no rule).
			{Name: "api", Namespace: "shop", Selector: map[string]string{}, Pods: []optimizer.Pod{{Name: "api-0", Node: "a"}, {Name: "api-1", Node: "b"}}},
			{Name: "db", Namespace: "shop", Pods: []optimizer.Pod{{Name: "db-0", Node: "a"}, {Name: "db-1", Node: "b"}}},
		},
		Calls:   []optimizer.Call{{From: "web.front", To: "api.shop"}, {From: "api.shop", To: "db.shop"}},
		Ingress: []optimizer.Ingress{{Service: "web.front", RPS: 100}},
	}
}

func userRule(ns, name, host string, mutate func(*networking.DestinationRule)) *clientnetworkingv1.DestinationRule {
	dr := &clientnetworkingv1.DestinationRule{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	dr.Spec.Host = host
	dr.Spec.TrafficPolicy = &networking.TrafficPolicy{Tls: &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_ISTIO_MUTUAL}}
	if mutate != nil {
		mutate(&dr.Spec)
	}
	return dr
}

func planShop(t *testing.T) *LocalityPlan {
	t.Helper()
	p, err := PlanLocalities(shopTopology(), optimizer.LATA, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDestinationRulesShape(t *testing.T) {
	t.Parallel()
	p := planShop(t)
	rules, rep := DestinationRules(RulesConfig{ClusterDomain: "corp.local"}, p, nil)
	if len(rules) != 1 {
		t.Fatalf("%d rules, want 1 (web → api; api's empty selector cannot select its sidecars): %+v", len(rules), rep.Edges)
	}
	dr := rules[0]
	if dr.Namespace != "front" || dr.Name != "edgeflow.web.api.shop" || dr.Spec.Host != "api.shop.svc.corp.local" {
		t.Errorf("rule %s/%s host %s", dr.Namespace, dr.Name, dr.Spec.Host)
	}
	if got := dr.Spec.GetWorkloadSelector().GetMatchLabels(); got["app"] != "web" || got["tier"] != "front" || len(got) != 2 {
		t.Errorf("workload selector %v, want web's selector", got)
	}
	lb := dr.Spec.GetTrafficPolicy().GetLoadBalancer().GetLocalityLbSetting()
	if len(lb.GetDistribute()) != 2 || !lb.GetEnabled().GetValue() {
		t.Fatalf("localityLbSetting %v: want enabled, one distribute entry per caller locality", lb)
	}
	for _, d := range lb.GetDistribute() {
		var sum uint32
		for loc, w := range d.GetTo() {
			sum += w
			if w < 1 || (loc != "r/z1" && loc != "r/z2") {
				t.Errorf("from %s: to %s weight %d", d.GetFrom(), loc, w)
			}
		}
		// Each web pod's locality holds an api pod with exactly its share: all stays local.
		if sum != DistributeTotal || d.GetTo()[d.GetFrom()] != DistributeTotal-1 {
			t.Errorf("from %s: %v, want 99 local, 1 remote (the floor)", d.GetFrom(), d.GetTo())
		}
	}
	if dr.Labels[ManagedByLabel] != ManagedByValue {
		t.Errorf("labels %v", dr.Labels)
	}
	var skipped []string
	for _, e := range rep.Edges {
		if e.Skipped != "" {
			skipped = append(skipped, e.Caller+"→"+e.Callee+": "+e.Skipped)
		}
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0], "no pod selector") {
		t.Errorf("skipped %v, want api → db for its caller's empty selector", skipped)
	}
}

// TestMissingExportToFollowsTheMeshDefault: a user's rule without exportTo, in the callee's
// namespace or the root namespace, is carried into the caller's rule only when the mesh's
// defaultDestinationRuleExportTo exports it (Istio honours "." and "*" alone:
// push_context.go setDestinationRules). Before, a missing exportTo was read as "*" whatever the
// mesh said.
func TestMissingExportToFollowsTheMeshDefault(t *testing.T) {
	t.Parallel()
	p := planShop(t)
	callee := []*clientnetworkingv1.DestinationRule{userRule("shop", "api", "api", nil)}
	root := []*clientnetworkingv1.DestinationRule{userRule("istio-system", "mesh", "*.local", nil)}
	explicit := []*clientnetworkingv1.DestinationRule{userRule("shop", "api", "api", func(s *networking.DestinationRule) { s.ExportTo = []string{"*"} })}
	tests := []struct {
		name        string
		meshDefault []string
		user        []*clientnetworkingv1.DestinationRule
		basedOn     string
	}{
		{"no mesh default: exported", nil, callee, "shop/api"},
		{"mesh default *", []string{"*"}, callee, "shop/api"},
		{"mesh default .: private to the callee's namespace", []string{"."}, callee, ""},
		{"mesh default .: private to the root namespace", []string{"."}, root, ""},
		{"mesh default . and *: private (Istio checks . first)", []string{".", "*"}, callee, ""},
		{"mesh default ~ is not honoured: exported", []string{"~"}, callee, "shop/api"},
		{"an explicit exportTo wins over the mesh default", []string{"."}, explicit, "shop/api"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules, rep := DestinationRules(RulesConfig{DefaultExportTo: tt.meshDefault}, p, tt.user)
			if len(rules) != 1 {
				t.Fatalf("%d rules: %+v", len(rules), rep.Edges)
			}
			if got := rules[0].Annotations[BasedOnAnnotation]; got != tt.basedOn {
				t.Errorf("based on %q, want %q", got, tt.basedOn)
			}
		})
	}
}

func TestDestinationRulesCarryTheUsersRule(t *testing.T) {
	t.Parallel()
	p := planShop(t)
	withSubset := func(s *networking.DestinationRule) {
		s.Subsets = []*networking.Subset{{Name: "v1", Labels: map[string]string{"version": "v1"}}}
		s.TrafficPolicy.OutlierDetection = &networking.OutlierDetection{}
		s.TrafficPolicy.LoadBalancer = &networking.LoadBalancerSettings{LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: networking.LoadBalancerSettings_LEAST_REQUEST}}
	}
	tests := []struct {
		name    string
		user    []*clientnetworkingv1.DestinationRule
		basedOn string // "" = no user rule applies
	}{
		{"none", nil, ""},
		{"callee namespace, exported", []*clientnetworkingv1.DestinationRule{userRule("shop", "api", "api", withSubset)}, "shop/api"},
		{"callee namespace, private", []*clientnetworkingv1.DestinationRule{userRule("shop", "api", "api", func(s *networking.DestinationRule) { s.ExportTo = []string{"."} })}, ""},
		{"caller namespace beats callee's", []*clientnetworkingv1.DestinationRule{
			userRule("shop", "api", "api", nil), userRule("front", "api", "api.shop.svc.cluster.local", withSubset)}, "front/api"},
		{"exact host beats wildcard", []*clientnetworkingv1.DestinationRule{
			userRule("front", "all", "*.cluster.local", nil), userRule("front", "api", "api.shop.svc.cluster.local", withSubset)}, "front/api"},
		{"root namespace wildcard", []*clientnetworkingv1.DestinationRule{userRule("istio-system", "mesh", "*.local", nil)}, "istio-system/mesh"},
		{"another workload's selector", []*clientnetworkingv1.DestinationRule{userRule("front", "other", "api.shop.svc.cluster.local", func(s *networking.DestinationRule) {
			s.WorkloadSelector = &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "other"}}
		})}, ""},
		{"edgeflow's own rule is not the user's", []*clientnetworkingv1.DestinationRule{func() *clientnetworkingv1.DestinationRule {
			dr := userRule("front", "edgeflow.web.api.shop", "api.shop.svc.cluster.local", nil)
			dr.Labels = map[string]string{ManagedByLabel: ManagedByValue}
			return dr
		}()}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules, rep := DestinationRules(RulesConfig{}, p, tt.user)
			if len(rules) != 1 {
				t.Fatalf("%d rules: %+v", len(rules), rep.Edges)
			}
			dr := rules[0]
			if got := dr.Annotations[BasedOnAnnotation]; got != tt.basedOn {
				t.Fatalf("based on %q, want %q", got, tt.basedOn)
			}
			if tt.basedOn == "" {
				if dr.Spec.GetTrafficPolicy().GetTls() != nil {
					t.Errorf("TLS %v without a user rule", dr.Spec.GetTrafficPolicy().GetTls())
				}
				return
			}
			i := slices.IndexFunc(tt.user, func(u *clientnetworkingv1.DestinationRule) bool { return u.Namespace+"/"+u.Name == tt.basedOn })
			user := tt.user[i]
			// Everything of the user's rule is carried; only the locality setting is added.
			got := proto.Clone(&dr.Spec).(*networking.DestinationRule)
			got.GetTrafficPolicy().GetLoadBalancer().LocalityLbSetting = nil
			want := proto.Clone(&user.Spec).(*networking.DestinationRule)
			want.Host, want.WorkloadSelector, want.ExportTo = got.Host, got.WorkloadSelector, nil
			if want.TrafficPolicy.LoadBalancer == nil {
				want.TrafficPolicy.LoadBalancer = &networking.LoadBalancerSettings{}
			}
			if !proto.Equal(got, want) {
				t.Errorf("rule %v\nwant the user's %v plus the locality setting", got, want)
			}
		})
	}
}

func TestDestinationRulesConflicts(t *testing.T) {
	t.Parallel()
	p := planShop(t)
	for name, mutate := range map[string]func(*networking.DestinationRule){
		"localityLbSetting": func(s *networking.DestinationRule) {
			s.TrafficPolicy.LoadBalancer = &networking.LoadBalancerSettings{LocalityLbSetting: &networking.LocalityLoadBalancerSetting{}}
		},
		"consistent hashing": func(s *networking.DestinationRule) {
			s.TrafficPolicy.LoadBalancer = &networking.LoadBalancerSettings{LbPolicy: &networking.LoadBalancerSettings_ConsistentHash{
				ConsistentHash: &networking.LoadBalancerSettings_ConsistentHashLB{}}}
		},
		"port-level load balancer": func(s *networking.DestinationRule) {
			s.TrafficPolicy.PortLevelSettings = []*networking.TrafficPolicy_PortTrafficPolicy{{
				Port: &networking.PortSelector{Number: 9080}, LoadBalancer: &networking.LoadBalancerSettings{}}}
		},
		"selects the caller itself": func(s *networking.DestinationRule) {
			s.WorkloadSelector = &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "web"}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			user := userRule("front", "mine", "api.shop.svc.cluster.local", mutate)
			rules, rep := DestinationRules(RulesConfig{}, p, []*clientnetworkingv1.DestinationRule{user})
			if len(rules) != 0 {
				t.Fatalf("a rule was written over the user's: %v", rules[0].Spec.String())
			}
			e := rep.Edges[0]
			if !e.Conflict || !strings.Contains(e.Skipped, "front/mine") {
				t.Errorf("edge %+v: want a conflict naming the user's rule", e)
			}
		})
	}
}

func TestDestinationRulesSkipWhatTheMeshCannotExpress(t *testing.T) {
	t.Parallel()
	topo := shopTopology()
	topo.Nodes = append(topo.Nodes, optimizer.Node{Name: "c"})
	topo.Latency = append(topo.Latency, optimizer.Latency{From: "a", To: "c", MS: 5}, optimizer.Latency{From: "b", To: "c", MS: 5})
	topo.Services[1].Pods = append(topo.Services[1].Pods, optimizer.Pod{Name: "api-2", Node: "c"})
	p, err := PlanLocalities(topo, optimizer.LATA, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rules, rep := DestinationRules(RulesConfig{}, p, nil)
	if len(rules) != 0 || !strings.Contains(rep.Edges[0].Skipped, "api-2") {
		t.Errorf("a callee pod on a node without a locality: rules %d, edge %+v; want none, naming the pod", len(rules), rep.Edges[0])
	}

	one := shopTopology()
	for i := range one.Nodes {
		one.Nodes[i].Locality = "r/z"
	}
	p, err = PlanLocalities(one, optimizer.LATA, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rules, rep = DestinationRules(RulesConfig{}, p, nil); len(rules) != 0 || !strings.Contains(rep.Edges[0].Skipped, "one locality") {
		t.Errorf("one locality: rules %d, edge %+v", len(rules), rep.Edges[0])
	}
}

// TestRefusedRuleCounted: a rule the API server refuses (here an admission policy's 403 on one
// edge's create) is counted in edgeflow_istio_refused_writes_total and logged, and the pass
// writes the other edges' rules and succeeds. Before, the refusal failed the whole pass (retried
// every RetryInterval).
func TestRefusedRuleCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := istiofake.NewSimpleClientset()
	client.PrependReactor("create", "destinationrules", func(a k8stesting.Action) (bool, runtime.Object, error) {
		dr := a.(k8stesting.CreateAction).GetObject().(*clientnetworkingv1.DestinationRule)
		if dr.Name == "edgeflow.web.api.shop" {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "networking.istio.io", Resource: "destinationrules"}, dr.Name,
				errors.New("ValidatingAdmissionPolicy 'quota' denied request"))
		}
		return false, nil, nil
	})
	reg := prometheus.NewRegistry()
	var logs testkit.LogBuffer
	r, err := NewRulesReconciler(RulesReconcilerConfig{Client: client, Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	topo := shopTopology()
	topo.Calls = append(topo.Calls, optimizer.Call{From: "web.front", To: "db.shop"})
	p, err := PlanLocalities(topo, optimizer.LATA, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Reconcile(ctx, p); err != nil {
		t.Fatalf("a refused rule failed the pass: %v", err)
	}
	if got := testutil.ToFloat64(r.metrics.refused.WithLabelValues(kindDestinationRule)); got != 1 {
		t.Errorf("edgeflow_istio_refused_writes_total = %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "rule=front/edgeflow.web.api.shop") {
		t.Errorf("no log line naming the refused rule:\n%s", logs.String())
	}
	list, err := client.NetworkingV1().DestinationRules("front").List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) == 0 {
		t.Fatalf("the other edges' rules were not written: %v %v", list, err)
	}
	for _, dr := range list.Items {
		if dr.Name == "edgeflow.web.api.shop" {
			t.Errorf("the refused rule exists")
		}
	}
}

func TestRulesReconciler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	user := userRule("shop", "api", "api", nil)
	user.ResourceVersion = "7"
	client := istiofake.NewSimpleClientset(user)
	r, err := NewRulesReconciler(RulesReconcilerConfig{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	writes := func() []string {
		var out []string
		for _, a := range client.Actions() {
			if a.GetVerb() != "list" && a.GetVerb() != "get" {
				name := ""
				switch a := a.(type) {
				case k8stesting.CreateAction: // an UpdateAction too: both have GetObject
					name = a.GetObject().(metav1.Object).GetName()
				case k8stesting.DeleteAction:
					name = a.GetName()
				}
				out = append(out, a.GetVerb()+" "+a.GetNamespace()+"/"+name)
			}
		}
		client.ClearActions()
		return out
	}
	p := planShop(t)
	if err := r.Reconcile(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := writes(); !slices.Equal(got, []string{"create front/edgeflow.web.api.shop"}) {
		t.Errorf("first pass wrote %v", got)
	}
	if err := r.Reconcile(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := writes(); len(got) != 0 {
		t.Errorf("an unchanged plan wrote %v", got)
	}
	// The user changes their rule: edgeflow's follows.
	user.Spec.TrafficPolicy.Tls.Mode = networking.ClientTLSSettings_DISABLE
	if _, err := client.NetworkingV1().DestinationRules("shop").Update(ctx, user, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	client.ClearActions()
	if err := r.Reconcile(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := writes(); !slices.Equal(got, []string{"update front/edgeflow.web.api.shop"}) {
		t.Errorf("after the user's change: %v", got)
	}
	ours, err := client.NetworkingV1().DestinationRules("front").Get(ctx, "edgeflow.web.api.shop", metav1.GetOptions{})
	if err != nil || ours.Spec.GetTrafficPolicy().GetTls().GetMode() != networking.ClientTLSSettings_DISABLE {
		t.Errorf("edgeflow's rule did not follow the user's TLS change: %v %v", ours, err)
	}
	// web no longer calls api: the rule goes; the user's stays.
	topo := shopTopology()
	topo.Calls = topo.Calls[1:]
	topo.Ingress = []optimizer.Ingress{{Service: "api.shop", RPS: 10}}
	p2, err := PlanLocalities(topo, optimizer.LATA, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Reconcile(ctx, p2); err != nil {
		t.Fatal(err)
	}
	if got := writes(); !slices.Equal(got, []string{"delete front/edgeflow.web.api.shop"}) {
		t.Errorf("after the edge went: %v", got)
	}
	if err := r.Reconcile(ctx, p); err != nil {
		t.Fatal(err)
	}
	writes()
	if err := r.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	if got := writes(); !slices.Equal(got, []string{"delete front/edgeflow.web.api.shop"}) {
		t.Errorf("uninstall: %v", got)
	}
	if err := r.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := client.NetworkingV1().DestinationRules("shop").Get(ctx, "api", metav1.GetOptions{}); err != nil {
		t.Errorf("the user's rule is gone: %v", err)
	}
}

// TestDestinationRulesBands: with xds.LBBands every rule sets simple LEAST_REQUEST beside
// distribute, unless the user's rule sets its own simple, which wins and is reported; a user's
// consistentHash stays a conflict; other policies add no simple.
func TestDestinationRulesBands(t *testing.T) {
	t.Parallel()
	p := planShop(t)
	simple := func(s networking.LoadBalancerSettings_SimpleLB) func(*networking.DestinationRule) {
		return func(d *networking.DestinationRule) {
			d.TrafficPolicy.LoadBalancer = &networking.LoadBalancerSettings{LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: s}}
		}
	}
	tests := []struct {
		name   string
		lb     xds.LBPolicy
		user   []*clientnetworkingv1.DestinationRule
		want   networking.LoadBalancerSettings_SimpleLB // UNSPECIFIED: no simple
		userLB string
	}{
		{"bands, no user rule", xds.LBBands, nil, networking.LoadBalancerSettings_LEAST_REQUEST, ""},
		{"bands, user rule without simple", xds.LBBands, []*clientnetworkingv1.DestinationRule{userRule("front", "mine", "api.shop.svc.cluster.local", nil)},
			networking.LoadBalancerSettings_LEAST_REQUEST, ""},
		{"bands, user's simple wins", xds.LBBands, []*clientnetworkingv1.DestinationRule{userRule("front", "mine", "api.shop.svc.cluster.local", simple(networking.LoadBalancerSettings_ROUND_ROBIN))},
			networking.LoadBalancerSettings_ROUND_ROBIN, "ROUND_ROBIN"},
		{"round-robin adds none", xds.LBRoundRobin, nil, networking.LoadBalancerSettings_UNSPECIFIED, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules, rep := DestinationRules(RulesConfig{LBPolicy: tt.lb}, p, tt.user)
			if len(rules) != 1 {
				t.Fatalf("%d rules: %+v", len(rules), rep.Edges)
			}
			lb := rules[0].Spec.GetTrafficPolicy().GetLoadBalancer()
			if lb.GetSimple() != tt.want || len(lb.GetLocalityLbSetting().GetDistribute()) == 0 {
				t.Errorf("loadBalancer %v, want simple %v and distribute", lb, tt.want)
			}
			var e EdgeStatus
			for _, x := range rep.Edges {
				if x.Rule != "" {
					e = x
				}
			}
			if e.UserLB != tt.userLB {
				t.Errorf("UserLB %q, want %q", e.UserLB, tt.userLB)
			}
			out, err := MarshalRulesYAML(rules, rep)
			if err != nil {
				t.Fatal(err)
			}
			if note := "the user's simple ROUND_ROBIN kept"; strings.Contains(string(out), note) != (tt.userLB != "") {
				t.Errorf("YAML report %q: note %q present %v, want %v", out, note, !(tt.userLB != ""), tt.userLB != "")
			}
		})
	}
	t.Run("bands, user's consistentHash is a conflict", func(t *testing.T) {
		user := userRule("front", "mine", "api.shop.svc.cluster.local", func(s *networking.DestinationRule) {
			s.TrafficPolicy.LoadBalancer = &networking.LoadBalancerSettings{LbPolicy: &networking.LoadBalancerSettings_ConsistentHash{
				ConsistentHash: &networking.LoadBalancerSettings_ConsistentHashLB{}}}
		})
		rules, rep := DestinationRules(RulesConfig{LBPolicy: xds.LBBands}, p, []*clientnetworkingv1.DestinationRule{user})
		if len(rules) != 0 || !rep.Edges[0].Conflict || !strings.Contains(rep.Edges[0].Skipped, "consistent hashing") {
			t.Errorf("rules %d, edge %+v: want no rule, a conflict naming consistent hashing", len(rules), rep.Edges[0])
		}
	})
}

// TestDestinationRulesPooled: with xds.LBBands, an edge into a service the plan pools
// (optimizer.Allocation.Pooled) gets a rule that turns locality load balancing off (enabled
// false, no distribute: least-request over every endpoint) and says so in the report; without
// bands, or for a service not pooled, the distribute weights stay.
func TestDestinationRulesPooled(t *testing.T) {
	t.Parallel()
	p := planShop(t)
	var callee string // the callee of the edge that gets a rule
	_, rep := DestinationRules(RulesConfig{LBPolicy: xds.LBBands}, p, nil)
	for _, e := range rep.Edges {
		if e.Rule != "" {
			callee = e.Callee
		}
	}
	pooled := *p
	alloc := *p.Allocation
	alloc.Pooled = []string{callee}
	pooled.Allocation = &alloc
	for _, tt := range []struct {
		name       string
		lb         xds.LBPolicy
		plan       *LocalityPlan
		wantPooled bool
	}{
		{"bands, pooled", xds.LBBands, &pooled, true},
		{"bands, not pooled", xds.LBBands, p, false},
		{"round-robin ignores pooling", xds.LBRoundRobin, &pooled, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rules, rep := DestinationRules(RulesConfig{LBPolicy: tt.lb}, tt.plan, nil)
			if len(rules) != 1 {
				t.Fatalf("%d rules: %+v", len(rules), rep.Edges)
			}
			lb := rules[0].Spec.GetTrafficPolicy().GetLoadBalancer()
			set := lb.GetLocalityLbSetting()
			if tt.wantPooled {
				if set.GetEnabled() == nil || set.GetEnabled().GetValue() || len(set.GetDistribute()) > 0 || lb.GetSimple() != networking.LoadBalancerSettings_LEAST_REQUEST {
					t.Errorf("loadBalancer %v: want localityLbSetting enabled false without distribute, simple LEAST_REQUEST", lb)
				}
			} else if !set.GetEnabled().GetValue() || len(set.GetDistribute()) == 0 {
				t.Errorf("loadBalancer %v: want the distribute weights", lb)
			}
			var pooledEdges int
			for _, e := range rep.Edges {
				if e.Pooled {
					pooledEdges++
				}
			}
			if (pooledEdges == 1) != tt.wantPooled {
				t.Errorf("%d edges reported pooled, want pooled %v", pooledEdges, tt.wantPooled)
			}
			out, err := MarshalRulesYAML(rules, rep)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(string(out), "pooled near saturation"); got != tt.wantPooled {
				t.Errorf("YAML report says pooled %v, want %v:\n%s", got, tt.wantPooled, out)
			}
		})
	}
}

// TestRulesReadFromTheirNamespacesOnly: a pass reads the DestinationRules of the callers',
// callees' and root namespaces only, and edgeflow's own. Under Run, through an informer: after
// its first LIST and WATCH, no pass sends a LIST (the user's rule in the callee's namespace is
// still carried over, read from the cache); without Run (Reconcile), LISTs of those namespaces
// and one of edgeflow's rules by label, never one of every rule in the cluster. Before, every
// pass listed every rule in the cluster.
func TestRulesReadFromTheirNamespacesOnly(t *testing.T) {
	t.Parallel()
	unrelated := userRule("other", "everything", "*", nil) // matches every host; never in scope
	type listed struct{ ns, selector string }
	lists := func(client *istiofake.Clientset) (out []listed) {
		for _, a := range client.Actions() {
			if l, ok := a.(k8stesting.ListAction); ok && a.GetResource().Resource == "destinationrules" {
				out = append(out, listed{a.GetNamespace(), l.GetListRestrictions().Labels.String()})
			}
		}
		return out
	}

	t.Run("Run", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		client := istiofake.NewSimpleClientset(userRule("shop", "api", "api", nil), unrelated)
		r, err := NewRulesReconciler(RulesReconcilerConfig{Client: listThenWatch{client}})
		if err != nil {
			t.Fatal(err)
		}
		passed := make(chan bool, 4)
		r.passes.passed = func(ok bool) { passed <- ok }
		r.Update(shopTopology())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		if !<-passed {
			t.Fatal("the first pass had nothing to do")
		}
		if got, want := lists(client), []listed{{"", ""}}; !slices.Equal(got, want) {
			t.Errorf("LISTs by the first pass %v, want only the informer's %v", got, want)
		}
		ours, err := client.NetworkingV1().DestinationRules("front").Get(ctx, "edgeflow.web.api.shop", metav1.GetOptions{})
		if err != nil || ours.Annotations[BasedOnAnnotation] != "shop/api" {
			t.Fatalf("the rule was not written from the user's, read from the informer: %v %v", ours, err)
		}
		client.ClearActions()
		for range 3 {
			r.Update(shopTopology())
			if !<-passed {
				t.Fatal("a pass had nothing to do")
			}
		}
		for _, a := range client.Actions() {
			if a.GetVerb() == "list" || a.GetVerb() == "watch" {
				t.Errorf("a pass after the informer synced sent %s %s in %q", a.GetVerb(), a.GetResource().Resource, a.GetNamespace())
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v", err)
		}
	})

	t.Run("Reconcile", func(t *testing.T) {
		t.Parallel()
		client := istiofake.NewSimpleClientset(userRule("shop", "api", "api", nil), unrelated)
		r, err := NewRulesReconciler(RulesReconcilerConfig{Client: client})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Reconcile(context.Background(), planShop(t)); err != nil {
			t.Fatal(err)
		}
		got := lists(client)
		slices.SortFunc(got, func(a, b listed) int { return strings.Compare(a.ns+a.selector, b.ns+b.selector) })
		want := []listed{{"", ManagedByLabel + "=" + ManagedByValue}, {"front", ""}, {"istio-system", ""}, {"shop", ""}}
		if !slices.Equal(got, want) {
			t.Errorf("LISTs %v, want %v (the caller's, callee's and root namespaces, and edgeflow's rules)", got, want)
		}
	})
}

// listThenWatch is Istio's fake clientset telling client-go's reflector that it cannot stream
// a watch's initial list (client-go's own fake clientset says so; Istio's v1.32 does not, and
// its tracker never sends the bookmark a streamed list ends with): the informer lists, then
// watches, as with an API server without WatchList.
type listThenWatch struct{ *istiofake.Clientset }

func (listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }
