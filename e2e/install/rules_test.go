package install

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// permission is one row of the chart's permission table (docs/security.md lists the same rows):
// a verb on a resource, the names it is limited to, where, what calls it, and the values that
// grant it.
type permission struct {
	group, resource string
	verbs           []string
	names           []string // resourceNames as rendered with the default values (nil: any name)
	namesDoc        string   // the names as the table shows them (which values they follow)
	scope           string   // the table's words for scopes
	feature         string   // when the chart grants it
	why             string   // the call in the code
}

// features are the chart's switches that change its RBAC.
type features struct {
	rebalance  bool // rebalancer.mode dry-run or act
	act        bool // rebalancer.mode act
	dr         bool // istio.mode destinationrule
	labelNodes bool // istio.labelNodes
	ef         bool // istio.mode envoyfilter
	namespaced bool // watch.namespaces given
}

// The scopes a rule is granted in: a ClusterRole's (cluster), or a Role's in the release
// namespace, in istio.namespace, or in each watched namespace.
const (
	scopeCluster = "cluster"
	scopeRelease = "release"
	scopeIstio   = "istio"
	scopeWatched = "watched"
)

func inCluster(features) []string { return []string{scopeCluster} }
func inRelease(features) []string { return []string{scopeRelease} }
func inIstio(features) []string   { return []string{scopeIstio} }

// inWatched: Roles in the watched namespaces when the chart has them, else the ClusterRole.
func inWatched(f features) []string {
	if f.namespaced {
		return []string{scopeWatched}
	}
	return []string{scopeCluster}
}

// The names the chart's rules are limited to, with the default values.
const (
	stateName     = "edgeflow-rebalancer-state" // rebalancer.leaseName + "-state"
	rebalancerTag = "edgeflow-rebalancer"       // rebalancer.leaseName
	istioLease    = "edgeflow-istio"            // istio.leaseName
	bootstrapName = "edgeflow-bootstrap"        // xds/istio.BootstrapConfigMapName
)

// permissions is the table; on says whether a row is granted with the features f, scopes where.
var permissions = []struct {
	permission
	on     func(f features) bool
	scopes func(f features) []string
}{
	{permission{"", "nodes", []string{"list", "watch"}, nil, "", "cluster", "always", "watcher/kube and rebalancer node informers (allocatable cpu and memory, localities)"},
		func(features) bool { return true }, inCluster},
	{permission{"", "pods", []string{"list", "watch"}, nil, "", "watched namespaces, or cluster; cluster whenever the rebalancer runs", "always", "watcher/kube pod informer (endpoints' pods, owners, sidecar label); the rebalancer's pod informer is cluster-wide (node usage), and the watcher shares it"},
		func(features) bool { return true }, func(f features) []string {
			if f.rebalance {
				return []string{scopeCluster}
			}
			return inWatched(f)
		}},
	{permission{"", "services", []string{"list", "watch"}, nil, "", "watched namespaces, or cluster", "always", "watcher/kube and rebalancer service informers (managed Services)"},
		func(features) bool { return true }, inWatched},
	{permission{"discovery.k8s.io", "endpointslices", []string{"list", "watch"}, nil, "", "watched namespaces, or cluster", "always", "watcher/kube EndpointSlice informer (ready endpoints)"},
		func(features) bool { return true }, inWatched},
	{permission{"", "configmaps", []string{"get"}, []string{stateName}, "`edgeflow-rebalancer-state` (rebalancer.leaseName-state)", "release namespace", "rebalancer.mode dry-run or act", "rebalancer/state.go reads the state ConfigMap (cool-downs, moves in flight)"},
		func(f features) bool { return f.rebalance }, inRelease},
	{permission{"", "configmaps", []string{"update"}, []string{stateName}, "`edgeflow-rebalancer-state` (rebalancer.leaseName-state)", "release namespace", "rebalancer.mode act", "rebalancer/state.go writes the state before every eviction, into the ConfigMap the chart creates (no create)"},
		func(f features) bool { return f.act }, inRelease},
	{permission{"coordination.k8s.io", "leases", []string{"get", "update"}, []string{rebalancerTag}, "`edgeflow-rebalancer` (rebalancer.leaseName)", "release namespace", "rebalancer.mode act", "internal/leader (client-go leaderelection's LeaseLock gets and updates the Lease; it creates one only when missing, and the chart creates it): only the holder acts"},
		func(f features) bool { return f.act }, inRelease},
	{permission{"coordination.k8s.io", "leases", []string{"get", "update"}, []string{istioLease}, "`edgeflow-istio` (istio.leaseName)", "release namespace", "istio.mode destinationrule or envoyfilter", "internal/leader, as above: only the holder writes Istio's objects"},
		func(f features) bool { return f.dr || f.ef }, inRelease},
	{permission{"", "pods", []string{"patch", "delete"}, nil, "", "watched namespaces, or cluster", "rebalancer.mode act", "rebalancer/gates.go: one JSON PATCH lifts the placement gate; a replacement unscheduled past --placement-timeout is deleted once (the admission policy limits both)"},
		func(f features) bool { return f.act }, inWatched},
	{permission{"", "pods/eviction", []string{"create"}, nil, "", "watched namespaces, or cluster", "rebalancer.mode act", "rebalancer/run.go evicts through the Eviction API (PodDisruptionBudgets hold)"},
		func(f features) bool { return f.act }, inWatched},
	{permission{"events.k8s.io", "events", []string{"create", "patch"}, nil, "", "watched namespaces, or cluster", "rebalancer.mode act", "client-go's events broadcaster, in the moved pod's namespace: Rebalance, Placed, NotPlaced, PlacementFailed (patch for a repeated event)"},
		func(f features) bool { return f.act }, inWatched},
	{permission{"networking.istio.io", "destinationrules", []string{"get", "list", "watch", "create", "update", "delete"}, nil, "", "cluster", "istio.mode destinationrule", "xds/istio/rules.go: an informer of every rule, read per pass only in the callers', callees' and root namespaces (the user's are carried over) and for edgeflow's own; get when a create finds edgeflow's rule not yet in its cache; writes edgeflow's (the admission policy: only `edgeflow.*` with a workload selector)"},
		func(f features) bool { return f.dr }, inCluster},
	{permission{"", "nodes", []string{"patch"}, nil, "", "cluster", "istio.labelNodes", "xds/istio/rules.go sets topology.istio.io/subzone (the admission policy: that label only)"},
		func(f features) bool { return f.labelNodes }, inCluster},
	{permission{"networking.istio.io", "envoyfilters", []string{"list", "create", "update", "delete"}, nil, "", "istio namespace", "istio.mode envoyfilter", "xds/istio/reconciler.go: one EnvoyFilter per namespace holding managed services (edgeflow-eds.NAMESPACE)"},
		func(f features) bool { return f.ef }, inIstio},
	{permission{"", "configmaps", []string{"list", "update", "delete"}, []string{bootstrapName}, "`edgeflow-bootstrap`", "cluster", "istio.mode envoyfilter", "xds/istio/reconciler.go: the bootstrap ConfigMap in every namespace with a managed service (listed in all namespaces with a metadata.name field selector)"},
		func(f features) bool { return f.ef }, inCluster},
	{permission{"", "configmaps", []string{"create"}, nil, "", "watched namespaces, or cluster", "istio.mode envoyfilter", "xds/istio/reconciler.go creates the bootstrap ConfigMap where it is missing (RBAC cannot limit a create by name: the admission policy allows `edgeflow-bootstrap` only)"},
		func(f features) bool { return f.ef }, inWatched},
}

// grant is one flattened rule: group/resource verb.
func grant(group, resource, verb string) string { return group + "/" + resource + " " + verb }

// scopedGrant is one flattened rule with where it holds and the one name it is limited to
// ("*": any): "group/resource verb @scope name".
func scopedGrant(group, resource, verb, scope, name string) string {
	if name == "" {
		name = "*"
	}
	return grant(group, resource, verb) + " @" + scope + " " + name
}

// call is one request: what the audit log records, what a SubjectAccessReview asks.
type call struct {
	group, resource, verb, namespace, name string
}

// covers says whether the scoped grant g allows c, edgeflow's Roles being in the watched
// namespaces, the release namespace and istio-system.
func covers(g string, c call, watched []string) bool {
	i := strings.LastIndex(g, " @")
	if g[:i] != grant(c.group, c.resource, c.verb) {
		return false
	}
	scope, name, _ := strings.Cut(g[i+2:], " ")
	switch scope {
	case scopeRelease:
		if c.namespace != namespace {
			return false
		}
	case scopeIstio:
		if c.namespace != "istio-system" {
			return false
		}
	case scopeWatched:
		if c.namespace == "" || !slices.Contains(watched, c.namespace) {
			return false
		}
	}
	return name == "*" || name == c.name
}

// allowedBy says whether any of grants covers c.
func allowedBy(grants []string, c call, watched []string) bool {
	return slices.ContainsFunc(grants, func(g string) bool { return covers(g, c, watched) })
}

// granted flattens the rules of every ClusterRole (cluster) and Role (release namespace,
// istio-system, or a watched namespace) rendered for edgeflow serve, one entry per name a rule
// is limited to (the cleanup hooks' own are not: see hookGranted).
func granted(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	set := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" || isHook(o) {
			continue
		}
		scope := scopeCluster
		switch {
		case o.GetKind() == "ClusterRole":
		case o.GetNamespace() == namespace:
			scope = scopeRelease
		case o.GetNamespace() == "istio-system":
			scope = scopeIstio
		default:
			scope = scopeWatched
		}
		var r rbacv1.ClusterRole
		convert(t, o, &r)
		for _, rule := range r.Rules {
			names := rule.ResourceNames
			if len(names) == 0 {
				names = []string{""}
			}
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					for _, v := range rule.Verbs {
						for _, n := range names {
							set[scopedGrant(g, res, v, scope, n)] = true
						}
					}
				}
			}
		}
	}
	return sortedSet(set)
}

// flatten flattens rules to group/resource verb (names and scope aside).
func flatten(rules []rbacv1.PolicyRule) []string {
	set := map[string]bool{}
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					set[grant(g, res, v)] = true
				}
			}
		}
	}
	return sortedSet(set)
}

// unscoped is grants without their scopes and names.
func unscoped(grants []string) []string {
	set := map[string]bool{}
	for _, g := range grants {
		set[g[:strings.LastIndex(g, " @")]] = true
	}
	return sortedSet(set)
}

// expected is the table's grants for the features f.
func expected(f features) []string {
	set := map[string]bool{}
	for _, p := range permissions {
		if !p.on(f) {
			continue
		}
		names := p.names
		if len(names) == 0 {
			names = []string{""}
		}
		for _, scope := range p.scopes(f) {
			for _, v := range p.verbs {
				for _, n := range names {
					set[scopedGrant(p.group, p.resource, v, scope, n)] = true
				}
			}
		}
	}
	return sortedSet(set)
}

func sortedSet(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// permissionTable prints the table as Markdown (docs/security.md's; TestPermissionTable logs it).
func permissionTable() string {
	var b strings.Builder
	b.WriteString("| resource | verbs | names | scope | granted when | why (the call) |\n|---|---|---|---|---|---|\n")
	for _, p := range permissions {
		res := p.resource
		if p.group != "" {
			res = p.resource + "." + p.group
		}
		names := p.namesDoc
		if names == "" {
			names = "any"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", res, strings.Join(p.verbs, ", "), names, p.scope, p.feature, p.why)
	}
	return b.String()
}
