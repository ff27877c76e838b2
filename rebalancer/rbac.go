package rebalancer

import rbacv1 "k8s.io/api/rbac/v1"

// PolicyRules are the permissions the acting rebalancer (--dry-run=false) needs, each from a
// call it makes: its informers list and watch pods and nodes cluster-wide and services (in
// Config.Namespaces, else everywhere); it evicts through pods/eviction; it patches a gated
// pod to lift the gate and deletes a replacement stuck past the placement timeout; it records
// events.k8s.io events (the broadcaster creates one, and patches a repeated one); it
// gets, creates and updates its state ConfigMap and its leader-election Lease (both in the
// Lease's namespace). Pods are never read one by one (the informer's cache is), nor created or
// updated. The create rules are needed only where the state ConfigMap and the Lease do not
// exist yet: install/helm/edgeflow creates both itself and grants these rules less those two
// creates for rebalancer.mode=act, the ConfigMap and Lease rules on their names only
// (resourceNames, in a Role of the release namespace) and the pod, eviction and event rules in
// the watched namespaces when it has them; its install test checks that. The Lease rule is
// also granted with an Istio mode: serve elects the one replica that writes Istio's objects on
// a Lease of its own (internal/leader), in the same namespace.
func PolicyRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch", "patch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"nodes", "services"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}
