package app

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

func newNode(t *testing.T, cfg NodeConfig) *NodeCPU {
	t.Helper()
	n, err := NewNodeCPU(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestNodeCPUContention: two pods of one worker each, 10 ms per request, each offered a request
// every 16 ms (62.5 % of a core). Alone on a node, or on two nodes, no request waits; together
// on one 1-core node they offer 125 % of it: requests queue, and the pair serves one core's
// worth (the last request finishes no earlier than 2 × 100 × 10 ms after the first arrival).
func TestNodeCPUContention(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	const (
		n       = 100
		service = 10 * time.Millisecond
		every   = 16 * time.Millisecond
	)
	// run offers both pods their arrivals, interleaved, and returns the mean wait per pod and
	// the last finish.
	run := func(nodeA, nodeB *NodeCPU) (waits [2]time.Duration, last time.Time) {
		queues := [2]*workerQueue{newWorkerQueue(1), newWorkerQueue(1)}
		nodes := [2]*NodeCPU{nodeA, nodeB}
		for i := range n {
			for k := range 2 {
				arrival := t0.Add(time.Duration(i)*every + time.Duration(k)*time.Millisecond)
				start, finish := admit(queues[k], nodes[k], arrival, service)
				waits[k] += start.Sub(arrival) / n
				last = later(last, finish)
			}
		}
		return waits, last
	}
	shared := newNode(t, NodeConfig{Name: "n1", Cores: 1})
	if waits, _ := run(newNode(t, NodeConfig{Name: "n1", Cores: 1}), newNode(t, NodeConfig{Name: "n2", Cores: 1})); waits != [2]time.Duration{} {
		t.Errorf("one pod per 1-core node: mean waits %v, want none (62.5 %% of a core each)", waits)
	}
	if waits, _ := run(nil, nil); waits != [2]time.Duration{} {
		t.Errorf("no node CPU: mean waits %v, want none", waits)
	}
	waits, last := run(shared, shared)
	if waits[0]+waits[1] < 10*service {
		t.Errorf("two pods on one 1-core node: mean waits %v, want them to queue (125 %% of the core)", waits)
	}
	if got, want := last.Sub(t0), 2*n*service; got < want {
		t.Errorf("two pods on one core served %d requests by %v, faster than one core can (%v)", 2*n, got, want)
	}
}

// TestNodeCPUSpeedHalvesCapacity: a pod of 2 workers on a 2-core node, 40 requests at once, 10
// ms each: at speed 1 the last finishes after 200 ms, at speed 0.5 after 400 ms, each request
// holding its core for 20 ms.
func TestNodeCPUSpeedHalvesCapacity(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	const n, service = 40, 10 * time.Millisecond
	for _, c := range []struct {
		speed    float64
		makespan time.Duration
	}{{1, 200 * time.Millisecond}, {0, 200 * time.Millisecond}, {0.5, 400 * time.Millisecond}, {2, 100 * time.Millisecond}} {
		node := newNode(t, NodeConfig{Name: "n1", Cores: 2, Speed: c.speed})
		q := newWorkerQueue(2)
		var last time.Time
		for range n {
			start, finish := admit(q, node, t0, service)
			if held, want := finish.Sub(start), node.scale(service); held != want {
				t.Errorf("speed %v: a request held its core %v, want %v", c.speed, held, want)
			}
			last = later(last, finish)
		}
		if got := last.Sub(t0); got != c.makespan {
			t.Errorf("speed %v: %d requests served in %v, want %v", c.speed, n, got, c.makespan)
		}
	}
	// Unlimited cores still run at the node's speed.
	node := newNode(t, NodeConfig{Name: "n1", Speed: 0.5})
	if start, finish := admit(newWorkerQueue(1), node, t0, service); finish.Sub(start) != 2*service {
		t.Errorf("unlimited cores at speed 0.5: held %v, want %v", finish.Sub(start), 2*service)
	}
}

// TestNodeCPUAmpleCoresChangeNothing: with as many cores as the node's pods have workers, the
// shared schedule is every pod's own (a seeded random M/M/c mix of three pods).
func TestNodeCPUAmpleCoresChangeNothing(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	t0 := time.Unix(1000, 0)
	workers := []int{1, 2, 3}
	for _, cores := range []int{6, 7} {
		node := newNode(t, NodeConfig{Name: "n1", Cores: cores})
		shared := make([]*workerQueue, len(workers))
		alone := make([]*workerQueue, len(workers))
		for i, w := range workers {
			shared[i], alone[i] = newWorkerQueue(w), newWorkerQueue(w)
		}
		now := t0
		for i := range 5000 {
			now = now.Add(time.Duration(rng.ExpFloat64() * float64(time.Millisecond)))
			k := rng.IntN(len(workers))
			service := time.Duration(rng.ExpFloat64() * float64(time.Duration(workers[k])*time.Millisecond)) // ~ full load
			s1, f1 := admit(shared[k], node, now, service)
			s2, f2 := alone[k].admit(now, service)
			if !s1.Equal(s2) || !f1.Equal(f2) {
				t.Fatalf("%d cores, request %d of pod %d: shared start %v finish %v, alone %v and %v", cores, i, k,
					s1.Sub(t0), f1.Sub(t0), s2.Sub(t0), f2.Sub(t0))
			}
		}
	}
}

func TestNewNodeCPUValidates(t *testing.T) {
	t.Parallel()
	for _, cfg := range []NodeConfig{{Name: "n", Cores: -1}, {Name: "n", Speed: -1}, {Name: "n", Speed: math.Inf(1)}} {
		if _, err := NewNodeCPU(cfg); err == nil {
			t.Errorf("NewNodeCPU(%+v): want an error", cfg)
		}
	}
}

// TestPodsShareNodeCores: two pods (one worker each) on one 1-core node, 100 ms per request,
// one request to each at once: the second finishes no earlier than 200 ms, and each pod's busy
// time is its own 100 ms.
func TestPodsShareNodeCores(t *testing.T) {
	const service = 100 * time.Millisecond
	node := newNode(t, NodeConfig{Name: "n1", Cores: 1})
	pods := [2]*Pod{
		newPod(t, Config{Name: "a-0", Node: "n1", Workers: 1, ServiceTime: Fixed(service), NodeCPU: node}),
		newPod(t, Config{Name: "b-0", Node: "n1", Workers: 1, ServiceTime: Fixed(service), NodeCPU: node}),
	}
	var lat [2]time.Duration
	var errs [2]error
	var wg sync.WaitGroup
	start := time.Now()
	for i, p := range pods {
		conn := serve(t, p)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = Call(context.Background(), conn, "", "")
			lat[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i := range pods {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if got := pods[i].BusyTime(); got != service {
			t.Errorf("%s: busy %v, want %v", pods[i].Name(), got, service)
		}
	}
	if slower := max(lat[0], lat[1]); slower < 2*service {
		t.Errorf("latencies %v: both pods served at once on one core", lat)
	}
}

// BenchmarkAdmit admits requests of 4 pods (2 workers each) onto a shared 4-core node.
func BenchmarkAdmit(b *testing.B) {
	node, err := NewNodeCPU(NodeConfig{Name: "n1", Cores: 4, Speed: 0.8})
	if err != nil {
		b.Fatal(err)
	}
	var queues [4]*workerQueue
	for i := range queues {
		queues[i] = newWorkerQueue(2)
	}
	t0 := time.Unix(1000, 0)
	b.ResetTimer()
	for i := range b.N {
		admit(queues[i%len(queues)], node, t0.Add(time.Duration(i)*time.Millisecond), 3*time.Millisecond)
	}
}
