package main

import (
	"context"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/edgeflow/edgeflow/internal/leader"
	"github.com/edgeflow/edgeflow/internal/metrics"
	"github.com/edgeflow/edgeflow/watcher"
)

// processIdentity is this process's name in every Lease it stands for (leader.Identity, made
// once).
var processIdentity = sync.OnceValue(leader.Identity)

// DefaultIstioLeaseName is the default name of the Lease serve's replicas elect their Istio
// writer on (--istio-lease-name).
const DefaultIstioLeaseName = "edgeflow-istio"

// istioLeaderFlags configure the election of the one replica that writes Istio's objects.
type istioLeaderFlags struct {
	elect     bool
	leaseName string
	timings   leader.Config // LeaseDuration, RenewDeadline, RetryPeriod
}

func (f *istioLeaderFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&f.elect, "istio-leader-elect", true, "with --istio-mode: only the replica holding the Lease --istio-lease-name writes DestinationRules (EnvoyFilters and bootstrap ConfigMaps); the others follow the inputs and write nothing (false: every replica writes)")
	fl.StringVar(&f.leaseName, "istio-lease-name", DefaultIstioLeaseName, "name of the Istio writer's leader-election Lease, in the namespace of --rebalance-lease-namespace")
	fl.DurationVar(&f.timings.LeaseDuration, "istio-lease-duration", leader.DefaultLeaseDuration, "how long a follower waits, after it last saw the Istio Lease renewed, before it takes it")
	fl.DurationVar(&f.timings.RenewDeadline, "istio-lease-renew-deadline", leader.DefaultRenewDeadline, "the Istio writer stops writing when it could not renew its Lease for this long (below --istio-lease-duration)")
	fl.DurationVar(&f.timings.RetryPeriod, "istio-lease-retry-period", leader.DefaultRetryPeriod, "how often a replica tries to take or renew the Istio Lease")
}

// check validates the timings (client-go's rules: RenewDeadline below LeaseDuration, above
// 1.2 × RetryPeriod).
func (f *istioLeaderFlags) check() error {
	t := f.timings
	switch {
	case t.LeaseDuration <= 0 || t.RenewDeadline <= 0 || t.RetryPeriod <= 0:
		return badInput("--istio-lease-duration, --istio-lease-renew-deadline and --istio-lease-retry-period must be positive")
	case t.RenewDeadline >= t.LeaseDuration:
		return badInput("--istio-lease-renew-deadline %v must be below --istio-lease-duration %v", t.RenewDeadline, t.LeaseDuration)
	case float64(t.RenewDeadline) <= 1.2*float64(t.RetryPeriod):
		return badInput("--istio-lease-renew-deadline %v must be above 1.2 × --istio-lease-retry-period %v", t.RenewDeadline, t.RetryPeriod)
	}
	return nil
}

// istioLeader runs an Istio reconciler only while this replica holds the Istio Lease. The
// reconciler is fed (Update) whether it leads or not; it writes only from Run, which runs once
// per term and ends when the Lease is lost. It is safe for concurrent use.
type istioLeader struct {
	reconcile func(context.Context) error // the reconciler's Run
	client    coordinationv1.LeasesGetter
	lease     leader.Config
	identity  string
	log       *slog.Logger
	gauge     prometheus.Gauge

	mu      sync.Mutex
	leading bool
	holder  string // the last holder observed
}

func newIstioLeader(reconcile func(context.Context) error, client coordinationv1.LeasesGetter, lease leader.Config,
	identity string, logger *slog.Logger, reg prometheus.Registerer) (_ *istioLeader, err error) {
	defer func() { err = metrics.Registered("istio leader", recover()) }()
	return &istioLeader{reconcile: reconcile, client: client, lease: lease, identity: identity,
		log: logger.With("component", "istio-leader", "lease", lease.Namespace+"/"+lease.Name),
		gauge: promauto.With(reg).NewGauge(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: "istio", Name: "leader",
			Help: "1 while this replica holds the Istio writer's Lease (only it writes DestinationRules or EnvoyFilters), else 0."})}, nil
}

// Run stands for election until ctx is done (the run group owns ctx), running the reconciler
// while it leads; it returns nil then, or the reconciler's error.
func (l *istioLeader) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg := l.lease
	cfg.OnNewLeader = func(id string) {
		l.mu.Lock()
		l.holder = id
		l.mu.Unlock()
		if id != l.identity {
			l.log.Info("Istio writer: following; this replica writes nothing", "leader", id)
		}
	}
	l.log.Info("Istio writer: standing for election", "identity", l.identity)
	var failed error // the reconciler's (it fails only on a broken contract); written before cancel
	err := leader.Run(ctx, l.client, cfg, l.identity, func(lctx context.Context) {
		l.set(true)
		defer l.set(false)
		if err := l.reconcile(lctx); err != nil {
			failed = err
			cancel()
		}
	})
	if err != nil {
		return err
	}
	return failed
}

func (l *istioLeader) set(on bool) {
	l.mu.Lock()
	l.leading = on
	switch {
	case on:
		l.holder = l.identity
	case l.holder == l.identity:
		l.holder = "" // until the elector observes the next holder
	}
	l.mu.Unlock()
	if on {
		l.gauge.Set(1)
		l.log.Info("Istio writer: leading; this replica writes", "identity", l.identity)
	} else {
		l.gauge.Set(0)
		l.log.Info("Istio writer: stopped leading; this replica writes nothing", "identity", l.identity)
	}
}

// Leading says whether this replica holds the Istio Lease (and so writes).
func (l *istioLeader) Leading() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading
}

// check is the /readyz line: leader or follower, and who leads.
func (l *istioLeader) check() watcher.Check {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := watcher.Check{Name: "istio-leader", OK: true}
	switch {
	case l.leading:
		c.Message = "leader: this replica writes Istio's objects (Lease " + l.lease.Namespace + "/" + l.lease.Name + ")"
	case l.holder != "":
		c.Message = "follower: " + l.holder + " writes Istio's objects (Lease " + l.lease.Namespace + "/" + l.lease.Name + ")"
	default:
		c.Message = "follower: no leader seen yet (Lease " + l.lease.Namespace + "/" + l.lease.Name + ")"
	}
	return c
}
