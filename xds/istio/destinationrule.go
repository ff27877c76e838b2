package istio

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	typev1beta1 "istio.io/api/type/v1beta1"
	clientnetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// The default Istio mode: the plan as stock Istio DestinationRules, no EnvoyFilter.
//
// Istio turns a DestinationRule's trafficPolicy.loadBalancer.localityLbSetting.distribute into
// per-proxy locality weights (pilot/pkg/networking/core/loadbalancer: applyLocalityWeights):
// the first `from` that matches the proxy's locality wins, each `to` locality's endpoints get
// its weight, and the endpoints of a locality no `to` names are removed. A DestinationRule
// with a workloadSelector in the caller's namespace applies to that caller's sidecars only,
// and wins over every rule without one (pilot/pkg/model/sidecar.go: DestinationRule). Since
// Istio 1.24 `distribute` alone sets locality_weighted_lb_config (no outlier detection
// needed). Istio's validation wants integer weights in [1, 100] summing to exactly 100 per
// `from`, and localities with a region (and a zone before a subzone).

// Annotations on the DestinationRules edgeflow writes.
const (
	// CallerAnnotation and CalleeAnnotation name the call edge a rule carries
	// (SERVICE.NAMESPACE).
	CallerAnnotation = "edgeflow.io/caller"
	CalleeAnnotation = "edgeflow.io/callee"
	// BasedOnAnnotation names the user's DestinationRule (NAMESPACE/NAME) whose traffic policy
	// and subsets the rule carries, when there is one.
	BasedOnAnnotation = "edgeflow.io/based-on"

	// DistributeTotal is what each `from` entry's weights sum to (Istio's validation).
	DistributeTotal = 100
	// DefaultRootNamespace is Istio's default root (config) namespace.
	DefaultRootNamespace = "istio-system"
	// ruleNamePrefix starts every DestinationRule name edgeflow writes.
	ruleNamePrefix = "edgeflow."
)

// RulesConfig says how DestinationRules are written.
type RulesConfig struct {
	// ClusterDomain is the cluster's DNS domain (hosts are NAME.NAMESPACE.svc.DOMAIN); "" means
	// optimizer.DefaultClusterDomain.
	ClusterDomain string
	// RootNamespace is Istio's root namespace, whose exported rules apply mesh-wide; "" means
	// DefaultRootNamespace.
	RootNamespace string
	// LBPolicy is how the sidecars pick an endpoint inside a locality. With xds.LBBands every
	// rule also sets trafficPolicy.loadBalancer.simple LEAST_REQUEST (distribute weighs the
	// localities, least-request picks inside one), unless the user's rule it is based on sets
	// its own simple, which is kept and reported (EdgeStatus.UserLB). Other values leave
	// simple to the user's rule, or to Istio's default (also LEAST_REQUEST).
	LBPolicy xds.LBPolicy
	// DefaultExportTo is the mesh's defaultDestinationRuleExportTo (MeshConfig): how a rule
	// without exportTo is exported. Istio honours only "." in it (such a rule is private to its
	// namespace); nil, "*" or any other value leave it exported everywhere (see exportedTo).
	DefaultExportTo []string
}

func (c RulesConfig) domain() string { return cmp.Or(c.ClusterDomain, optimizer.DefaultClusterDomain) }
func (c RulesConfig) root() string   { return cmp.Or(c.RootNamespace, DefaultRootNamespace) }

// Host is the FQDN of service s in the mesh: NAME.NAMESPACE.svc.DOMAIN.
func (c RulesConfig) Host(s *optimizer.Service) string {
	return s.FQDN(c.domain())
}

// LocalityPlan is a plan made at the granularity the mesh can express: the grouped topology
// (optimizer.GroupByLocality), how it was grouped, and the allocation of the grouped topology.
type LocalityPlan struct {
	// Topology is the per-pod topology the plan was made from (services' namespaces and
	// selectors).
	Topology   *optimizer.Topology
	Grouping   *optimizer.LocalityGrouping
	Grouped    *optimizer.Topology
	Allocation *optimizer.Allocation
}

// PlanLocalities groups t by locality and plans the grouped topology with policy.
func PlanLocalities(t *optimizer.Topology, policy optimizer.Policy, opts optimizer.Options) (*LocalityPlan, error) {
	grouped, g, err := optimizer.GroupByLocality(t, opts)
	if err != nil {
		return nil, err
	}
	m, err := optimizer.Compile(grouped, optimizer.Options{UtilizationCap: opts.UtilizationCap, MinBandShare: opts.MinBandShare})
	if err != nil {
		return nil, err
	}
	a, err := optimizer.Plan(m, policy)
	if err != nil {
		return nil, err
	}
	return &LocalityPlan{Topology: t, Grouping: g, Grouped: grouped, Allocation: a}, nil
}

// EdgeStatus says what became of one call edge in DestinationRules.
type EdgeStatus struct {
	// Caller and Callee are the services' keys.
	Caller, Callee string
	// Rule is the DestinationRule written for the edge (NAMESPACE/NAME); "" when none.
	Rule string
	// BasedOn is the user's rule whose policy and subsets Rule carries (NAMESPACE/NAME).
	BasedOn string
	// Skipped says why no rule was written ("" when one was): the edge is then left to Istio's
	// defaults or to the user's own rule.
	Skipped string
	// Conflict says the user's rule could not be merged (Skipped then says so too).
	Conflict bool
	// UserLB is the user's own trafficPolicy.loadBalancer.simple (e.g. "ROUND_ROBIN"), kept in
	// Rule instead of the LEAST_REQUEST that RulesConfig.LBPolicy xds.LBBands would set; ""
	// when there is none or the policy is another.
	UserLB string
	// MaxDeviation is the largest difference, in weight points (of 100), between a written
	// weight and the plan's share of that caller locality's traffic (rounding to integers and
	// the floor of 1 for every locality holding a callee pod).
	MaxDeviation float64
	// Deviation is the fraction of the edge's planned traffic the written weights send
	// elsewhere (½ Σ |written − planned| per caller locality, weighted by its rps).
	Deviation float64
	// Pooled says the plan pools the callee (optimizer.Allocation.Pooled, with
	// RulesConfig.LBPolicy xds.LBBands): Rule turns locality load balancing off and balances
	// least-request over all its endpoints; it has no distribute weights.
	Pooled bool
}

// RulesReport is what DestinationRules did, edge by edge.
type RulesReport struct {
	Granularity string // "node" or "locality" (optimizer.LocalityGrouping.Granularity)
	Localities  int    // number of locality groups
	Unlocated   []string
	Edges       []EdgeStatus
}

// Written counts the edges that got a rule.
func (r *RulesReport) Written() int {
	n := 0
	for _, e := range r.Edges {
		if e.Rule != "" {
			n++
		}
	}
	return n
}

// DestinationRules returns the DestinationRules that make Istio's sidecars follow p, one per
// call edge (caller service → callee host), sorted by namespace and name, and what became of
// every edge. user are the DestinationRules in the cluster that edgeflow does not own (those
// with ManagedByLabel are ignored); for each edge, the user's rule that Istio would apply to
// the caller's sidecars without edgeflow (userRuleFor) has its traffic policy and subsets
// carried into the generated rule, which adds only
// trafficPolicy.loadBalancer.localityLbSetting (and, with cfg.LBPolicy xds.LBBands, simple
// LEAST_REQUEST where the user's rule sets no simple of its own). An edge is skipped, with the reason, when:
//
//   - the caller has no pod selector (its sidecars cannot be selected), or no pod in a locality;
//   - a callee pod is on a node without a locality (a rule listing localities would cut it
//     off), or the callee's pods are all in one locality (nothing to steer);
//   - the callee is in more than DistributeTotal localities (weights ≥ 1 cannot sum to 100);
//   - the user's rule sets its own locality or zone-aware load balancing, consistent hashing,
//     a port-level load balancer, or a workload selector matching the caller (a conflict:
//     the user's rule stays in force).
//
// Every locality holding a callee pod gets weight ≥ 1, so no caller is cut off from a ready
// pod. Weights are the plan's shares of the caller locality's traffic, rounded to integers
// summing to DistributeTotal by largest remainder after the floor of 1. It is pure and
// deterministic.
func DestinationRules(cfg RulesConfig, p *LocalityPlan, user []*clientnetworkingv1.DestinationRule) ([]*clientnetworkingv1.DestinationRule, *RulesReport) {
	rep := &RulesReport{Granularity: p.Grouping.Granularity(), Localities: len(p.Grouping.Groups), Unlocated: p.Grouping.Unlocated}
	services := map[string]*optimizer.Service{}
	for i := range p.Topology.Services {
		s := &p.Topology.Services[i]
		services[s.Key()] = s
	}
	// Grouped pods' keys → locality; per service, its localities.
	podLocality := map[string]string{}
	localities := map[string][]string{}
	for i := range p.Grouped.Services {
		s := &p.Grouped.Services[i]
		for j := range s.Pods {
			podLocality[s.PodKey(&s.Pods[j])] = s.Pods[j].Node
			localities[s.Key()] = append(localities[s.Key()], s.Pods[j].Node)
		}
	}
	var out []*clientnetworkingv1.DestinationRule
	for _, call := range p.Allocation.Calls {
		caller, callee := services[optimizer.CanonicalKey(call.From)], services[optimizer.CanonicalKey(call.To)]
		if caller == nil || callee == nil {
			continue // not in the topology: cannot happen for an allocation of it
		}
		st := EdgeStatus{Caller: caller.Key(), Callee: callee.Key()}
		dr, why := edgeRule(cfg, p, caller, callee, call, podLocality, localities[callee.Key()], user, &st)
		if dr == nil {
			st.Skipped = why
		} else {
			st.Rule = dr.Namespace + "/" + dr.Name
			out = append(out, dr)
		}
		rep.Edges = append(rep.Edges, st)
	}
	slices.SortFunc(out, func(a, b *clientnetworkingv1.DestinationRule) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out, rep
}

// selector is the caller's pod selector: its own, else {app: NAME} when the topology gives
// none (nil).
func selector(s *optimizer.Service) map[string]string {
	if s.Selector == nil {
		return map[string]string{"app": s.Name}
	}
	return s.Selector
}

func edgeRule(cfg RulesConfig, p *LocalityPlan, caller, callee *optimizer.Service, call optimizer.CallAllocation,
	podLocality map[string]string, calleeLocs []string, user []*clientnetworkingv1.DestinationRule, st *EdgeStatus) (*clientnetworkingv1.DestinationRule, string) {
	sel := selector(caller)
	if len(sel) == 0 {
		return nil, "the caller has no pod selector"
	}
	for i := range callee.Pods {
		if p.Grouping.GroupOf(callee.Pods[i].Node) == "" {
			return nil, fmt.Sprintf("callee pod %s is on node %s, which has no locality: a rule listing localities would cut it off", callee.Pods[i].Name, callee.Pods[i].Node)
		}
	}
	switch {
	case len(calleeLocs) < 2:
		return nil, "the callee's pods are in one locality: nothing to steer"
	case len(calleeLocs) > DistributeTotal:
		return nil, fmt.Sprintf("the callee is in %d localities: weights of at least 1 cannot sum to %d", len(calleeLocs), DistributeTotal)
	}
	host := cfg.Host(callee)
	base := userRuleFor(cfg, user, caller, host)
	if base != nil {
		st.BasedOn = base.Namespace + "/" + base.Name
		if why := conflict(&base.Spec, sel); why != "" {
			st.Conflict = true
			return nil, fmt.Sprintf("the user's DestinationRule %s %s; it stays in force", st.BasedOn, why)
		}
	}

	spec := &networking.DestinationRule{Host: host}
	if base != nil {
		spec.TrafficPolicy = proto.Clone(base.Spec.TrafficPolicy).(*networking.TrafficPolicy)
		for _, s := range base.Spec.Subsets {
			spec.Subsets = append(spec.Subsets, proto.Clone(s).(*networking.Subset))
		}
	}
	if spec.TrafficPolicy == nil {
		spec.TrafficPolicy = &networking.TrafficPolicy{}
	}
	if spec.TrafficPolicy.LoadBalancer == nil {
		spec.TrafficPolicy.LoadBalancer = &networking.LoadBalancerSettings{}
	}
	st.Pooled = cfg.LBPolicy == xds.LBBands && slices.ContainsFunc(p.Allocation.Pooled, func(name string) bool {
		return optimizer.CanonicalKey(name) == callee.Key()
	})
	if st.Pooled {
		// Least-request over every endpoint: a DestinationRule's localityLbSetting with
		// enabled false turns locality load balancing off for the host, ahead of the
		// Service's trafficDistribution and the mesh's setting (istio
		// pilot/pkg/networking/core/loadbalancer/loadbalancer.go, GetEffectiveLbSetting:
		// "if localityLbSetting.GetEnabled() != nil && !localityLbSetting.GetEnabled().Value
		// { return nil }").
		spec.TrafficPolicy.LoadBalancer.LocalityLbSetting = &networking.LocalityLoadBalancerSetting{Enabled: wrapperspb.Bool(false)}
	} else {
		distribute, ok := planDistribute(call, podLocality, calleeLocs, st)
		if !ok {
			return nil, "the caller has no pod in a locality"
		}
		spec.TrafficPolicy.LoadBalancer.LocalityLbSetting = &networking.LocalityLoadBalancerSetting{
			Enabled:    wrapperspb.Bool(true),
			Distribute: distribute,
		}
	}
	return finishRule(cfg, caller, callee, sel, base, spec, st), ""
}

// planDistribute is the edge's distribute weights: the plan's shares per caller locality (one
// grouped caller pod per locality), rounded; it records their deviation from the plan in st.
// ok is false when no caller pod is in a locality.
func planDistribute(call optimizer.CallAllocation, podLocality map[string]string, calleeLocs []string, st *EdgeStatus) (_ []*networking.LocalityLoadBalancerSetting_Distribute, ok bool) {
	type fromShares struct {
		rps    float64
		shares map[string]float64
	}
	froms := map[string]*fromShares{}
	for _, r := range call.Routes {
		from, to := podLocality[r.Caller], podLocality[r.Callee]
		f := froms[from]
		if f == nil {
			f = &fromShares{shares: map[string]float64{}}
			froms[from] = f
		}
		f.rps += r.RPS
		f.shares[to] += r.Fraction
	}
	if len(froms) == 0 {
		return nil, false
	}
	var distribute []*networking.LocalityLoadBalancerSetting_Distribute
	var totalRPS, moved float64
	for _, from := range slices.Sorted(maps.Keys(froms)) {
		f := froms[from]
		weights, maxDev, tv := roundWeights(calleeLocs, f.shares)
		st.MaxDeviation = max(st.MaxDeviation, maxDev)
		totalRPS += f.rps
		moved += f.rps * tv
		distribute = append(distribute, &networking.LocalityLoadBalancerSetting_Distribute{From: from, To: weights})
	}
	if totalRPS > 0 {
		st.Deviation = moved / totalRPS
	}
	return distribute, true
}

// finishRule is the rest of edgeRule: the load-balancing policy under xds.LBBands and the
// object around spec.
func finishRule(cfg RulesConfig, caller, callee *optimizer.Service, sel map[string]string, base *clientnetworkingv1.DestinationRule,
	spec *networking.DestinationRule, st *EdgeStatus) *clientnetworkingv1.DestinationRule {
	if cfg.LBPolicy == xds.LBBands {
		// Istio accepts simple beside localityLbSetting (pkg/config/validation/validation.go,
		// validateLoadBalancer: "simple load balancing is always valid") and applies them
		// independently (pilot/pkg/networking/core/cluster_traffic_policy.go, applyLoadBalancer:
		// LocalityLBSettings.ApplyToCluster sets locality_weighted_lb_config for distribute,
		// then simple LEAST_REQUEST sets lb_policy LEAST_REQUEST in
		// applyLeastRequestLoadBalancer). A consistentHash of the user's is a conflict above.
		if sim := spec.TrafficPolicy.LoadBalancer.GetSimple(); sim != networking.LoadBalancerSettings_UNSPECIFIED {
			st.UserLB = sim.String()
		} else {
			spec.TrafficPolicy.LoadBalancer.LbPolicy = &networking.LoadBalancerSettings_Simple{Simple: networking.LoadBalancerSettings_LEAST_REQUEST}
		}
	}
	spec.WorkloadSelector = &typev1beta1.WorkloadSelector{MatchLabels: maps.Clone(sel)}
	dr := &clientnetworkingv1.DestinationRule{
		TypeMeta: metav1.TypeMeta{APIVersion: clientnetworkingv1.SchemeGroupVersion.String(), Kind: "DestinationRule"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      RuleName(caller, callee),
			Namespace: caller.NamespaceOrDefault(),
			Labels:    map[string]string{ManagedByLabel: ManagedByValue},
			Annotations: map[string]string{
				CallerAnnotation: caller.Name + "." + caller.NamespaceOrDefault(),
				CalleeAnnotation: callee.Name + "." + callee.NamespaceOrDefault(),
			},
		},
	}
	if base != nil {
		dr.Annotations[BasedOnAnnotation] = st.BasedOn
	}
	proto.Merge(&dr.Spec, spec) // Spec is a value holding a proto state: fill it by merging
	return dr
}

// RuleName is the DestinationRule of the edge caller → callee: "edgeflow.CALLER.CALLEE.NS"
// (NS the callee's namespace; the rule lives in the caller's), shortened with a hash where
// longer than a Kubernetes object name may be.
func RuleName(caller, callee *optimizer.Service) string {
	name := ruleNamePrefix + caller.Name + "." + callee.Name + "." + callee.NamespaceOrDefault()
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:253-17] + "." + hex.EncodeToString(sum[:8])
}

// roundWeights turns a caller locality's planned shares (locality → fraction, summing to 1)
// into integer weights for every locality of locs: each at least 1, summing to
// DistributeTotal, by largest remainder (ties by locality name). It returns the weights, the
// largest |weight − planned points| and the total variation ½ Σ |weight/100 − share|.
func roundWeights(locs []string, shares map[string]float64) (map[string]uint32, float64, float64) {
	type cand struct {
		loc    string
		target float64
		w      int
	}
	cs := make([]cand, len(locs))
	sum := 0
	for i, l := range locs {
		t := shares[l] * DistributeTotal
		w := max(1, int(math.Floor(t+1e-9)))
		cs[i] = cand{l, t, w}
		sum += w
	}
	byRemainder := func(a, b cand) int { // largest target − weight first
		return cmp.Or(cmp.Compare(b.target-float64(b.w), a.target-float64(a.w)), cmp.Compare(a.loc, b.loc))
	}
	for sum != DistributeTotal {
		slices.SortFunc(cs, byRemainder)
		if sum < DistributeTotal {
			cs[0].w++
			sum++
			continue
		}
		// Over (floors of 1 pushed it up): take from the most over-served weight above 1.
		for i := len(cs) - 1; i >= 0; i-- {
			if cs[i].w > 1 {
				cs[i].w--
				sum--
				break
			}
		}
	}
	out := make(map[string]uint32, len(cs))
	var maxDev, tv float64
	for _, c := range cs {
		out[c.loc] = uint32(c.w)
		d := math.Abs(float64(c.w) - c.target)
		maxDev = max(maxDev, d)
		tv += d / DistributeTotal / 2
	}
	return out, maxDev, tv
}

// conflict says why edgeflow cannot merge its locality weights into the user's rule spec for
// a caller selected by sel ("" when it can).
func conflict(spec *networking.DestinationRule, sel map[string]string) string {
	lb := spec.GetTrafficPolicy().GetLoadBalancer()
	switch {
	case spec.GetWorkloadSelector() != nil:
		return "selects the caller's workload itself"
	case lb.GetLocalityLbSetting() != nil:
		return "sets its own localityLbSetting"
	case lb.GetZoneAwareLbSetting() != nil:
		return "sets zone-aware load balancing"
	case lb.GetConsistentHash() != nil:
		return "uses consistent hashing, which Envoy does not weigh by locality"
	}
	for _, pl := range spec.GetTrafficPolicy().GetPortLevelSettings() {
		if pl.GetLoadBalancer() != nil {
			return fmt.Sprintf("sets a load balancer for port %d, which would replace the rule's", pl.GetPort().GetNumber())
		}
	}
	return ""
}

// userRuleFor returns the user's DestinationRule Istio would apply to the caller's sidecars
// for host, without edgeflow's rule (pilot/pkg/model/push_context.go: destinationRule): the
// most specific host match among the rules in the caller's namespace, else among those of
// the callee's namespace exported to the caller's, else among those of the root namespace
// exported to it. Rules edgeflow owns are ignored, and so are rules with a workload selector
// that does not select the caller; one that does is returned (a conflict). Among rules of one
// host in one namespace the oldest wins, as in Istio; nil when none applies.
func userRuleFor(cfg RulesConfig, user []*clientnetworkingv1.DestinationRule, caller *optimizer.Service, host string) *clientnetworkingv1.DestinationRule {
	callerNS := caller.NamespaceOrDefault()
	_, calleeNS, _ := strings.Cut(strings.TrimSuffix(host, ".svc."+cfg.domain()), ".")
	sel := selector(caller)
	pick := func(ns string, local bool) *clientnetworkingv1.DestinationRule {
		var best *clientnetworkingv1.DestinationRule
		bestLen := -1
		for _, dr := range user {
			if dr.Namespace != ns || dr.Labels[ManagedByLabel] == ManagedByValue {
				continue
			}
			if ws := dr.Spec.GetWorkloadSelector(); ws != nil {
				if !local || !subsetOf(ws.GetMatchLabels(), sel) {
					continue
				}
			}
			if !local && !exportedTo(dr, callerNS, cfg.DefaultExportTo) {
				continue
			}
			n, ok := hostMatch(cfg.fqdn(dr.Spec.Host, dr.Namespace), host)
			if !ok {
				continue
			}
			if n > bestLen || (n == bestLen && older(dr, best)) {
				best, bestLen = dr, n
			}
		}
		return best
	}
	if dr := pick(callerNS, true); dr != nil {
		return dr
	}
	if calleeNS != callerNS {
		if dr := pick(calleeNS, false); dr != nil {
			return dr
		}
	}
	if cfg.root() != callerNS && cfg.root() != calleeNS {
		return pick(cfg.root(), false)
	}
	return nil
}

// fqdn resolves a rule's host as Istio does (ResolveShortnameToFQDN): a name without a dot is
// NAME.NAMESPACE.svc.DOMAIN in the rule's namespace.
func (c RulesConfig) fqdn(h, ns string) string {
	if h == "" || strings.Contains(h, ".") || strings.HasPrefix(h, "*") {
		return h
	}
	return h + "." + ns + ".svc." + c.domain()
}

// hostMatch says whether a rule's host matches host, and how specifically (its length; an
// exact match beats every wildcard).
func hostMatch(rule, host string) (int, bool) {
	switch {
	case rule == host:
		return math.MaxInt, true
	case rule == "*":
		return 0, true
	case strings.HasPrefix(rule, "*") && strings.HasSuffix(host, rule[1:]):
		return len(rule), true
	}
	return 0, false
}

// exportedTo says whether dr (without a workload selector) is visible to namespace ns, another
// namespace than its own, when the mesh's defaultDestinationRuleExportTo is meshDefault. A rule
// without exportTo takes the mesh default, of which Istio honours only "." (private) and "*"
// (exported everywhere; also nil and any other value): istio/istio
// pilot/pkg/model/push_context.go, setDestinationRules ("No exportTo in destinationRule. Use the
// global default. We only honor . and *": isPrivateOnly when the default contains "."), with the
// default from initDefaultExportMaps (nil means "*").
func exportedTo(dr *clientnetworkingv1.DestinationRule, ns string, meshDefault []string) bool {
	exp := dr.Spec.GetExportTo()
	if len(exp) == 0 {
		return !slices.Contains(meshDefault, ".")
	}
	for _, e := range exp {
		if e == "*" || e == ns || (e == "." && dr.Namespace == ns) {
			return true
		}
	}
	return false
}

func older(a, b *clientnetworkingv1.DestinationRule) bool {
	if b == nil {
		return true
	}
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

func subsetOf(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// MarshalRulesYAML renders rules as a multi-document YAML stream (kubectl apply -f), after
// comment lines saying how rep planned: the granularity, and every edge left without a rule
// and why.
func MarshalRulesYAML(rules []*clientnetworkingv1.DestinationRule, rep *RulesReport) ([]byte, error) {
	var out bytes.Buffer
	if rep != nil {
		fmt.Fprintf(&out, "# edgeflow: planned per %s (%d localities)", rep.Granularity, rep.Localities)
		if len(rep.Unlocated) > 0 {
			fmt.Fprintf(&out, "; nodes without a locality, left out: %s", strings.Join(rep.Unlocated, ", "))
		}
		out.WriteString("\n")
		for _, e := range rep.Edges {
			switch {
			case e.Skipped != "":
				fmt.Fprintf(&out, "# %s → %s: no rule: %s\n", e.Caller, e.Callee, e.Skipped)
			case e.Pooled:
				fmt.Fprintf(&out, "# %s → %s: %s, pooled near saturation: locality load balancing off, least-request over all endpoints\n",
					e.Caller, e.Callee, e.Rule)
			default:
				fmt.Fprintf(&out, "# %s → %s: %s, largest rounding deviation %.2f points, %.2f%% of the edge's traffic moved by rounding",
					e.Caller, e.Callee, e.Rule, e.MaxDeviation, 100*e.Deviation)
				if e.UserLB != "" {
					fmt.Fprintf(&out, "; the user's simple %s kept, not LEAST_REQUEST", e.UserLB)
				}
				out.WriteString("\n")
			}
		}
	}
	for i, dr := range rules {
		if err := appendDoc(&out, i > 0, "DestinationRule", dr.TypeMeta, dr.ObjectMeta, &dr.Spec); err != nil {
			return nil, err
		}
	}
	return out.Bytes(), nil
}
