package rebalancer

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The leader keeps what must survive a leader change — moves in flight, recent moves (the
// per-period limits), cool-downs and back-offs — in one ConfigMap it owns, named after the
// Lease with the suffix "-state", in the Lease's namespace, labelled ManagedByLabel and
// ComponentLabel. A new leader reads it before it acts. It creates the ConfigMap only when it
// is missing; one created beforehand (the Helm chart's, so that the rebalancer needs no create
// permission) is updated, keeping the labels and annotations found on it.
const (
	stateSuffix = "-state"
	stateKey    = "state.json"
	// ManagedByLabel = ManagedByValue marks what edgeflow's rebalancer creates (its state
	// ConfigMap, its webhook registration); uninstall removes only what carries it.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "edgeflow"
	ComponentLabel = "app.kubernetes.io/component"
	ComponentValue = "rebalancer"
)

// Outcomes of a move record.
const (
	outcomeInFlight = ""       // evicted (or about to be); the replacement not placed yet
	outcomePlaced   = "placed" // the replacement was released to its planned node
	outcomeUnplaced = "unplaced"
	outcomeFailed   = "failed" // the replacement stayed Pending past the placement timeout
)

// moveRecord is one move the leader carried out (or is carrying out).
//
// Its keys are the state's since its first release, camelCase podUID and costAfter among them,
// not the snake_case of what edgeflow prints: the state passes from one leader to the next,
// across an upgrade or a downgrade, and a key renamed would have to be read under both names
// for as long as a record may hold it (TestStateKeys pins them).
type moveRecord struct {
	recordedMove
	PodUID types.UID `json:"podUID"`
	// Owner is the UID of the pod's controller (ReplicaSet, StatefulSet), OwnerKind and
	// OwnerName its kind and name: the replacement is the next new pod in the move's namespace
	// whose controller reference names the same kind, name and UID (owns). A UID alone is not
	// proof: any pod may carry an owner reference with a UID copied from another object.
	Owner       types.UID `json:"owner"`
	OwnerKind   string    `json:"ownerKind,omitempty"`
	OwnerName   string    `json:"ownerName,omitempty"`
	Requests    resources `json:"requests"`
	Evicted     time.Time `json:"evicted"`
	Outcome     string    `json:"outcome,omitempty"`
	Replacement types.UID `json:"replacement,omitempty"`
}

// recordedMove is a Move as the state records it: Move's fields (Move converts to it, so a
// field added to Move must be added here) under the keys they had when the state was first
// written, while Move's printed keys are snake_case.
type recordedMove struct {
	Namespace string  `json:"namespace"`
	Service   string  `json:"service"`
	Pod       string  `json:"pod"`
	From      string  `json:"from"`
	To        string  `json:"to"`
	CostAfter float64 `json:"costAfter"`
	Action    string  `json:"action"`
	Reason    string  `json:"reason,omitempty"`
}

type leftRecord struct {
	Service string    `json:"service"`
	Node    string    `json:"node"`
	At      time.Time `json:"at"`
}

type backoffState struct {
	Until time.Time     `json:"until"`
	Delay time.Duration `json:"delay"`
}

// state is what a leader hands to the next.
type state struct {
	Moves []moveRecord `json:"moves,omitempty"`
	// Placed: replacements placed by a move → when (their cool-down, and the proof that
	// edgeflow placed them: only these are deleted past the placement timeout).
	Placed map[types.UID]time.Time `json:"placed,omitempty"`
	// Left: (service, node a move left) → when (no move of the service back there).
	Left    []leftRecord               `json:"left,omitempty"`
	Backoff map[types.UID]backoffState `json:"backoff,omitempty"`
}

func newState() state {
	return state{Placed: map[types.UID]time.Time{}, Backoff: map[types.UID]backoffState{}}
}

// inFlight returns the index of the oldest move in flight whose replacement a pod in namespace
// ns controlled by owner would be, or -1.
func (s *state) inFlight(ns string, owner *metav1.OwnerReference) int {
	for i := range s.Moves {
		if s.Moves[i].Outcome == outcomeInFlight && s.Moves[i].owns(ns, owner) {
			return i
		}
	}
	return -1
}

// owns says whether a pod in namespace ns controlled by owner is of the move's owner: the same
// namespace, kind, name and UID. A record of a release before kind and name were recorded owns
// no pod (its replacement is scheduled as any pod).
func (m *moveRecord) owns(ns string, owner *metav1.OwnerReference) bool {
	return owner != nil && m.OwnerKind != "" && m.OwnerName != "" && ns == m.Namespace &&
		owner.UID == m.Owner && owner.Kind == m.OwnerKind && owner.Name == m.OwnerName
}

// serviceInFlight says whether a move of the service is in flight.
func (s *state) serviceInFlight(service string) bool {
	return slices.ContainsFunc(s.Moves, func(m moveRecord) bool { return m.Outcome == outcomeInFlight && m.Service == service })
}

func (s *state) leftAt(service, node string) (time.Time, bool) {
	for _, l := range s.Left {
		if l.Service == service && l.Node == node {
			return l.At, true
		}
	}
	return time.Time{}, false
}

func (s *state) setLeft(service, node string, at time.Time) {
	s.Left = slices.DeleteFunc(s.Left, func(l leftRecord) bool { return l.Service == service && l.Node == node })
	s.Left = append(s.Left, leftRecord{service, node, at})
}

// expire forgets what no rule reads any more: cool-downs and back-offs that are over (a
// placement is kept for its placement timeout and a period at least, the proof that edgeflow
// placed the pod, which syncPlacing reads), moves done longer than a period ago (the per-period
// limits read the others), and moves in flight whose replacement never came (twice the gate
// timeout and the placement timeout).
//
// A record dated after now (another leader's clock ahead, or a state written by hand) is taken
// as made now, so it expires as any other instead of never: times are clamped to now, and a
// back-off to now plus its longest delay, the period.
func (s *state) expire(now time.Time, cfg *Config) {
	s.clampFuture(now, cfg)
	keep := max(cfg.Cooldown, cfg.PlacementTimeout+cfg.Period)
	for uid, at := range s.Placed {
		if now.Sub(at) >= keep {
			delete(s.Placed, uid)
		}
	}
	s.Left = slices.DeleteFunc(s.Left, func(l leftRecord) bool { return now.Sub(l.At) >= cfg.Cooldown })
	for uid, b := range s.Backoff {
		if !now.Before(b.Until) && now.Sub(b.Until) > cfg.Period {
			delete(s.Backoff, uid)
		}
	}
	for i := range s.Moves {
		if m := &s.Moves[i]; m.Outcome == outcomeInFlight && now.Sub(m.Evicted) > 2*cfg.GateTimeout+cfg.PlacementTimeout {
			m.Outcome = outcomeUnplaced
		}
	}
	s.Moves = slices.DeleteFunc(s.Moves, func(m moveRecord) bool {
		return m.Outcome != outcomeInFlight && now.Sub(m.Evicted) >= cfg.Period
	})
}

// clampFuture brings the times of s that lie in the future back to now (a back-off's end to
// now + cfg.Period at most, its delay to cfg.Period at most).
func (s *state) clampFuture(now time.Time, cfg *Config) {
	for uid, at := range s.Placed {
		if at.After(now) {
			s.Placed[uid] = now
		}
	}
	for i := range s.Left {
		if s.Left[i].At.After(now) {
			s.Left[i].At = now
		}
	}
	for uid, b := range s.Backoff {
		if latest := now.Add(cfg.Period); b.Until.After(latest) || b.Delay > cfg.Period {
			if b.Until.After(latest) {
				b.Until = latest
			}
			b.Delay = min(b.Delay, cfg.Period)
			s.Backoff[uid] = b
		}
	}
	for i := range s.Moves {
		if s.Moves[i].Evicted.After(now) {
			s.Moves[i].Evicted = now
		}
	}
}

// stateStore reads and writes the state ConfigMap.
type stateStore struct {
	namespace, name string
	mu              sync.Mutex // one read or write at a time (the leader loop's and the writer's)
	rv              string     // resourceVersion last read or written
	exists          bool       // the ConfigMap existed at the last read or write
	// labels and annotations of the ConfigMap last read or written (an update keeps them)
	labels, annotations map[string]string
}

// seen records the ConfigMap last read or written (nil: there is none).
func (s *stateStore) seen(cm *corev1.ConfigMap) {
	if cm == nil {
		s.rv, s.exists, s.labels, s.annotations = "", false, nil, nil
		return
	}
	s.rv, s.exists, s.labels, s.annotations = cm.ResourceVersion, true, cm.Labels, cm.Annotations
}

// load reads the state (an empty one when the ConfigMap does not exist).
func (c *Controller) loadState(ctx context.Context) (state, error) {
	c.store.mu.Lock()
	defer c.store.mu.Unlock()
	st := newState()
	cm, err := c.cs.CoreV1().ConfigMaps(c.store.namespace).Get(ctx, c.store.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		c.store.seen(nil)
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("rebalancer: reading the state %s/%s: %w", c.store.namespace, c.store.name, err)
	}
	c.store.seen(cm)
	if data := cm.Data[stateKey]; data != "" {
		if err := json.Unmarshal([]byte(data), &st); err != nil {
			return newState(), fmt.Errorf("rebalancer: the state %s/%s is not readable: %w", c.store.namespace, c.store.name, err)
		}
	}
	if st.Placed == nil {
		st.Placed = map[types.UID]time.Time{}
	}
	if st.Backoff == nil {
		st.Backoff = map[types.UID]backoffState{}
	}
	return st, nil
}

// saveState writes the state; only the leader calls it. A conflict (a write by a leader
// before it) is resolved by this leader's state, which read that one first.
func (c *Controller) saveState(ctx context.Context) error {
	c.store.mu.Lock()
	defer c.store.mu.Unlock()
	c.mu.Lock()
	data, err := json.Marshal(&c.st)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		labels := maps.Clone(c.store.labels)
		if labels == nil {
			labels = map[string]string{}
		}
		labels[ManagedByLabel], labels[ComponentLabel] = ManagedByValue, ComponentValue
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: c.store.namespace, Name: c.store.name,
			ResourceVersion: c.store.rv, Labels: labels, Annotations: c.store.annotations},
			Data: map[string]string{stateKey: string(data)}}
		var out *corev1.ConfigMap
		if !c.store.exists {
			out, err = c.cs.CoreV1().ConfigMaps(c.store.namespace).Create(ctx, cm, metav1.CreateOptions{})
		} else {
			out, err = c.cs.CoreV1().ConfigMaps(c.store.namespace).Update(ctx, cm, metav1.UpdateOptions{})
		}
		if err == nil {
			c.store.seen(out)
			return nil
		}
		if attempt > 0 || !(apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)) {
			return fmt.Errorf("rebalancer: writing the state %s/%s: %w", c.store.namespace, c.store.name, err)
		}
		cur, gerr := c.cs.CoreV1().ConfigMaps(c.store.namespace).Get(ctx, c.store.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(gerr):
			c.store.seen(nil)
		case gerr != nil:
			return fmt.Errorf("rebalancer: writing the state %s/%s: %w", c.store.namespace, c.store.name, gerr)
		default:
			c.store.seen(cur)
		}
	}
}
