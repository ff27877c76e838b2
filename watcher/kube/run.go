package kube

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/edgeflow/edgeflow/optimizer"
)

// dirty is what changed since the last pass: the nodes, and the services (NAMESPACE/NAME)
// an event touched. all: everything (the first pass).
type dirty struct {
	all      bool
	nodes    bool
	services map[string]bool
}

// register adds the Source's event handlers and watch-error handlers to the informers. Every
// handler only records what the event touched and returns; an update that changes nothing the
// Source reads (a node heartbeat, a pod's container status) is dropped there.
func (s *Source) register() error {
	for _, n := range s.inf.all() {
		if err := n.inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			cache.DefaultWatchErrorHandler(ctx, r, err) // client-go's own logging
			if ctx.Err() == nil {
				s.watchFailed(n.name, n.inf, err)
			}
		}); err != nil {
			// Started already by another user of shared informers: its failures still show
			// in the caches' resource versions (WatchFailures) and the API server check.
			s.log.Debug("kube: watch error handler not set", "informer", n.name, "error", err)
		}
	}
	names := map[cache.SharedIndexInformer]string{}
	for _, n := range s.inf.all() {
		names[n.inf] = n.name
	}
	add := func(inf cache.SharedIndexInformer, h cache.ResourceEventHandlerFuncs) error {
		_, err := inf.AddEventHandler(h)
		if err != nil {
			return fmt.Errorf("kube: adding event handler: %w", err)
		}
		return nil
	}
	nodeName := func(obj any) string {
		if n, ok := unwrap(obj).(*corev1.Node); ok {
			return n.Name
		}
		return ""
	}
	if err := add(s.inf.Nodes, cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { s.heard("nodes", obj, s.nodeMembership(nodeName(obj))) },
		UpdateFunc: func(old, obj any) {
			a, okA := old.(*corev1.Node)
			b, okB := obj.(*corev1.Node)
			touched := !okA || !okB || !sameNodeView(a, b)
			if touched {
				s.touch(func(d *dirty) { d.nodes = true })
			}
			s.heard("nodes", obj, touched)
		},
		DeleteFunc: func(obj any) { s.heard("nodes", obj, s.nodeMembership(nodeName(obj))) },
	}); err != nil {
		return err
	}
	for _, p := range s.inf.Pods {
		name := names[p.Informer]
		touched := func(obj any) bool {
			pod, ok := unwrap(obj).(*corev1.Pod)
			if !ok {
				return false
			}
			return s.touchServices(s.inf.slicesBy(pod.Namespace, IndexSlicePod, pod.Namespace+"/"+pod.Name))
		}
		if err := add(p.Informer, cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) { s.heard(name, obj, touched(obj)) },
			UpdateFunc: func(old, obj any) {
				a, okA := old.(*corev1.Pod)
				b, okB := obj.(*corev1.Pod)
				s.heard(name, obj, (!okA || !okB || !samePodView(a, b)) && touched(obj))
			},
			DeleteFunc: func(obj any) { s.heard(name, obj, touched(obj)) },
		}); err != nil {
			return err
		}
	}
	for _, sv := range s.inf.Services {
		name := names[sv.Informer]
		touched := func(obj any) bool {
			svc, ok := unwrap(obj).(*corev1.Service)
			return ok && s.touch(func(d *dirty) { d.services[svc.Namespace+"/"+svc.Name] = true })
		}
		if err := add(sv.Informer, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.heard(name, obj, touched(obj)) },
			UpdateFunc: func(_, obj any) { s.heard(name, obj, touched(obj)) },
			DeleteFunc: func(obj any) { s.heard(name, obj, touched(obj)) },
		}); err != nil {
			return err
		}
	}
	for _, es := range s.inf.EndpointSlices {
		name := names[es.Informer]
		touched := func(objs ...any) bool {
			var sls []*discoveryv1.EndpointSlice
			for _, o := range objs {
				if sl, ok := unwrap(o).(*discoveryv1.EndpointSlice); ok {
					sls = append(sls, sl)
				}
			}
			return s.touchServices(sls)
		}
		if err := add(es.Informer, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.heard(name, obj, touched(obj)) },
			UpdateFunc: func(old, obj any) { s.heard(name, obj, touched(old, obj)) },
			DeleteFunc: func(obj any) { s.heard(name, obj, touched(obj)) },
		}); err != nil {
			return err
		}
	}
	return nil
}

func unwrap(obj any) any {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return obj
}

// heard counts an event of an informer, clears its watch failure, and wakes Run when the event
// touched something.
func (s *Source) heard(informer string, obj any, touched bool) {
	s.events.Inc()
	s.mu.Lock()
	if f, ok := s.failures[informer]; ok {
		delete(s.failures, informer)
		s.log.Info("kube: watch recovered", "informer", informer, "failing_since", f.since)
	}
	s.mu.Unlock()
	if touched {
		s.wake.Notify()
	}
	if s.trace != nil {
		s.trace.event(obj, touched)
	}
}

// touch records a change under the lock; it returns true.
func (s *Source) touch(f func(*dirty)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.dirty)
	return true
}

// touchServices marks the services of slices dirty; false when there are none.
func (s *Source) touchServices(sls []*discoveryv1.EndpointSlice) bool {
	if len(sls) == 0 {
		return false
	}
	return s.touch(func(d *dirty) {
		for _, sl := range sls {
			if svc := sl.Labels[discoveryv1.LabelServiceName]; svc != "" {
				d.services[sl.Namespace+"/"+svc] = true
			}
		}
	})
}

// nodeMembership marks the nodes dirty, and the services with an endpoint on the node (a node
// that comes or goes makes its endpoints known or unknown).
func (s *Source) nodeMembership(node string) bool {
	s.touch(func(d *dirty) { d.nodes = true })
	s.touchServices(s.inf.slicesBy("", IndexSliceNode, node))
	return true
}

// Run starts the informers (shared ones may run already), waits for their caches, then
// delivers a State after every change until ctx is done (then it stops the informers it owns,
// waits for them and returns nil). deliver is called from Run's goroutine only and must not
// block for long. Run may be called once.
func (s *Source) Run(ctx context.Context, deliver func(*State)) error {
	ctx, cancel := context.WithCancel(ctx)
	health := make(chan struct{})
	go func() { defer close(health); s.checkAPIServer(ctx) }()
	defer func() {
		cancel()
		if s.ownInformers {
			s.inf.Stop() // waits for the informers' goroutines
		}
		<-health
	}()
	s.inf.Start(ctx)
	if err := s.inf.WaitForCacheSync(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
	s.log.Info("kube: informer caches synced", "namespaces", s.cfg.Namespaces, "selector", s.cfg.Selector)
	s.touch(func(d *dirty) { d.all = true })
	b := &builder{entries: map[string]*serviceEntry{}, maxServices: s.cfg.MaxServices}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake.C():
		}
		s.mu.Lock()
		d := s.dirty
		s.dirty = dirty{services: map[string]bool{}}
		s.mu.Unlock()
		start := time.Now()
		s.pass(b, d, deliver)
		if s.trace != nil {
			s.trace.pass(start, time.Now())
		}
	}
}

// builder holds the entries the last State was assembled from.
type builder struct {
	nodes   *nodesEntry
	entries map[string]*serviceEntry // NAMESPACE/NAME of each managed service
	last    *State
	keys    []string // last.Services' keys, in their order
	// maxServices is Config.MaxServices: the entries beyond it, by namespace then name, are
	// refused (0 or negative: none).
	maxServices int
}

// change is one service entry a pass replaced: old or new is nil where there was none.
type change struct{ old, new *serviceEntry }

// patchMax is the most changed entries a pass patches the last State with; more are assembled
// anew (each patch may shift the services, O(services)).
const patchMax = 32

// nodesEntry is what the State takes from the nodes.
type nodesEntry struct {
	list  []optimizer.Node
	addrs map[string]string
	known map[string]bool
}

// serviceEntry is one managed service as the State holds it.
type serviceEntry struct {
	key       string             // optimizer.Service.Key
	svc       *optimizer.Service // nil: no ready endpoint, left out
	workloads []Workload
	podCPU    map[string]int64 // State.PodCPU's entries of the service's pods
	skipped   map[string]int
}

// pass rebuilds what d touched and delivers a new State if any service entry changed.
func (s *Source) pass(b *builder, d dirty, deliver func(*State)) {
	s.rebuilds.Inc()
	changed := b.last == nil
	if d.all || d.nodes || b.nodes == nil {
		np := s.buildNodes()
		if b.nodes == nil || !slices.Equal(np.list, b.nodes.list) || !maps.Equal(np.addrs, b.nodes.addrs) {
			b.nodes, changed = np, true
		}
	}
	keys := d.services
	if d.all {
		keys = map[string]bool{}
		for k := range b.entries {
			keys[k] = true
		}
		for _, sc := range s.inf.Services {
			for _, obj := range sc.Informer.GetStore().List() {
				if svc, ok := obj.(*corev1.Service); ok {
					keys[svc.Namespace+"/"+svc.Name] = true
				}
			}
		}
	}
	var changes []change
	for k := range keys {
		p := s.buildEntry(k, b.nodes.known)
		old, had := b.entries[k]
		switch {
		case p == nil && !had:
		case p == nil:
			delete(b.entries, k)
			changes = append(changes, change{old: old})
		case !had || !reflect.DeepEqual(old, p):
			b.entries[k] = p
			changes = append(changes, change{old: old, new: p})
		}
	}
	if !changed && len(changes) == 0 {
		return
	}
	var st *State
	// Over the cap of managed services (now or in the last State), the services kept depend on
	// every entry: assembled anew.
	overCap := b.maxServices > 0 && len(b.entries) > b.maxServices
	if b.last == nil || d.all || len(changes) > patchMax || overCap || len(b.last.Refused) > 0 {
		st = b.assemble()
	} else {
		st = b.patch(changes)
	}
	s.logSkips(b.last, st)
	b.last = st
	s.mu.Lock()
	s.current = st
	s.mu.Unlock()
	for _, r := range skipReasons {
		s.skipped.WithLabelValues(r).Set(float64(st.Skipped[r]))
	}
	deliver(st)
}

// assemble makes a State of the cached entries: O(services), the entries shared, not copied (no
// State is modified once delivered).
func (b *builder) assemble() *State {
	st := &State{Nodes: b.nodes.list, NodeAddresses: b.nodes.addrs, Skipped: map[string]int{}}
	ps := make([]*serviceEntry, 0, len(b.entries))
	workloads := 0
	entries := b.entries
	if b.maxServices > 0 && len(entries) > b.maxServices {
		entries, st.Refused = b.capped()
		st.Skipped[SkipOverCap] = len(st.Refused)
	}
	for _, p := range entries {
		if len(p.skipped) > 0 { // most are empty: no iterator started for them
			for r, n := range p.skipped {
				st.Skipped[r] += n
			}
		}
		if p.svc != nil {
			ps = append(ps, p)
			workloads += len(p.workloads)
		}
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].key < ps[j].key })
	b.keys = make([]string, len(ps))
	for i, p := range ps {
		b.keys[i] = p.key
	}
	// Sized once: at every churn event a pass assembles the whole State, and growing these
	// (a map rehashed at each doubling, a slice of ~1,000 services copied at each) was most of
	// the churn's CPU (make bench-watch -watch.cpuprofile).
	st.Workloads = make(map[Workload][]string, workloads)
	if len(ps) > 0 {
		st.Services, st.PodCPU = make([]optimizer.Service, 0, len(ps)), make([]map[string]int64, 0, len(ps))
	}
	anyCPU := false
	for _, p := range ps {
		st.Services = append(st.Services, *p.svc)
		cpu := podCPU(p)
		anyCPU = anyCPU || cpu != nil
		st.PodCPU = append(st.PodCPU, cpu)
		for _, w := range p.workloads {
			st.Workloads[w] = append(st.Workloads[w], p.key)
		}
	}
	if !anyCPU {
		st.PodCPU = nil
	}
	for w := range st.Workloads {
		sort.Strings(st.Workloads[w])
	}
	return st
}

// patch makes a State of the last one and the entries a pass changed: the same State assemble
// would make (TestPatchIsAssemble), in O(services) copies of the last one's slices and
// O(changes) work besides — at a churn event (one pod's readiness) assemble's rebuilding of the
// workload map and its walk over every entry were most of the Source's CPU (make bench-watch
// -watch.cpuprofile). The workload map is shared with the last State unless a change moves a
// workload, and then cloned with only the changed services' lists copied.
func (b *builder) patch(changes []change) *State {
	last := b.last
	st := &State{Nodes: b.nodes.list, NodeAddresses: b.nodes.addrs, Skipped: maps.Clone(last.Skipped),
		Services: slices.Clone(last.Services), Workloads: last.Workloads}
	if last.PodCPU != nil {
		st.PodCPU = slices.Clone(last.PodCPU)
	} else {
		st.PodCPU = make([]map[string]int64, len(st.Services))
	}
	b.keys = slices.Clone(b.keys)
	cloned := false
	for _, c := range changes {
		if c.old != nil {
			for r, n := range c.old.skipped {
				if st.Skipped[r] -= n; st.Skipped[r] == 0 {
					delete(st.Skipped, r)
				}
			}
		}
		var key string
		var before, after []Workload
		if c.old != nil {
			key = c.old.key
			if c.old.svc != nil {
				before = c.old.workloads
			}
		}
		if c.new != nil {
			key = c.new.key
			for r, n := range c.new.skipped {
				st.Skipped[r] += n
			}
		}
		i, found := slices.BinarySearch(b.keys, key)
		switch live := c.new != nil && c.new.svc != nil; {
		case live && found:
			st.Services[i], st.PodCPU[i] = *c.new.svc, podCPU(c.new)
		case live:
			b.keys = slices.Insert(b.keys, i, key)
			st.Services = slices.Insert(st.Services, i, *c.new.svc)
			st.PodCPU = slices.Insert(st.PodCPU, i, podCPU(c.new))
		case found:
			b.keys = slices.Delete(b.keys, i, i+1)
			st.Services = slices.Delete(st.Services, i, i+1)
			st.PodCPU = slices.Delete(st.PodCPU, i, i+1)
		}
		if c.new != nil && c.new.svc != nil {
			after = c.new.workloads
		}
		if slices.Equal(before, after) {
			continue
		}
		if !cloned {
			st.Workloads, cloned = maps.Clone(last.Workloads), true
		}
		for _, w := range before { // a new list for each workload changed: the last State's stays
			keys := st.Workloads[w]
			if j, ok := slices.BinarySearch(keys, key); ok {
				keys = slices.Delete(slices.Clone(keys), j, j+1)
			}
			if len(keys) == 0 {
				delete(st.Workloads, w)
			} else {
				st.Workloads[w] = keys
			}
		}
		for _, w := range after {
			keys := st.Workloads[w]
			if j, ok := slices.BinarySearch(keys, key); !ok {
				st.Workloads[w] = slices.Insert(slices.Clone(keys), j, key)
			}
		}
	}
	if len(st.Services) == 0 {
		st.Services = nil
	}
	if !slices.ContainsFunc(st.PodCPU, func(m map[string]int64) bool { return m != nil }) {
		st.PodCPU = nil
	}
	return st
}

// podCPU is the entry's CPU map as a State holds it: nil when empty.
func podCPU(p *serviceEntry) map[string]int64 {
	if len(p.podCPU) == 0 {
		return nil
	}
	return p.podCPU
}

// capped splits the entries at maxServices, by namespace then name: those kept, and the keys
// (NAMESPACE/NAME) of those refused, sorted. O(services log services), only while over the cap.
func (b *builder) capped() (map[string]*serviceEntry, []string) {
	keys := slices.SortedFunc(maps.Keys(b.entries), func(x, y string) int {
		xns, xname, _ := strings.Cut(x, "/")
		yns, yname, _ := strings.Cut(y, "/")
		return cmp.Or(strings.Compare(xns, yns), strings.Compare(xname, yname))
	})
	kept := make(map[string]*serviceEntry, b.maxServices)
	for _, k := range keys[:b.maxServices] {
		kept[k] = b.entries[k]
	}
	return kept, keys[b.maxServices:]
}

// buildNodes reads every node. O(nodes).
func (s *Source) buildNodes() *nodesEntry {
	np := &nodesEntry{addrs: map[string]string{}, known: map[string]bool{}}
	for _, obj := range s.inf.Nodes.GetStore().List() {
		n, ok := obj.(*corev1.Node)
		if !ok {
			continue
		}
		a := n.Status.Allocatable
		np.list = append(np.list, optimizer.Node{Name: n.Name,
			CPU: a.Cpu().MilliValue(), Memory: a.Memory().Value() >> 20, Locality: nodeLocality(n.Labels)})
		np.known[n.Name] = true
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				if ip, err := netip.ParseAddr(a.Address); err == nil {
					np.addrs[ip.Unmap().String()] = n.Name
				}
			}
		}
	}
	sort.Slice(np.list, func(i, j int) bool { return np.list[i].Name < np.list[j].Name })
	return np
}

// buildEntry reads one service (NAMESPACE/NAME) and its EndpointSlices; nil when it is not
// managed (gone, not selected, outside the namespaces, ExternalName).
func (s *Source) buildEntry(key string, known map[string]bool) *serviceEntry {
	ns, name, _ := strings.Cut(key, "/")
	svc := s.inf.Service(ns, name)
	if svc == nil || !s.inNamespaces(ns) || svc.Spec.Type == corev1.ServiceTypeExternalName || !s.selector.Matches(labels.Set(svc.Labels)) {
		return nil
	}
	p := &serviceEntry{key: (&optimizer.Service{Name: name, Namespace: ns}).Key(), skipped: map[string]int{}}
	p.svc, p.workloads, p.podCPU = s.service(svc, known, p.skipped)
	if p.svc == nil {
		p.skipped[SkipNoReadyPods]++
		s.log.Debug("kube: managed service has no ready endpoint; left out", "service", key)
		return p
	}
	sort.Slice(p.workloads, func(i, j int) bool {
		if p.workloads[i].Namespace != p.workloads[j].Namespace {
			return p.workloads[i].Namespace < p.workloads[j].Namespace
		}
		return p.workloads[i].Name < p.workloads[j].Name
	})
	for r, n := range p.skipped {
		if n == 0 {
			delete(p.skipped, r)
		}
	}
	return p
}
