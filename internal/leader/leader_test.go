package leader

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

// short timings: a released Lease is taken at the next try (RetryPeriod).
var short = Config{Namespace: "ns", Name: "lease", LeaseDuration: 2 * time.Second, RenewDeadline: time.Second,
	RetryPeriod: 100 * time.Millisecond}

// candidate runs Run in a goroutine and records its terms.
type candidate struct {
	id      string
	cancel  context.CancelFunc
	done    chan error
	leading atomic.Bool
	terms   atomic.Int32
	mu      sync.Mutex
	overlap bool // a term started while another of this candidate ran
}

func start(t *testing.T, cs *fake.Clientset, cfg Config, id string, lead func(ctx context.Context)) *candidate {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidate{id: id, cancel: cancel, done: make(chan error, 1)}
	go func() {
		c.done <- Run(ctx, cs.CoordinationV1(), cfg, id, func(lctx context.Context) {
			if !c.leading.CompareAndSwap(false, true) {
				c.mu.Lock()
				c.overlap = true
				c.mu.Unlock()
			}
			c.terms.Add(1)
			defer c.leading.Store(false)
			if lead != nil {
				lead(lctx)
				return
			}
			<-lctx.Done()
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			t.Errorf("%s: Run did not return after its context ended", id)
		}
	})
	return c
}

func (c *candidate) stop(t *testing.T) {
	t.Helper()
	c.cancel()
	select {
	case err := <-c.done:
		if err != nil {
			t.Errorf("%s: Run: %v", c.id, err)
		}
		c.done <- nil // for Cleanup
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: Run did not return after its context ended", c.id)
	}
	if c.leading.Load() {
		t.Errorf("%s: Run returned while its leader loop still ran", c.id)
	}
}

func holder(t *testing.T, cs *fake.Clientset) string {
	t.Helper()
	l, err := cs.CoordinationV1().Leases("ns").Get(context.Background(), "lease", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// TestOneLeadsAndTheOtherTakesOverOnRelease: of two candidates exactly one leads; when it
// stops, its Lease is released (ReleaseOnCancel) and the other leads well before LeaseDuration.
func TestOneLeadsAndTheOtherTakesOverOnRelease(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset()
	var seen sync.Map
	cfg := short
	cfg.LeaseDuration = 30 * time.Second // a takeover within it can only come from the release
	cfg.RenewDeadline = 20 * time.Second
	cfg.OnNewLeader = func(id string) { seen.Store(id, true) }
	a := start(t, cs, cfg, "a", nil)
	testkit.Eventually(t, 5*time.Second, "a leads", a.leading.Load)
	b := start(t, cs, cfg, "b", nil)
	time.Sleep(500 * time.Millisecond) // b tries five times meanwhile
	if b.leading.Load() {
		t.Fatal("b leads while a holds the Lease")
	}
	if h := holder(t, cs); h != "a" {
		t.Fatalf("holder %q, want a", h)
	}
	began := time.Now()
	a.stop(t)
	testkit.Eventually(t, 5*time.Second, "b leads after a released the Lease", b.leading.Load)
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("takeover took %v", d)
	}
	if _, ok := seen.Load("a"); !ok {
		t.Error("OnNewLeader never named a")
	}
}

// TestLeadReturningEarlyGivesUpTheLease: a lead loop that returns before its context ends
// gives the Lease up; Run stands again and a new term starts only after the last ended.
func TestLeadReturningEarlyGivesUpTheLease(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset()
	var quit atomic.Bool
	quit.Store(true)
	a := start(t, cs, short, "a", func(ctx context.Context) {
		if quit.Load() {
			return
		}
		<-ctx.Done()
	})
	testkit.Eventually(t, 5*time.Second, "a leads twice", func() bool { return a.terms.Load() >= 2 })
	quit.Store(false)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.overlap {
		t.Error("two terms of lead overlapped")
	}
}

// TestConfigRefused: a Config client-go refuses, or no Lease name, is ErrConfig.
func TestConfigRefused(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset()
	for _, tc := range []struct {
		name string
		cfg  Config
		id   string
	}{
		{"no name", Config{Namespace: "ns"}, "a"},
		{"no identity", short, ""},
		{"renew deadline beyond the lease", Config{Namespace: "ns", Name: "l", LeaseDuration: time.Second, RenewDeadline: 2 * time.Second}, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(context.Background(), cs.CoordinationV1(), tc.cfg, tc.id, func(context.Context) { t.Error("led") })
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("Run: %v, want ErrConfig", err)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	c := Config{}.withDefaults()
	if c.LeaseDuration != 15*time.Second || c.RenewDeadline != 10*time.Second || c.RetryPeriod != 2*time.Second {
		t.Errorf("defaults %v/%v/%v, want 15s/10s/2s", c.LeaseDuration, c.RenewDeadline, c.RetryPeriod)
	}
}

func TestIdentityUniquePerCall(t *testing.T) {
	t.Parallel()
	if a, b := Identity(), Identity(); a == b {
		t.Errorf("two identities %q", a)
	}
}
