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
// a verb on a resource, what calls it, and the values that grant it.
type permission struct {
	group, resource string
	verbs           []string
	scope           string // "cluster", "release namespace", "istio namespace", or "watched namespaces"
	feature         string // when the chart grants it
	why             string // the call in the code
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

// permissions is the table; on says whether a row is granted with the features f.
var permissions = []struct {
	permission
	on func(f features) bool
}{
	{permission{"", "nodes", []string{"list", "watch"}, "cluster", "always", "watcher/kube and rebalancer node informers (allocatable cpu and memory, localities)"},
		func(features) bool { return true }},
	{permission{"", "pods", []string{"list", "watch"}, "cluster, or watched namespaces", "always", "watcher/kube pod informer (endpoints' pods, owners, sidecar label); the rebalancer's pod informer is cluster-wide"},
		func(features) bool { return true }},
	{permission{"", "services", []string{"list", "watch"}, "cluster, or watched namespaces", "always", "watcher/kube and rebalancer service informers (managed Services)"},
		func(features) bool { return true }},
	{permission{"discovery.k8s.io", "endpointslices", []string{"list", "watch"}, "cluster, or watched namespaces", "always", "watcher/kube EndpointSlice informer (ready endpoints)"},
		func(features) bool { return true }},
	{permission{"", "configmaps", []string{"get"}, "release namespace", "rebalancer.mode dry-run or act", "rebalancer/state.go reads the state ConfigMap LEASE-NAME-state (cool-downs, moves in flight)"},
		func(f features) bool { return f.rebalance }},
	{permission{"", "configmaps", []string{"create", "update"}, "release namespace", "rebalancer.mode act", "rebalancer/state.go writes the state before every eviction"},
		func(f features) bool { return f.act }},
	{permission{"coordination.k8s.io", "leases", []string{"get", "create", "update"}, "release namespace", "rebalancer.mode act, or istio.mode destinationrule or envoyfilter", "internal/leader (client-go leaderelection's LeaseLock): only the rebalancer's Lease holder acts, only the Istio Lease's holder writes Istio's objects"},
		func(f features) bool { return f.act || f.dr || f.ef }},
	{permission{"", "pods", []string{"patch", "delete"}, "cluster", "rebalancer.mode act", "rebalancer/gates.go: one JSON PATCH lifts the placement gate; a replacement unscheduled past --placement-timeout is deleted once"},
		func(f features) bool { return f.act }},
	{permission{"", "pods/eviction", []string{"create"}, "cluster", "rebalancer.mode act", "rebalancer/run.go evicts through the Eviction API (PodDisruptionBudgets hold)"},
		func(f features) bool { return f.act }},
	{permission{"events.k8s.io", "events", []string{"create", "patch"}, "cluster", "rebalancer.mode act", "client-go's events broadcaster: Rebalance, Placed, NotPlaced, PlacementFailed (patch for a repeated event)"},
		func(f features) bool { return f.act }},
	{permission{"networking.istio.io", "destinationrules", []string{"list", "create", "update", "delete"}, "cluster", "istio.mode destinationrule", "xds/istio/rules.go: reads every rule (the user's are carried over), writes edgeflow's"},
		func(f features) bool { return f.dr }},
	{permission{"", "nodes", []string{"patch"}, "cluster", "istio.labelNodes", "xds/istio/rules.go sets topology.istio.io/subzone"},
		func(f features) bool { return f.labelNodes }},
	{permission{"networking.istio.io", "envoyfilters", []string{"list", "create", "update", "delete"}, "istio namespace", "istio.mode envoyfilter", "xds/istio/reconciler.go: one EnvoyFilter per managed service"},
		func(f features) bool { return f.ef }},
	{permission{"", "configmaps", []string{"list", "create", "update", "delete"}, "cluster", "istio.mode envoyfilter", "xds/istio/reconciler.go: the edgeflow-bootstrap ConfigMap in every namespace with a managed service"},
		func(f features) bool { return f.ef }},
}

// grant is one flattened rule: group/resource verb.
func grant(group, resource, verb string) string { return group + "/" + resource + " " + verb }

// granted flattens the rules of every ClusterRole and Role rendered for edgeflow serve (the
// cleanup hooks' own are not: see hookGranted).
func granted(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	set := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" || isHook(o) {
			continue
		}
		var r rbacv1.ClusterRole
		convert(t, o, &r)
		for _, g := range flatten(r.Rules) {
			set[g] = true
		}
	}
	return sortedSet(set)
}

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

// expected is the table's grants for the features f.
func expected(f features) []string {
	set := map[string]bool{}
	for _, p := range permissions {
		if p.on(f) {
			for _, v := range p.verbs {
				set[grant(p.group, p.resource, v)] = true
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
	b.WriteString("| resource | verbs | scope | granted when | why (the call) |\n|---|---|---|---|---|\n")
	for _, p := range permissions {
		res := p.resource
		if p.group != "" {
			res = p.resource + "." + p.group
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", res, strings.Join(p.verbs, ", "), p.scope, p.feature, p.why)
	}
	return b.String()
}
