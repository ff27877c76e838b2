package app

import (
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"
)

// serveCores serves n on a Unix socket in the test's folder until the test ends, and returns its
// path.
func serveCores(t *testing.T, n *NodeCPU) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cores.sock")
	stop, err := StartNodeCPU(path, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("ServeNodeCPU: %v", err)
		}
	})
	return path
}

func dialCores(t *testing.T, path string) *NodeCPU {
	t.Helper()
	n, err := DialNodeCPU("n1", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// Pods whose node's cores are served across a socket (each pod its own process on the netns
// testbed) are scheduled exactly as pods sharing the NodeCPU in one process: three pods of 1–2
// workers on a 2-core node at speed 0.8, 300 random arrivals offered ~1.3 cores, the same start
// and finish for every request either way, and requests do queue for the cores.
func TestNodeCPUServedAcrossASocket(t *testing.T) {
	t.Parallel()
	cfg := NodeConfig{Name: "n1", Cores: 2, Speed: 0.8}
	local := newNode(t, cfg)
	path := serveCores(t, newNode(t, cfg))
	remote := [3]*NodeCPU{dialCores(t, path), dialCores(t, path), dialCores(t, path)}
	workers := [3]int{1, 2, 1}
	var lq, rq [3]*workerQueue
	for k := range 3 {
		lq[k], rq[k] = newWorkerQueue(workers[k]), newWorkerQueue(workers[k])
	}
	r := rand.New(rand.NewPCG(1, 2))
	arrival := time.Unix(5000, 0)
	queued := 0
	for i := range 300 {
		arrival = arrival.Add(time.Duration(r.ExpFloat64() * float64(4*time.Millisecond)))
		k, service := r.IntN(3), time.Duration(r.ExpFloat64()*float64(4*time.Millisecond))
		ls, lf := admit(lq[k], local, arrival, service)
		rs, rf := admit(rq[k], remote[k], arrival, service)
		if !ls.Equal(rs) || !lf.Equal(rf) {
			t.Fatalf("request %d of pod %d: across the socket it runs %v–%v, in one process %v–%v", i, k, rs, rf, ls, lf)
		}
		if ls.After(arrival) {
			queued++
		}
	}
	if queued == 0 {
		t.Fatal("no request queued: the test offered too little load to tell cores apart")
	}
}

// When the node's core server goes away, a pod's requests take no core (its own workers still
// bind) and never block.
func TestNodeCPUServerGone(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "cores.sock")
	stop, err := StartNodeCPU(path, newNode(t, NodeConfig{Name: "n1", Cores: 1}))
	if err != nil {
		t.Fatal(err)
	}
	n := dialCores(t, path)
	q := newWorkerQueue(2)
	t0 := time.Unix(100, 0)
	if _, f := admit(q, n, t0, 10*time.Millisecond); !f.Equal(t0.Add(10 * time.Millisecond)) {
		t.Fatalf("first request finishes at %v", f)
	}
	if s, _ := admit(q, n, t0, 10*time.Millisecond); !s.Equal(t0.Add(10 * time.Millisecond)) {
		t.Fatalf("second request on the 1-core node starts at %v, want after the first", s)
	}
	if err := stop(); err != nil {
		t.Fatalf("ServeNodeCPU: %v", err)
	}
	s, f := admit(q, n, t0.Add(time.Second), 10*time.Millisecond)
	if want := t0.Add(time.Second); !s.Equal(want) || !f.Equal(want.Add(10*time.Millisecond)) {
		t.Fatalf("with the server gone a request runs %v–%v, want %v and 10 ms (no core to wait for)", s, f, want)
	}
}
