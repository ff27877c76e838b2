package istio

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"google.golang.org/protobuf/proto"
	clientnetworking "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/edgeflow/edgeflow/internal/metrics"
	"github.com/edgeflow/edgeflow/optimizer"
)

// Defaults of ReconcilerConfig.
const (
	DefaultResync        = time.Minute
	DefaultRetryInterval = 5 * time.Second
)

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	// Filters says what to generate (EnvoyFilters, BootstrapConfigMaps); it must be valid.
	Filters Config
	// Client reaches the cluster's Istio API (the EnvoyFilters).
	Client versioned.Interface
	// Kube reaches the cluster's Kubernetes API (the bootstrap ConfigMaps).
	Kube kubernetes.Interface
	// Resync is how long Run waits, after a successful pass with no Update since, before the
	// next pass (which repairs filters edited or deleted by hand); 0 means DefaultResync.
	Resync time.Duration
	// RetryInterval is how long Run waits after a failed pass before the next; 0 means
	// DefaultRetryInterval.
	RetryInterval time.Duration
	// Clock times Resync and RetryInterval (nil means clock.RealClock{}).
	Clock clock.WithTickerAndDelayedExecution
	// Logger receives one line per change and per failed pass (nil means slog.Default()).
	Logger *slog.Logger
	// Registerer, when set, receives edgeflow_istio_refused_writes_total{kind=EnvoyFilter|ConfigMap}.
	Registerer prometheus.Registerer
}

// Reconciler keeps the objects edgeflow owns (labelled ManagedByLabel=ManagedByValue; a
// filter also by its name, namespace and annotation: ownedFilter) equal to
// what the managed services need: the EnvoyFilters in Filters.Namespace equal to
// EnvoyFilters(Filters, services), and the ConfigMaps named BootstrapConfigMapName equal to
// BootstrapConfigMaps(Filters, services), one per namespace holding a managed service. It
// creates the missing ones, updates those whose content differs and deletes those no longer
// wanted. It never touches an object without the label, nor a labelled ConfigMap of another
// name, nor a labelled EnvoyFilter not named and annotated as EnvoyFilters writes them.
//
// Rules:
//   - Each pass lists what exists and recomputes (level-triggered), so a lost event or a hand
//     edit is repaired by the next pass.
//   - ConfigMaps are written before the filters and deleted after them, so a sidecar the
//     filters select can have the bootstrap cluster they name.
//   - A namespace that no longer holds a managed service loses its ConfigMap: a pod there that
//     still carries BootstrapAnnotation cannot start (its volume is gone) until the annotation
//     is removed. Remove the annotation and the label before un-managing a namespace's last
//     service or uninstalling.
//
// It is a watcher.Listener: Update records the latest topology and never blocks; Run does the
// passes. Nothing happens before the first Update, so a restarting edgeflow does not delete
// the objects of services it has not heard of yet; a topology with no services does delete
// them all. Update and Run are safe to call concurrently; Reconcile and Uninstall must not run
// while Run does.
type Reconciler struct {
	cfg ReconcilerConfig
	log *slog.Logger

	mu            sync.Mutex
	services      []optimizer.Service
	updated       bool            // an Update has arrived
	loggedForeign map[string]bool // labelled filters not edgeflow's, logged (ownedFilters)

	refused *prometheus.CounterVec // edgeflow_istio_refused_writes_total

	passes *passLoop
}

// NewReconciler returns a Reconciler; it starts nothing (see Run).
func NewReconciler(cfg ReconcilerConfig) (*Reconciler, error) {
	if err := cfg.Filters.Validate(); err != nil {
		return nil, err
	}
	if cfg.Client == nil || cfg.Kube == nil {
		return nil, fmt.Errorf("%w: no Client (Istio) or no Kube (Kubernetes) clientset", ErrInvalidConfig)
	}
	if cfg.Resync < 0 || cfg.RetryInterval < 0 {
		return nil, fmt.Errorf("%w: negative Resync %v or RetryInterval %v", ErrInvalidConfig, cfg.Resync, cfg.RetryInterval)
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger.With("component", "istio-envoyfilters")
	refused, err := newReconcilerMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Reconciler{
		refused:       refused,
		cfg:           cfg,
		log:           log,
		loggedForeign: map[string]bool{},
		passes: &passLoop{clock: cfg.Clock, resync: cfg.Resync, retry: cfg.RetryInterval, log: log,
			what: "EnvoyFilter/ConfigMap", owner: "Reconciler"},
	}, nil
}

// Update records t's services as the managed set and wakes Run. It never blocks; the latest
// topology wins. t must not be nil, nor modified afterwards.
func (r *Reconciler) Update(t *optimizer.Topology) {
	r.mu.Lock()
	r.services = t.Services
	r.updated = true
	r.mu.Unlock()
	r.passes.wake()
}

func (r *Reconciler) latest() ([]optimizer.Service, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.services, r.updated
}

// Run reconciles at once with the latest topology (if any), after every Update, then every
// Resync, and every RetryInterval while passes fail, until ctx is done (the caller owns ctx);
// it then returns nil and leaves the filters in place (see Uninstall). Nothing is written
// while Run is not running (Update only records): serve runs it only while its replica holds
// the Istio Lease, calling it again at each new term. Calls must not overlap.
func (r *Reconciler) Run(ctx context.Context) error {
	return r.passes.run(ctx, func(ctx context.Context) (bool, error) {
		services, ok := r.latest()
		if !ok {
			return false, nil
		}
		return true, r.Reconcile(ctx, services)
	})
}

// Reconcile makes one pass: it lists the EnvoyFilters and bootstrap ConfigMaps edgeflow owns
// and creates, updates (only when the content changed) and deletes so that they equal what
// services need. It goes on past a failing object and returns every failure, each naming its
// object. ConfigMaps are written first and deleted last (see Reconciler). A pass costs two
// Lists and one write per object that changes.
func (r *Reconciler) Reconcile(ctx context.Context, services []optimizer.Service) error {
	filters := r.cfg.Client.NetworkingV1alpha3().EnvoyFilters(r.cfg.Filters.namespace())
	owned, err := r.ownedFilters(ctx)
	if err != nil {
		return err
	}
	cms, err := r.ownedConfigMaps(ctx)
	if err != nil {
		return err
	}

	var errs []error
	haveCM := make(map[string]*corev1.ConfigMap, len(cms))
	for _, cm := range cms {
		haveCM[cm.Namespace] = cm
	}
	for _, cm := range BootstrapConfigMaps(r.cfg.Filters, services) {
		old, ok := haveCM[cm.Namespace]
		delete(haveCM, cm.Namespace)
		api := r.cfg.Kube.CoreV1().ConfigMaps(cm.Namespace)
		switch {
		case !ok:
			_, err = api.Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				err = fmt.Errorf("exists without label %s=%s; not touching it: %w", ManagedByLabel, ManagedByValue, err)
			}
			r.logWrite(err, "created", "ConfigMap", cm.Namespace, cm.Name)
		case !maps.Equal(old.Data, cm.Data) || len(old.BinaryData) > 0:
			cm.ResourceVersion = old.ResourceVersion
			cm.Labels = mergeMaps(old.Labels, cm.Labels)
			cm.Annotations = old.Annotations
			_, err = api.Update(ctx, cm, metav1.UpdateOptions{})
			r.logWrite(err, "updated", "ConfigMap", cm.Namespace, cm.Name)
		default:
			err = nil
		}
		err = countRefused(r.refused, r.log, err, kindConfigMap, "namespace", cm.Namespace, "name", cm.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("xds/istio: ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err))
		}
	}

	have := make(map[string]*clientnetworking.EnvoyFilter, len(owned))
	for _, f := range owned {
		have[f.Name] = f
	}
	for _, f := range EnvoyFilters(r.cfg.Filters, services) {
		old, ok := have[f.Name]
		delete(have, f.Name)
		switch {
		case !ok:
			_, err = filters.Create(ctx, f, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				err = fmt.Errorf("exists without label %s=%s and annotation %s as edgeflow writes them; not touching it: %w", ManagedByLabel, ManagedByValue, FilterNamespaceAnnotation, err)
			}
			r.logWrite(err, "created", "EnvoyFilter", f.Namespace, f.Name)
		case !proto.Equal(&old.Spec, &f.Spec):
			// Keep what others put on the object; replace the spec.
			f.ResourceVersion = old.ResourceVersion
			f.Labels = mergeMaps(old.Labels, f.Labels)
			f.Annotations = mergeMaps(old.Annotations, f.Annotations)
			_, err = filters.Update(ctx, f, metav1.UpdateOptions{})
			r.logWrite(err, "updated", "EnvoyFilter", f.Namespace, f.Name)
		default:
			err = nil
		}
		err = countRefused(r.refused, r.log, err, kindEnvoyFilter, "namespace", f.Namespace, "name", f.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("xds/istio: EnvoyFilter %s/%s: %w", f.Namespace, f.Name, err))
		}
	}
	errs = append(errs, r.deleteFilters(ctx, slices.Collect(maps.Values(have)))...)
	errs = append(errs, r.deleteConfigMaps(ctx, slices.Collect(maps.Values(haveCM)))...)
	return errors.Join(errs...)
}

// countRefused counts and logs err when the API server refused the write for the object itself
// (refused: admission, quota, validation, size) and returns nil: retrying the pass at once
// would be refused again, and the other objects must not wait on it (the next pass, Resync
// later, asks again). Any other err is returned. object names the object in the log line
// (its key and value). Both Istio modes' reconcilers count with it.
func countRefused(c *prometheus.CounterVec, log *slog.Logger, err error, kind string, object ...any) error {
	if !refused(err) {
		return err
	}
	c.WithLabelValues(kind).Inc()
	log.Warn(kind+" refused by the API server; the other objects are written", append(object, "err", err)...)
	return nil
}

// newReconcilerMetrics makes the Reconciler's metric and registers it with reg (nil: with
// none); a registration that fails is returned as an error.
func newReconcilerMetrics(reg prometheus.Registerer) (c *prometheus.CounterVec, err error) {
	defer func() { err = metrics.Registered("xds/istio", recover()) }()
	return refusedWrites(promauto.With(reg), kindEnvoyFilter, kindConfigMap), nil
}

// managedSelector selects the objects edgeflow owns.
const managedSelector = ManagedByLabel + "=" + ManagedByValue

// maxLoggedForeign bounds the labelled filters not edgeflow's that are remembered as logged.
const maxLoggedForeign = 1000

// ownedFilters lists the EnvoyFilters edgeflow owns in Filters.Namespace (ownedFilter): those
// with its label but not its name, namespace and annotation are someone else's, left alone
// and logged once each.
func (r *Reconciler) ownedFilters(ctx context.Context) ([]*clientnetworking.EnvoyFilter, error) {
	list, err := r.cfg.Client.NetworkingV1alpha3().EnvoyFilters(r.cfg.Filters.namespace()).List(ctx, metav1.ListOptions{LabelSelector: managedSelector})
	if err != nil {
		return nil, fmt.Errorf("xds/istio: list EnvoyFilters in %s: %w", r.cfg.Filters.namespace(), err)
	}
	var out []*clientnetworking.EnvoyFilter
	for _, f := range list.Items {
		if ownedFilter(r.cfg.Filters, f) {
			out = append(out, f)
			continue
		}
		key := f.Namespace + "/" + f.Name + "/" + string(f.UID)
		r.mu.Lock()
		logged := r.loggedForeign[key]
		if !logged {
			if len(r.loggedForeign) >= maxLoggedForeign {
				clear(r.loggedForeign)
			}
			r.loggedForeign[key] = true
		}
		r.mu.Unlock()
		if !logged {
			r.log.Warn("EnvoyFilter labelled "+managedSelector+" but not named and annotated as edgeflow writes them; not edgeflow's, left alone",
				"namespace", f.Namespace, "name", f.Name, "annotation", FilterNamespaceAnnotation)
		}
	}
	return out, nil
}

// ownedConfigMaps lists the bootstrap ConfigMaps edgeflow owns, in every namespace.
func (r *Reconciler) ownedConfigMaps(ctx context.Context) ([]*corev1.ConfigMap, error) {
	list, err := r.cfg.Kube.CoreV1().ConfigMaps(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		LabelSelector: managedSelector,
		FieldSelector: "metadata.name=" + BootstrapConfigMapName,
	})
	if err != nil {
		return nil, fmt.Errorf("xds/istio: list ConfigMaps %s: %w", BootstrapConfigMapName, err)
	}
	var out []*corev1.ConfigMap
	for i := range list.Items {
		if list.Items[i].Name == BootstrapConfigMapName { // a fake clientset ignores field selectors
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// Uninstall deletes every EnvoyFilter edgeflow owns in Filters.Namespace, then every bootstrap
// ConfigMap it owns, so sidecars take their endpoints from istiod again. Call it after Run has
// returned. Pods still annotated BootstrapAnnotation keep running but cannot restart until
// the annotation is removed.
func (r *Reconciler) Uninstall(ctx context.Context) error {
	owned, err := r.ownedFilters(ctx)
	var errs []error
	switch {
	case apierrors.IsNotFound(err):
		// Istio's CRDs are not installed: no EnvoyFilter to delete; the ConfigMaps may remain.
	case err != nil:
		return err
	default:
		errs = r.deleteFilters(ctx, owned)
	}
	cms, err := r.ownedConfigMaps(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	return errors.Join(append(errs, r.deleteConfigMaps(ctx, cms)...)...)
}

// Managed lists what Uninstall would delete, as "EnvoyFilter NAMESPACE/NAME" and "ConfigMap
// NAMESPACE/NAME", in the order it deletes them; it writes nothing (uninstall --dry-run).
// Without Istio's CRDs it lists the ConfigMaps alone.
func (r *Reconciler) Managed(ctx context.Context) ([]string, error) {
	var out []string
	owned, err := r.ownedFilters(ctx)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, err
	default:
		slices.SortFunc(owned, func(a, b *clientnetworking.EnvoyFilter) int { return strings.Compare(a.Name, b.Name) })
		for _, f := range owned {
			out = append(out, "EnvoyFilter "+f.Namespace+"/"+f.Name)
		}
	}
	cms, err := r.ownedConfigMaps(ctx)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(cms, func(a, b *corev1.ConfigMap) int { return strings.Compare(a.Namespace, b.Namespace) })
	for _, cm := range cms {
		out = append(out, "ConfigMap "+cm.Namespace+"/"+cm.Name)
	}
	return out, nil
}

// deleteFilters deletes filters, by name; one already gone is no error.
func (r *Reconciler) deleteFilters(ctx context.Context, filters []*clientnetworking.EnvoyFilter) []error {
	slices.SortFunc(filters, func(a, b *clientnetworking.EnvoyFilter) int { return strings.Compare(a.Name, b.Name) })
	api := r.cfg.Client.NetworkingV1alpha3().EnvoyFilters(r.cfg.Filters.namespace())
	var errs []error
	for _, f := range filters {
		err := api.Delete(ctx, f.Name, deleteOptions(f.UID))
		if apierrors.IsNotFound(err) {
			continue
		}
		r.logWrite(err, "deleted", "EnvoyFilter", f.Namespace, f.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("xds/istio: delete EnvoyFilter %s/%s: %w", f.Namespace, f.Name, err))
		}
	}
	return errs
}

// deleteConfigMaps deletes cms, by namespace; one already gone is no error.
func (r *Reconciler) deleteConfigMaps(ctx context.Context, cms []*corev1.ConfigMap) []error {
	slices.SortFunc(cms, func(a, b *corev1.ConfigMap) int { return strings.Compare(a.Namespace, b.Namespace) })
	var errs []error
	for _, cm := range cms {
		err := r.cfg.Kube.CoreV1().ConfigMaps(cm.Namespace).Delete(ctx, cm.Name, deleteOptions(cm.UID))
		if apierrors.IsNotFound(err) {
			continue
		}
		r.logWrite(err, "deleted", "ConfigMap", cm.Namespace, cm.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("xds/istio: delete ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err))
		}
	}
	return errs
}

// deleteOptions deletes the object of uid only, not one someone re-created since the list.
func deleteOptions(uid types.UID) metav1.DeleteOptions {
	var opts metav1.DeleteOptions
	if uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	return opts
}

// logWrite logs a write that succeeded (failures are returned).
func (r *Reconciler) logWrite(err error, what, kind, namespace, name string) {
	if err == nil {
		r.log.Info(kind+" "+what, "namespace", namespace, "name", name)
	}
}

func mergeMaps(base, over map[string]string) map[string]string {
	out := maps.Clone(base)
	if out == nil {
		out = make(map[string]string, len(over))
	}
	maps.Copy(out, over)
	return out
}
