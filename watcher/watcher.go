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
