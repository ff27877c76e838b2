// Package server is edgeflow's ADS server: it serves the resources the translator (package
// xds) makes from each published allocation, one snapshot per connected xDS node, over
// go-control-plane's SOTW and delta servers, with debounced, make-before-break pushes.
//
// The package keeps go-control-plane's split: package xds says what to send (as its
// pkg/cache/v3), this package runs the protocol (as its pkg/server/v3). Its files, by owner:
//
//   - server.go: Server, Config, Update and Run (the debounce loop, one publication at a time),
//     the sharded snapshot caches, convergence (WaitPublished, WaitConverged).
//   - publication.go: one published topology, its translation and what every node shares of
//     it (interned resource sets, wire forms, versions, the pod-identity index); immutable once
//     made except for those memo tables.
//   - node.go: per-node state (nodeState): the sets the node holds and has held, its NACK
//     fallback, and how a publication is driven through it (refresh, advance, write, settle).
//   - steps.go: make before break: the next snapshot a node may take given what its streams
//     hold and have ACKed, and which clusters its routes and listeners still name.
//   - stream.go: per-stream state: ACK/NACK tracking, the sets held per stream, the
//     subscription (SOTW names or delta subscribe/unsubscribe).
//   - callbacks.go: go-control-plane's callbacks: streams opened, admitted and closed;
//     requests and responses of SOTW and delta streams.
//   - sotw.go: the SOTW watches (CreateWatch and Fetch) answered from the node's state.
//   - identity.go: the pod identity a client's certificate proves against the one its node id
//     claims; limits.go: the bounds on connections, streams and requests; grace.go: the
//     removal grace; metrics.go; log.go.
//
// Goroutines: Run owns the debounce loop and every publication (publish runs on it, one at a
// time); go-control-plane runs one goroutine per stream, which call the callbacks and watches.
// Nothing else starts a goroutine, and every stream ends when Run's context ends.
//
// Lock order (a lock may be taken while holding the ones before it, never the ones after):
//
//	Server.nodesMu → nodeState.mu → publication.internMu → the snapshot cache's own lock
//
// Server.mu (latest topology), Server.signalMu (wait channels) and Server.refusedMu (log rate)
// are leaves: nothing else is locked while one of them is held.
package server
