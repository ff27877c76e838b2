// Package leader elects one replica on a Kubernetes Lease (client-go's leaderelection) and
// runs a caller's loop only while that replica holds it. The rebalancer acts, and serve writes
// Istio's objects, only through Run.
package leader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Defaults of Config's timings, client-go's recommended ones.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Config is the Lease the replicas elect their leader on.
type Config struct {
	Namespace, Name string
	// LeaseDuration, RenewDeadline and RetryPeriod as in client-go's leaderelection (0:
	// DefaultLeaseDuration, DefaultRenewDeadline, DefaultRetryPeriod). A follower takes a
	// Lease its holder stopped renewing LeaseDuration after it last saw the Lease change, at
	// its next try (every RetryPeriod); a leader that cannot renew within RenewDeadline stops.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// OnNewLeader, when set, is called with the identity of each new holder the replica
	// observes (its own included), from the elector's goroutine; it must not block.
	OnNewLeader func(identity string)
}

// ErrConfig is wrapped by Run's error for a Config it cannot elect on.
var ErrConfig = errors.New("leader: invalid Lease configuration")

// withDefaults fills the zero timings.
func (c Config) withDefaults() Config {
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.RenewDeadline <= 0 {
		c.RenewDeadline = DefaultRenewDeadline
	}
	if c.RetryPeriod <= 0 {
		c.RetryPeriod = DefaultRetryPeriod
	}
	return c
}

// Run stands for election on cfg's Lease as identity until ctx is done, and returns nil then.
// While this replica holds the Lease, lead runs in Run's goroutine with a context that ends
// when the Lease is lost (not renewed within RenewDeadline) or ctx is done. lead should
// return when its context is done; if it returns earlier, the Lease is given up. Run stands
// again only after lead has returned, so two terms of lead never overlap in one process. On
// the way out the Lease is released (ReleaseOnCancel), so another replica takes it at once
// rather than after LeaseDuration.
//
// Replicas must use distinct identities (two processes with one identity both lead): see
// Identity. Run errs only on a Config client-go refuses (ErrConfig).
func Run(ctx context.Context, client coordinationv1.LeasesGetter, cfg Config, identity string, lead func(context.Context)) error {
	if cfg.Namespace == "" || cfg.Name == "" {
		return fmt.Errorf("%w: the Lease needs a namespace and a name", ErrConfig)
	}
	if identity == "" {
		return fmt.Errorf("%w: no identity", ErrConfig)
	}
	cfg = cfg.withDefaults()
	lock := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
		Client: client, LockConfig: resourcelock.ResourceLockConfig{Identity: identity}}
	for ctx.Err() == nil {
		leading := make(chan context.Context, 1)
		callbacks := leaderelection.LeaderCallbacks{
			// The leader loop runs here, in Run's goroutine, not in the elector's: it has
			// ended before the next election starts.
			OnStartedLeading: func(lctx context.Context) { leading <- lctx },
			OnStoppedLeading: func() {},
			OnNewLeader:      cfg.OnNewLeader,
		}
		ectx, ecancel := context.WithCancel(ctx)
		elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
			ReleaseOnCancel: true, Name: cfg.Name, Callbacks: callbacks,
		})
		if err != nil {
			ecancel()
			return fmt.Errorf("%w: %s/%s: %w", ErrConfig, cfg.Namespace, cfg.Name, err)
		}
		elected := make(chan struct{})
		go func() {
			defer close(elected)
			elector.Run(ectx) // returns when ectx is done or the Lease is lost
		}()
		select {
		case lctx := <-leading:
			lead(lctx)
			ecancel() // lead returned early: give the Lease up (released)
			<-elected
		case <-elected:
		}
		ecancel()
	}
	return nil
}

// Identity is a replica's name in a Lease: the hostname (a pod's name in a cluster) and a
// random suffix, unique per process, so that two processes on one host never both hold a
// Lease (as kube-controller-manager names itself).
func Identity() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "edgeflow"
	}
	return h + "_" + string(uuid.NewUUID())
}
