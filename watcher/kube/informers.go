package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// InformersConfig configures Informers.
type InformersConfig struct {
	// Client reaches the cluster (required).
	Client kubernetes.Interface
	// Namespaces are where Services and EndpointSlices (and pods, unless AllPods) are watched;
	// empty, or one of them "", means all.
	Namespaces []string
	// AllPods watches the pods of every namespace (the rebalancer counts every pod on a node);
	// else only those of Namespaces.
	AllPods bool
	// EndpointSlices watches the EndpointSlices of Namespaces (the watcher reads them; the
	// rebalancer alone does not, and its role may not allow it).
	EndpointSlices bool
}

// Informers is the one set of shared informers a process keeps on the cluster: the nodes, the
// pods, and the Services and EndpointSlices of the managed namespaces. The watcher (Source)
// and the rebalancer read the same caches, so each object is held once.
//
// Rules:
//   - Every object is trimmed before it is cached (the transforms in trim.go): managed fields
//     and what edgeflow never reads are dropped — annotations other than edgeflow's, container
//     env, images, probes and mounts, node images and conditions, pod status other than the
//     phase, conditions and IPs. What the watcher and the rebalancer read stays: labels, owners,
//     pod requests, scheduling constraints (node selector, affinity, tolerations, topology
//     spread, volumes that bind a topology, host ports, gates), node allocatable, taints,
//     addresses. Nothing may write a cached object back to the API server (it is partial).
//   - Indexes: pods by UID (IndexPodUID) and EndpointSlices by service (IndexSliceService),
//     by pod (IndexSlicePod) and by node (IndexSliceNode); consumers may add theirs before
//     Start.
//   - Start starts them once, whoever calls it; they run until the context given to Start is
//     done, and Stop waits for them.
type Informers struct {
	cfg        InformersConfig
	namespaces []string // nil: all

	// Nodes is every node; Pods, Services and EndpointSlices (with InformersConfig.
	// EndpointSlices) one informer per namespace watched (one for all when the namespaces are
	// all; Pods one for all with AllPods).
	Nodes          cache.SharedIndexInformer
	Pods           []Scoped
	Services       []Scoped
	EndpointSlices []Scoped

	factories []informers.SharedInformerFactory
}

// Scoped is an informer on one namespace ("" for all).
type Scoped struct {
	Namespace string
	Informer  cache.SharedIndexInformer
}

// Index names.
const (
	// IndexPodUID indexes pods by metadata.uid.
	IndexPodUID = "uid"
	// IndexSliceService indexes EndpointSlices by "NAMESPACE/SERVICE" (the service-name label).
	IndexSliceService = "service"
	// IndexSlicePod indexes EndpointSlices by "NAMESPACE/POD" of each endpoint's targetRef.
	IndexSlicePod = "pod"
	// IndexSliceNode indexes EndpointSlices by each endpoint's nodeName.
	IndexSliceNode = "node"
)

// NewInformers builds the informers (started by Start). The Client's server-side filters
// apply: nothing is listed outside Namespaces but the nodes (and, with AllPods, the pods), and
// no pod that has ended (ActivePods).
func NewInformers(cfg InformersConfig) (*Informers, error) {
	if cfg.Client == nil {
		return nil, errors.New("kube: InformersConfig.Client is nil")
	}
	in := &Informers{cfg: cfg, namespaces: UniqueNamespaces(cfg.Namespaces)}
	all := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithTransform(trim))
	in.factories = append(in.factories, all)
	in.Nodes = all.Core().V1().Nodes().Informer()
	scopes := in.namespaces
	if len(scopes) == 0 {
		scopes = []string{""}
	}
	for _, ns := range scopes {
		f := all
		if ns != "" {
			f = informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithNamespace(ns), informers.WithTransform(trim))
			in.factories = append(in.factories, f)
		}
		in.Services = append(in.Services, Scoped{ns, f.Core().V1().Services().Informer()})
		if cfg.EndpointSlices {
			in.EndpointSlices = append(in.EndpointSlices, Scoped{ns, f.Discovery().V1().EndpointSlices().Informer()})
		}
		if !cfg.AllPods {
			in.Pods = append(in.Pods, Scoped{ns, in.podFactory(ns).Core().V1().Pods().Informer()})
		}
	}
	if cfg.AllPods {
		in.Pods = []Scoped{{"", in.podFactory("").Core().V1().Pods().Informer()}}
	}
	for _, p := range in.Pods {
		if err := p.Informer.AddIndexers(cache.Indexers{IndexPodUID: indexPodUID}); err != nil {
			return nil, fmt.Errorf("kube: pod index: %w", err)
		}
	}
	for _, s := range in.EndpointSlices {
		if err := s.Informer.AddIndexers(cache.Indexers{IndexSliceService: indexSliceService, IndexSlicePod: indexSlicePod, IndexSliceNode: indexSliceNode}); err != nil {
			return nil, fmt.Errorf("kube: EndpointSlice indexes: %w", err)
		}
	}
	return in, nil
}

// ActivePods is the pods' server-side field selector: a pod that has ended (Succeeded or
// Failed: a finished Job's pods, evicted or shut-down pods) holds no resources for the
// scheduler and serves no traffic, so neither the watcher nor the rebalancer reads it, and the
// API server does not send it. A pod that ends leaves the informer as a deletion.
const ActivePods = "status.phase!=Succeeded,status.phase!=Failed"

// podFactory returns a factory for the pods of namespace ns ("": all) that lists only
// ActivePods. The pods get a factory of their own because the selector names a pod field.
func (in *Informers) podFactory(ns string) informers.SharedInformerFactory {
	opts := []informers.SharedInformerOption{informers.WithTransform(trim),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = ActivePods })}
	if ns != "" {
		opts = append(opts, informers.WithNamespace(ns))
	}
	f := informers.NewSharedInformerFactoryWithOptions(in.cfg.Client, 0, opts...)
	in.factories = append(in.factories, f)
	return f
}

// Namespaces are the namespaces watched (nil: all).
func (in *Informers) Namespaces() []string { return in.namespaces }

// AllPods says whether the pods of every namespace are watched.
func (in *Informers) AllPods() bool { return in.cfg.AllPods }

// Client is the clientset the informers list and watch with.
func (in *Informers) Client() kubernetes.Interface { return in.cfg.Client }

// Start starts the informers (the first call does; later ones do nothing). They run until ctx
// is done.
func (in *Informers) Start(ctx context.Context) {
	for _, f := range in.factories {
		f.Start(ctx.Done()) // starts only what is not started yet; safe for concurrent use
	}
}

// WaitForCacheSync waits until every cache has synced, or ctx is done (an error then).
func (in *Informers) WaitForCacheSync(ctx context.Context) error {
	for _, f := range in.factories {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return fmt.Errorf("kube: cache of %v did not sync", typ)
			}
		}
	}
	return nil
}

// HasSynced says whether every cache has synced.
func (in *Informers) HasSynced() bool {
	for _, i := range in.all() {
		if !i.inf.HasSynced() {
			return false
		}
	}
	return true
}

// Stop waits for the informers to end; the context given to Start must be done.
func (in *Informers) Stop() {
	for _, f := range in.factories {
		f.Shutdown()
	}
}

type namedInformer struct {
	name string
	inf  cache.SharedIndexInformer
}

// all names every informer ("pods in shop", "nodes"), for watch failures.
func (in *Informers) all() []namedInformer {
	out := []namedInformer{{"nodes", in.Nodes}}
	where := func(ns string) string {
		if ns == "" {
			return " in all namespaces"
		}
		return " in " + ns
	}
	for _, p := range in.Pods {
		out = append(out, namedInformer{"pods" + where(p.Namespace), p.Informer})
	}
	for _, s := range in.Services {
		out = append(out, namedInformer{"services" + where(s.Namespace), s.Informer})
	}
	for _, s := range in.EndpointSlices {
		out = append(out, namedInformer{"endpointslices" + where(s.Namespace), s.Informer})
	}
	return out
}

// PodByUID is the pod namespace/name with that uid ("" uid: by name), or nil.
func (in *Informers) PodByUID(namespace, name, uid string) *corev1.Pod {
	for _, p := range in.Pods {
		if p.Namespace != "" && p.Namespace != namespace {
			continue
		}
		if uid == "" {
			obj, ok, _ := p.Informer.GetIndexer().GetByKey(namespace + "/" + name)
			if ok {
				return obj.(*corev1.Pod)
			}
			continue
		}
		objs, _ := p.Informer.GetIndexer().ByIndex(IndexPodUID, uid)
		for _, o := range objs {
			if pod, ok := o.(*corev1.Pod); ok && pod.Namespace == namespace && pod.Name == name {
				return pod
			}
		}
	}
	return nil
}

// Service is the Service namespace/name, or nil.
func (in *Informers) Service(namespace, name string) *corev1.Service {
	for _, s := range in.Services {
		if s.Namespace != "" && s.Namespace != namespace {
			continue
		}
		if obj, ok, _ := s.Informer.GetIndexer().GetByKey(namespace + "/" + name); ok {
			return obj.(*corev1.Service)
		}
	}
	return nil
}

// SlicesOf are the EndpointSlices of the Service namespace/name.
func (in *Informers) SlicesOf(namespace, name string) []*discoveryv1.EndpointSlice {
	return in.slicesBy(namespace, IndexSliceService, namespace+"/"+name)
}

// slicesBy are the EndpointSlices under key in index (namespace "" : every scope).
func (in *Informers) slicesBy(namespace, index, key string) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, s := range in.EndpointSlices {
		if namespace != "" && s.Namespace != "" && s.Namespace != namespace {
			continue
		}
		objs, _ := s.Informer.GetIndexer().ByIndex(index, key)
		for _, o := range objs {
			out = append(out, o.(*discoveryv1.EndpointSlice))
		}
	}
	return out
}

func indexPodUID(obj any) ([]string, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		return []string{string(p.UID)}, nil
	}
	return nil, nil
}

func indexSliceService(obj any) ([]string, error) {
	if sl, ok := obj.(*discoveryv1.EndpointSlice); ok {
		if svc := sl.Labels[discoveryv1.LabelServiceName]; svc != "" {
			return []string{sl.Namespace + "/" + svc}, nil
		}
	}
	return nil, nil
}

func indexSlicePod(obj any) ([]string, error) {
	sl, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	var out []string
	for _, ep := range sl.Endpoints {
		if r := ep.TargetRef; r != nil && r.Kind == "Pod" {
			out = append(out, sl.Namespace+"/"+r.Name)
		}
	}
	return out, nil
}

func indexSliceNode(obj any) ([]string, error) {
	sl, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	var out []string
	for _, ep := range sl.Endpoints {
		if ep.NodeName != nil && *ep.NodeName != "" {
			out = append(out, *ep.NodeName)
		}
	}
	return out, nil
}

// edgeflowAnnotation says whether an annotation is edgeflow's own (kept by the transforms).
func edgeflowAnnotation(key string) bool { return strings.HasPrefix(key, "edgeflow.io/") }
