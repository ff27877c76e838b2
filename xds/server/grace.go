package server

import (
	"time"
)

// Removal grace. Make before break keeps a cluster while a route or listener the client may
// hold names it. That is not quite enough for a client with RPCs in flight: grpc-go ACKs new
// routes as soon as it has applied them, but an RPC that picked its route from the old ones
// may not have picked its endpoint yet, and when the cluster it named is then removed the RPC
// fails ("resource … has been removed"). So a cluster (and its endpoints) that no longer has
// a route naming it stays for Config.RemovalGrace after that moment, then leaves in a step of
// its own. The grace does not hold back the publication's convergence: the node has its
// target's routes, and the late step is not counted as a push.

// keptForGraceLocked reports whether the cluster name, which nothing the client may hold
// names any more, is still within its removal grace; the first time it is asked for a name it
// starts the grace and arranges for the node to be advanced when it ends. n.mu is held.
func (s *Server) keptForGraceLocked(n *nodeState, name string) bool {
	if s.cfg.RemovalGrace <= 0 {
		return false
	}
	now := s.clock.Now()
	until, ok := n.leaving[name]
	if !ok {
		if n.leaving == nil {
			n.leaving = map[string]time.Time{}
		}
		until = now.Add(s.cfg.RemovalGrace)
		n.leaving[name] = until
		s.wakeAtLocked(n, until)
	}
	if now.Before(until) {
		return true
	}
	delete(n.leaving, name)
	return false
}

// wakeAtLocked makes sure the node is advanced at t (or earlier). n.mu is held.
func (s *Server) wakeAtLocked(n *nodeState, t time.Time) {
	if n.graceTimer != nil && !n.graceAt.After(t) {
		return
	}
	if n.graceTimer != nil {
		n.graceTimer.Stop()
	}
	n.graceAt = t
	// The callback goes on in a goroutine of its own: a fake clock calls it from Step with its
	// lock held, and advancing the node reads the clock (time.AfterFunc already runs it apart).
	n.graceTimer = s.clock.AfterFunc(t.Sub(s.clock.Now()), func() { go s.graceEnded(n) })
}

// graceEnded advances the node when a removal grace has ended, and wakes it again for the
// names whose grace has not.
func (s *Server) graceEnded(n *nodeState) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.graceTimer = nil
	if n.closed {
		return
	}
	s.advanceLocked(n)
	// Names whose grace has not ended (they started later) need another wake-up.
	var next time.Time
	for _, until := range n.leaving {
		if next.IsZero() || until.Before(next) {
			next = until
		}
	}
	if !next.IsZero() {
		s.wakeAtLocked(n, next)
	}
}

// stopGraceLocked stops the node's grace timer (its last stream closed). n.mu is held.
func (n *nodeState) stopGraceLocked() {
	if n.graceTimer != nil {
		n.graceTimer.Stop()
		n.graceTimer = nil
	}
	n.leaving = nil
}

// forgetGraceLocked ends the grace of a cluster that is named again. n.mu is held.
func (n *nodeState) forgetGraceLocked(name string) {
	delete(n.leaving, name)
}
