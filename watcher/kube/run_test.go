package kube

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/edgeflow/edgeflow/optimizer"
)

// A pass that patches the last State with the entries it changed makes the State assemble makes
// of every entry: on random sequences of services appearing, changing (pods, CPU requests,
// workloads, skips), losing their last ready pod and going, and the last States delivered are
// never modified by the passes after them.
func TestPatchIsAssemble(t *testing.T) {
	t.Parallel()
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 7))
		nodes := &nodesEntry{list: []optimizer.Node{{Name: "n1"}}, addrs: map[string]string{"10.0.0.1": "n1"}}
		b := &builder{nodes: nodes, entries: map[string]*serviceEntry{}}
		names := 3 + r.IntN(20)
		b.last = b.assemble()
		var delivered []*State
		var copies []*State
		for step := range 40 {
			var changes []change
			touched := map[string]bool{}
			for range 1 + r.IntN(4) {
				k := fmt.Sprintf("ns%d/svc%d", r.IntN(3), r.IntN(names))
				if touched[k] {
					continue
				}
				touched[k] = true
				old := b.entries[k]
				p := randomEntry(r, k)
				if p == nil {
					if old == nil {
						continue
					}
					delete(b.entries, k)
				} else {
					b.entries[k] = p
				}
				changes = append(changes, change{old: old, new: p})
			}
			got := b.patch(changes)
			want := (&builder{nodes: nodes, entries: b.entries}).assemble()
			if !reflect.DeepEqual(want, got) { // nil and empty told apart too
				t.Fatalf("seed %d step %d: patch differs from assemble (-assemble +patch):\n%s\nservices nil %v/%v, pod cpu nil %v/%v",
					seed, step, cmp.Diff(want, got), want.Services == nil, got.Services == nil, want.PodCPU == nil, got.PodCPU == nil)
			}
			b.last = got
			delivered = append(delivered, got)
			copies = append(copies, deepCopyState(got))
		}
		for i := range delivered {
			if !reflect.DeepEqual(copies[i], delivered[i]) {
				diff := cmp.Diff(copies[i], delivered[i])
				t.Fatalf("seed %d: the State of step %d was modified after it was delivered:\n%s", seed, i, diff)
			}
		}
	}
}

// randomEntry is a service entry for key (NAMESPACE/NAME) as buildEntry might make it; nil: the
// service is gone.
func randomEntry(r *rand.Rand, key string) *serviceEntry {
	if r.IntN(5) == 0 {
		return nil
	}
	ns, name, _ := strings.Cut(key, "/")
	svc := optimizer.Service{Name: name, Namespace: ns}
	p := &serviceEntry{key: svc.Key(), skipped: map[string]int{}}
	if r.IntN(6) == 0 { // no ready pod
		p.skipped[SkipNoReadyPods] = 1
		return p
	}
	if r.IntN(3) == 0 {
		p.skipped[SkipNotReady] = 1 + r.IntN(3)
	}
	for i := range 1 + r.IntN(3) {
		svc.Pods = append(svc.Pods, optimizer.Pod{Name: fmt.Sprintf("%s-%d", name, i), Node: "n1"})
	}
	p.svc = &svc
	if r.IntN(2) == 0 {
		p.podCPU = map[string]int64{ns + "/" + svc.Pods[0].Name: 100 * int64(1+r.IntN(5))}
	} else if r.IntN(2) == 0 {
		p.podCPU = map[string]int64{}
	}
	seen := map[int]bool{}
	for range 1 + r.IntN(2) {
		w := r.IntN(4)
		if !seen[w] {
			seen[w] = true
			p.workloads = append(p.workloads, Workload{Name: fmt.Sprintf("w%d", w), Namespace: ns})
		}
	}
	if len(p.workloads) == 2 && p.workloads[1].Name < p.workloads[0].Name {
		p.workloads[0], p.workloads[1] = p.workloads[1], p.workloads[0]
	}
	return p
}

func deepCopyState(st *State) *State {
	c := *st
	c.Services = append([]optimizer.Service(nil), st.Services...)
	c.PodCPU = append([]map[string]int64(nil), st.PodCPU...)
	c.Workloads = map[Workload][]string{}
	for w, keys := range st.Workloads {
		c.Workloads[w] = append([]string(nil), keys...)
	}
	c.Skipped = map[string]int{}
	for r, n := range st.Skipped {
		c.Skipped[r] = n
	}
	return &c
}
