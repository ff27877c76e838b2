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
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	clientnetworking "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"istio.io/client-go/pkg/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// Defaults of ReconcilerConfig.
const (
	DefaultResync        = time.Minute
	DefaultRetryInterval = 5 * time.Second
)

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	// Filters says what to generate (EnvoyFilters); it must be valid.
	Filters Config
	// Client reaches the cluster's Istio API.
	Client versioned.Interface
	// Resync is how long Run waits, after a successful pass with no Update since, before the
	// next pass (which repairs filters edited or deleted by hand); 0 means DefaultResync.
	Resync time.Duration
	// RetryInterval is how long Run waits after a failed pass before the next; 0 means
	// DefaultRetryInterval.
	RetryInterval time.Duration
	// Clock times Resync and RetryInterval (nil means the wall clock).
	Clock xds.Clock
	// Logger receives one line per change and per failed pass (nil means slog.Default()).
	Logger *slog.Logger
}

// Reconciler keeps the EnvoyFilters edgeflow owns (labelled ManagedByLabel=ManagedByValue in
// Filters.Namespace) equal to EnvoyFilters(Filters, managed services): it creates the missing
// ones, updates those whose spec differs and deletes those no longer wanted. It never touches
// a filter without the label. Each pass lists what exists and recomputes (level-triggered), so
// a lost event or a hand edit is repaired by the next pass.
//
// It is a watcher.Listener: Update records the latest topology and never blocks; Run does the
// passes. Nothing happens before the first Update, so a restarting edgeflow does not delete
// the filters of services it has not heard of yet; a topology with no services does delete
// them all. Update and Run are safe to call concurrently; Reconcile and Uninstall must not run
// while Run does.
type Reconciler struct {
	cfg ReconcilerConfig
	log *slog.Logger

	mu       sync.Mutex
	services []optimizer.Service
	updated  bool // an Update has arrived

	wake    chan struct{}
	running atomic.Bool
}

// NewReconciler returns a Reconciler; it starts nothing (see Run).
func NewReconciler(cfg ReconcilerConfig) (*Reconciler, error) {
	if err := cfg.Filters.Validate(); err != nil {
		return nil, err
	}
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: no Client", ErrInvalidConfig)
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
		cfg.Clock = xds.SystemClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Reconciler{
		cfg:  cfg,
		log:  cfg.Logger.With("component", "istio-envoyfilters"),
		wake: make(chan struct{}, 1),
	}, nil
}

// Update records t's services as the managed set and wakes Run. It never blocks; the latest
// topology wins. t must not be nil, nor modified afterwards.
func (r *Reconciler) Update(t *optimizer.Topology) {
	r.mu.Lock()
	r.services = t.Services
	r.updated = true
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Reconciler) latest() ([]optimizer.Service, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.services, r.updated
}

// Run reconciles after every Update, then every Resync, and every RetryInterval while passes
// fail, until ctx is done (the caller owns ctx); it then returns nil and leaves the filters in
// place (see Uninstall). It may be called once.
func (r *Reconciler) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("xds/istio: Reconciler.Run called twice")
	}
	var timer xds.Timer
	stop := func() {
		if timer != nil {
			timer.Stop()
			timer = nil
		}
	}
	defer stop()
	for {
		var fire <-chan time.Time
		if timer != nil {
			fire = timer.C()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-fire:
			timer = nil
		}
		stop()
		services, ok := r.latest()
		if !ok {
			continue
		}
		wait := r.cfg.Resync
		if err := r.Reconcile(ctx, services); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.log.Warn("EnvoyFilter pass failed; retrying", "err", err, "retry_in", r.cfg.RetryInterval)
			wait = r.cfg.RetryInterval
		}
		timer = r.cfg.Clock.NewTimer(wait)
	}
}

// Reconcile makes one pass: it lists the filters edgeflow owns and creates, updates (only when
// the spec changed) and deletes so that they equal EnvoyFilters(Filters, services). It goes on
// past a failing filter and returns every failure, each naming its filter. The edgeflow-xds
// cluster's filter is written before, and deleted after, the filters that use it. A pass costs
// one List and one write per filter that changes.
func (r *Reconciler) Reconcile(ctx context.Context, services []optimizer.Service) error {
	api := r.cfg.Client.NetworkingV1alpha3().EnvoyFilters(r.cfg.Filters.namespace())
	list, err := api.List(ctx, metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedByValue})
	if err != nil {
		return fmt.Errorf("xds/istio: list EnvoyFilters in %s: %w", r.cfg.Filters.namespace(), err)
	}
	have := make(map[string]*clientnetworking.EnvoyFilter, len(list.Items))
	for _, f := range list.Items {
		have[f.Name] = f
	}
	want := EnvoyFilters(r.cfg.Filters, services)
	slices.SortStableFunc(want, clusterFilterFirst)

	var errs []error
	for _, f := range want {
		old, ok := have[f.Name]
		delete(have, f.Name)
		switch {
		case !ok:
			_, err = api.Create(ctx, f, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				err = fmt.Errorf("exists without label %s=%s; not touching it: %w", ManagedByLabel, ManagedByValue, err)
			}
			r.logWrite(err, "created", f)
		case !proto.Equal(&old.Spec, &f.Spec):
			// Keep what others put on the object; replace the spec.
			f.ResourceVersion = old.ResourceVersion
			f.Labels = mergeMaps(old.Labels, f.Labels)
			f.Annotations = old.Annotations
			_, err = api.Update(ctx, f, metav1.UpdateOptions{})
			r.logWrite(err, "updated", f)
		default:
			err = nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("xds/istio: EnvoyFilter %s/%s: %w", f.Namespace, f.Name, err))
		}
	}
	errs = append(errs, r.deleteAll(ctx, slices.Collect(maps.Values(have)))...)
	return errors.Join(errs...)
}

// Uninstall deletes every EnvoyFilter edgeflow owns in Filters.Namespace, so sidecars take
// their endpoints from istiod again. Call it after Run has returned.
func (r *Reconciler) Uninstall(ctx context.Context) error {
	api := r.cfg.Client.NetworkingV1alpha3().EnvoyFilters(r.cfg.Filters.namespace())
	list, err := api.List(ctx, metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedByValue})
	if err != nil {
		return fmt.Errorf("xds/istio: list EnvoyFilters in %s: %w", r.cfg.Filters.namespace(), err)
	}
	return errors.Join(r.deleteAll(ctx, list.Items)...)
}

// deleteAll deletes filters, the edgeflow-xds cluster's last; one already gone is no error.
func (r *Reconciler) deleteAll(ctx context.Context, filters []*clientnetworking.EnvoyFilter) []error {
	slices.SortFunc(filters, func(a, b *clientnetworking.EnvoyFilter) int { return -clusterFilterFirst(a, b) })
	api := r.cfg.Client.NetworkingV1alpha3().EnvoyFilters(r.cfg.Filters.namespace())
	var errs []error
	for _, f := range filters {
		var opts metav1.DeleteOptions
		if f.UID != "" {
			// Not a filter someone re-created since the list.
			opts.Preconditions = &metav1.Preconditions{UID: &f.UID}
		}
		err := api.Delete(ctx, f.Name, opts)
		if apierrors.IsNotFound(err) {
			continue
		}
		r.logWrite(err, "deleted", f)
		if err != nil {
			errs = append(errs, fmt.Errorf("xds/istio: delete EnvoyFilter %s/%s: %w", f.Namespace, f.Name, err))
		}
	}
	return errs
}

// logWrite logs a write that succeeded (failures are returned).
func (r *Reconciler) logWrite(err error, what string, f *clientnetworking.EnvoyFilter) {
	if err == nil {
		r.log.Info("EnvoyFilter "+what, "namespace", f.Namespace, "name", f.Name)
	}
}

// clusterFilterFirst orders the edgeflow-xds cluster's filter before the others, the others by
// name.
func clusterFilterFirst(a, b *clientnetworking.EnvoyFilter) int {
	if (a.Name == clusterFilterName) != (b.Name == clusterFilterName) {
		if a.Name == clusterFilterName {
			return -1
		}
		return 1
	}
	return strings.Compare(a.Name, b.Name)
}

func mergeMaps(base, over map[string]string) map[string]string {
	out := maps.Clone(base)
	if out == nil {
		out = make(map[string]string, len(over))
	}
	maps.Copy(out, over)
	return out
}
