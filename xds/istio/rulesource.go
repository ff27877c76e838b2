package istio

import (
	"context"
	"fmt"
	"slices"
	"strings"

	clientnetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"istio.io/client-go/pkg/clientset/versioned"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/edgeflow/edgeflow/optimizer"
)

// ruleSource is where a pass reads DestinationRules: the user's in the few namespaces an edge
// can take one from (ruleNamespaces), and edgeflow's own wherever they are. The objects are
// read only (an informer's are its cache's).
type ruleSource interface {
	// inNamespace returns the DestinationRules of namespace ns.
	inNamespace(ctx context.Context, ns string) ([]*clientnetworkingv1.DestinationRule, error)
	// owned returns edgeflow's DestinationRules (ownedRule), in every namespace.
	owned(ctx context.Context) ([]*clientnetworkingv1.DestinationRule, error)
}

// ownedRule says whether dr is edgeflow's: its label and its name prefix.
func ownedRule(dr *clientnetworkingv1.DestinationRule) bool {
	return dr.Labels[ManagedByLabel] == ManagedByValue && strings.HasPrefix(dr.Name, ruleNamePrefix)
}

// ruleNamespaces are the namespaces whose rules Istio may apply to p's call edges
// (userRuleFor): every caller's and callee's, and the root namespace; sorted.
func ruleNamespaces(cfg RulesConfig, p *LocalityPlan) []string {
	services := map[string]*optimizer.Service{}
	for i := range p.Topology.Services {
		s := &p.Topology.Services[i]
		services[s.Key()] = s
	}
	set := map[string]bool{cfg.root(): true}
	for _, call := range p.Allocation.Calls {
		for _, name := range []string{call.From, call.To} {
			if s := services[optimizer.CanonicalKey(name)]; s != nil {
				set[s.NamespaceOrDefault()] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for ns := range set {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out
}

// apiRules reads from the API server: one LIST per namespace asked, and one LIST of the rules
// labelled as edgeflow's. It serves Reconcile when no Run (and so no informer) runs.
type apiRules struct{ client versioned.Interface }

func (a apiRules) inNamespace(ctx context.Context, ns string) ([]*clientnetworkingv1.DestinationRule, error) {
	list, err := a.client.NetworkingV1().DestinationRules(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("xds/istio: list DestinationRules in %s: %w", ns, err)
	}
	return list.Items, nil
}

func (a apiRules) owned(ctx context.Context) ([]*clientnetworkingv1.DestinationRule, error) {
	list, err := a.client.NetworkingV1().DestinationRules(metav1.NamespaceAll).List(ctx,
		metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedByValue})
	if err != nil {
		return nil, fmt.Errorf("xds/istio: list edgeflow's DestinationRules: %w", err)
	}
	var out []*clientnetworkingv1.DestinationRule
	for _, dr := range list.Items {
		if ownedRule(dr) {
			out = append(out, dr)
		}
	}
	return out, nil
}

// ownedIndex is the indexer's index of edgeflow's rules (one value, ownedIndexValue).
const (
	ownedIndex      = "edgeflow-owned"
	ownedIndexValue = "owned"
)

// newRuleInformer returns an informer of every DestinationRule (no resync of its own: the pass
// loop resyncs), indexed by namespace (cache.NamespaceIndex) and by ownership (ownedIndex),
// with managed fields stripped from its cache. It starts nothing.
func newRuleInformer(client versioned.Interface) (cache.SharedIndexInformer, error) {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return client.NetworkingV1().DestinationRules(metav1.NamespaceAll).List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return client.NetworkingV1().DestinationRules(metav1.NamespaceAll).Watch(ctx, opts)
		},
	}
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), &clientnetworkingv1.DestinationRule{}, 0, cache.Indexers{
		cache.NamespaceIndex: cache.MetaNamespaceIndexFunc,
		ownedIndex: func(obj any) ([]string, error) {
			if dr, ok := obj.(*clientnetworkingv1.DestinationRule); ok && ownedRule(dr) {
				return []string{ownedIndexValue}, nil
			}
			return nil, nil
		},
	})
	if err := inf.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok && m.GetManagedFields() != nil {
			m.SetManagedFields(nil)
		}
		return obj, nil
	}); err != nil {
		return nil, fmt.Errorf("xds/istio: DestinationRule informer: %w", err)
	}
	return inf, nil
}

// indexedRules reads an informer's indexer: no request to the API server.
type indexedRules struct{ idx cache.Indexer }

func (x indexedRules) inNamespace(_ context.Context, ns string) ([]*clientnetworkingv1.DestinationRule, error) {
	return x.byIndex(cache.NamespaceIndex, ns)
}

func (x indexedRules) owned(context.Context) ([]*clientnetworkingv1.DestinationRule, error) {
	return x.byIndex(ownedIndex, ownedIndexValue)
}

func (x indexedRules) byIndex(index, value string) ([]*clientnetworkingv1.DestinationRule, error) {
	objs, err := x.idx.ByIndex(index, value)
	if err != nil {
		return nil, fmt.Errorf("xds/istio: DestinationRule index %s: %w", index, err)
	}
	out := make([]*clientnetworkingv1.DestinationRule, 0, len(objs))
	for _, o := range objs {
		if dr, ok := o.(*clientnetworkingv1.DestinationRule); ok {
			out = append(out, dr)
		}
	}
	return out, nil
}
