// Package watcher turns the world into optimizer.Topology snapshots and tells a Listener when
// they change. File follows a topology file; the cluster sources (Kubernetes informers,
// Prometheus latency queries) plug into the same seam. Watchers know nothing of xDS.
package watcher

import "github.com/edgeflow/edgeflow/optimizer"

// Listener receives topologies. Update must not block for long (the xDS server's never does)
// and must not modify the topology, which the watcher hands over and never touches again.
type Listener interface {
	Update(*optimizer.Topology)
}

// CompiledListener is a Listener that plans: it is handed, with each topology, the model the
// watcher compiled it to (with the consumers' options), so that it does not compile it again.
type CompiledListener interface {
	Listener
	UpdateCompiled(*optimizer.Topology, *optimizer.Compiled)
}

// Deliver hands t to l, with the model it was compiled to when l plans (cm nil: none).
func Deliver(l Listener, t *optimizer.Topology, cm *optimizer.Compiled) {
	if cl, ok := l.(CompiledListener); ok && cm != nil {
		cl.UpdateCompiled(t, cm)
		return
	}
	l.Update(t)
}
