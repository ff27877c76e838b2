package main

import (
	"bytes"
	"fmt"
	"math/rand"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// The benchmark's topology: callers on nodeGroups caller nodes c0…c9, the callee's pods on
// nodeGroups callee nodes e0…e9 (calleePods/nodeGroups each), call caller → callee.
const (
	nodeGroups  = 10
	calleePods  = 50 // endpoints per ClusterLoadAssignment (K), on both sides of the benchmark
	callerSvc   = "caller"
	calleeSvc   = "callee" // also the Listener, route, cluster and EDS name a caller resolves
	calleeIPNet = "10.1"
)

// benchTopology writes the topology file of n caller pods for round r (flow-style YAML, as
// examples/bookinfo.yaml). Round r rotates the latencies: caller node c_i is nearest
// (1 ms + noise) to callee node e_((i+r) mod 10), and each step of cyclic distance adds 2 ms, so
// LATA (whose supplies and demands match node for node: n/10 callers, 5 callee pods per node)
// sends every caller's traffic to other pods than in round r-1. The noise (0…0.4 ms, seeded by
// r) makes every round's latencies distinct even when a rotation repeats.
func benchTopology(n, r int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# e2e/pushbench: %d caller pods on %d nodes, %d callee pods on %d nodes, rotation %d\nnodes:\n",
		n, nodeGroups, calleePods, nodeGroups, r)
	for i := 0; i < nodeGroups; i++ {
		fmt.Fprintf(&b, "  - {name: c%d}\n  - {name: e%d}\n", i, i)
	}
	b.WriteString("latency:\n")
	rng := rand.New(rand.NewSource(int64(r) + 1))
	for i := 0; i < nodeGroups; i++ {
		for j := 0; j < nodeGroups; j++ {
			d := ((i+r)%nodeGroups - j + nodeGroups) % nodeGroups
			d = min(d, nodeGroups-d)
			fmt.Fprintf(&b, "  - {from: c%d, to: e%d, ms: %.3f}\n", i, j, 1+2*float64(d)+0.4*rng.Float64())
		}
		for j := i + 1; j < nodeGroups; j++ {
			fmt.Fprintf(&b, "  - {from: c%d, to: c%d, ms: 1}\n  - {from: e%d, to: e%d, ms: 1}\n", i, j, i, j)
		}
	}
	fmt.Fprintf(&b, "services:\n  - name: %s\n    pods:\n", callerSvc)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "      - {name: %s, node: c%d}\n", callerPod(i), i%nodeGroups)
	}
	fmt.Fprintf(&b, "  - name: %s\n    pods:\n", calleeSvc)
	for j := 0; j < calleePods; j++ {
		fmt.Fprintf(&b, "      - {name: %s-%d, node: e%d, address: \"%s.%d.%d:8080\"}\n", calleeSvc, j, j%nodeGroups, calleeIPNet, j>>8, j&255)
	}
	fmt.Fprintf(&b, "calls:\n  - {from: %s, to: %s}\ningress:\n  - {service: %s, rps: %d}\n", callerSvc, calleeSvc, callerSvc, n)
	return b.Bytes()
}

// callerPod is the name of caller pod i: its xDS node id.
func callerPod(i int) string { return fmt.Sprintf("%s-%d", callerSvc, i) }

// expectedEDS parses a topology file as the servers do and returns, per caller pod, the EDS
// version both servers will publish for it: the version xds.Translate gives the pod's
// ClusterLoadAssignment set under LATA and the locality encoding (content-addressed, so the
// same in every process).
func expectedEDS(file []byte, n int) ([]string, error) {
	t, err := optimizer.ParseTopology(bytes.NewReader(file), "benchmark topology")
	if err != nil {
		return nil, err
	}
	m, err := optimizer.Compile(t, optimizer.Options{})
	if err != nil {
		return nil, err
	}
	a, err := optimizer.Plan(m, optimizer.LATA)
	if err != nil {
		return nil, err
	}
	tr, err := xds.Translate(t, a, xds.EncodingLocality)
	if err != nil {
		return nil, err
	}
	out := make([]string, n)
	for i := range out {
		res, ok := tr.Pods[callerPod(i)]
		if !ok || res.Assignment(calleeSvc) == nil {
			return nil, fmt.Errorf("pushbench: translation has no assignment %q for pod %s", calleeSvc, callerPod(i))
		}
		out[i] = res.Sets[xds.EndpointSet].Version
	}
	return out, nil
}
