// Package kube is edgeflow's Kubernetes input: client-go shared informers on Nodes, Pods,
// Services and EndpointSlices (Informers, one set per process, shared with the rebalancer),
// turned into an immutable State — the nodes with their
// allocatable resources, and the managed services with their ready endpoints. It knows nothing
// of Prometheus or xDS.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/edgeflow/edgeflow/internal/latest"
	"github.com/edgeflow/edgeflow/optimizer"
)

// DefaultHealthInterval is Config.HealthInterval's default.
const DefaultHealthInterval = 5 * time.Second

// ManagedLabel marks a Service whose traffic edgeflow manages ("true").
const ManagedLabel = "edgeflow.io/managed"

// DefaultSelector is the default label selector of managed Services.
const DefaultSelector = ManagedLabel + "=true"

// Config configures a Source.
type Config struct {
	// Client reaches the cluster; unused when Informers is given.
	Client kubernetes.Interface
	// Informers are the process's shared informers (NewInformers, on Namespaces); nil means
	// the Source makes its own, and Run starts and stops them.
	Informers *Informers
	// Namespaces are the namespaces whose Services may be managed; empty, or one of them ""
	// (metav1.NamespaceAll), means all. A namespace given twice counts once.
	Namespaces []string
	// Selector selects managed Services by label ("" means every Service in Namespaces). Use
	// DefaultSelector for the documented convention.
	Selector string
	// IPFamily, "IPv4" or "IPv6", is the address family of every endpoint; "" means each pod's
	// primary IP's family (status.podIP), else the Service's primary family (spec.ipFamilies[0]),
	// else IPv4.
	IPFamily corev1.IPFamily
	// Clock is the time source of the watch-failure times, and the API server check ticks
	// on its ticker every HealthInterval (nil means clock.RealClock{}).
	Clock clock.WithTicker
	// HealthInterval is how often the API server is asked for its version while Run runs
	// (default DefaultHealthInterval): client-go retries a refused watch without telling its
	// watch error handler, so an API server that is down is found this way.
	HealthInterval time.Duration
	// MaxServices bounds the managed services (0 or negative: no bound): beyond it, services
	// are refused, the first MaxServices by namespace then name kept, whatever their
	// readiness, so which are kept does not move with a tenant's pods (State.Refused,
	// SkipOverCap). A tenant who can label Services cannot make edgeflow plan, serve and write
	// Istio's objects for an unbounded number of them.
	MaxServices int
	// Logger and Registerer as elsewhere (nil: slog.Default(), metrics not registered).
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Workload is what Istio's metrics call a workload: the pods' owning controller (a
// Deployment's name, a StatefulSet's, …; a bare pod's own name) in a namespace.
type Workload struct{ Name, Namespace string }

// State is one immutable snapshot of the cluster as edgeflow needs it.
type State struct {
	// Nodes are every node, with allocatable cpu (millicores) and memory (MiB).
	Nodes []optimizer.Node
	// Services are the managed services that have at least one ready endpoint, sorted by
	// Key; each has its ports and its ready pods (IP, node, weight), sorted by name.
	Services []optimizer.Service
	// Workloads maps a workload to the keys of the managed services its pods back.
	Workloads map[Workload][]string
	// NodeAddresses maps each node's InternalIP addresses to the node's name.
	NodeAddresses map[string]string
	// PodCPU[i] is the CPU request, in millicores, of each pod of Services[i], by
	// NAMESPACE/POD: the sum over its containers but Istio's sidecar (SidecarContainer), the
	// cores its application may use, as cAdvisor's CPU time is read without the sidecar's; a
	// pod whose application requests none is absent (a service with none has a nil map; a
	// State without any CPU request has none at all). One map per service, shared with the
	// Source's cache (a pass assembles a State in O(services), not O(pods)): read only.
	PodCPU []map[string]int64
	// Skipped counts endpoints left out, by reason (the Skip constants); and services left
	// out: no_ready_pods, over_cap.
	Skipped map[string]int
	// Refused are the managed services (NAMESPACE/NAME) beyond Config.MaxServices, sorted:
	// left out of Services.
	Refused []string
}

// SidecarContainer is the name of the container Istio's injector adds to a pod (its Envoy).
const SidecarContainer = "istio-proxy"

// Skip reasons, the label values of edgeflow_kube_skipped.
const (
	SkipNotReady    = "not_ready"
	SkipTerminating = "terminating"
	SkipNoAddress   = "no_address"
	SkipNoNode      = "no_node"
	SkipUnknownNode = "unknown_node"
	// SkipBadName: the endpoint's targetRef names no valid pod (not a DNS-1123 subdomain).
	SkipBadName = "bad_name"
	// SkipAmbiguousName: a pod of the default namespace whose name holds a '.': its key
	// (optimizer.QualifiedName, the name itself) would read as POD.NAMESPACE, another
	// namespace's pod, so it is left out rather than let one pod stand for another.
	SkipAmbiguousName = "ambiguous_name"
	SkipNoReadyPods   = "no_ready_pods"
	// SkipOverCap: a managed service beyond Config.MaxServices (State.Refused).
	SkipOverCap = "over_cap"
)

// skipReasons lists every skip reason, for the metric.
var skipReasons = []string{SkipNotReady, SkipTerminating, SkipNoAddress, SkipNoNode, SkipUnknownNode, SkipBadName, SkipAmbiguousName, SkipNoReadyPods, SkipOverCap}

// Source follows the cluster with shared informers.
//
// Rules:
//   - Informer callbacks never block. An update to nothing the Source reads (a node heartbeat,
//     a pod's container statuses or annotations) is dropped there; any other event marks what it
//     touches — the nodes, or the services whose EndpointSlices name the pod, node or service
//     (the slice indexes) — and returns. The Run loop rebuilds only what was marked (coalescing
//     every event that arrived meanwhile), compares each rebuilt service with its cached entry,
//     and when any entry changed assembles the State from the cached entries and delivers it.
//   - The informers are the process's shared ones (Config.Informers), or the Source's own.
//   - An endpoint counts only when its EndpointSlice conditions say so: ready (unset counts
//     as ready, as kube-proxy reads it) and not terminating — a pod in graceful deletion gets
//     no new traffic even while it is still serving. One not ready, terminating, without an
//     address or a known node is left out and counted (edgeflow_kube_skipped).
//   - The endpoint's pod is found by targetRef.uid (by name only when the slice gives no
//     uid); a uid that matches no pod in the cache leaves the endpoint without pod details.
//     A targetRef name that is not a DNS-1123 subdomain, or a default-namespace pod name with a
//     '.', is left out (SkipBadName, SkipAmbiguousName): pod keys stay unambiguous.
//   - Address family: Config.IPFamily, else the pod's primary IP's family, else the Service's
//     primary family; slices of the other family are not read for that endpoint.
//   - A managed service without a ready endpoint is left out with a log line. Pod weight is
//     the pod's CPU request relative to the mean request of the service's pods (1 when the
//     pods request no CPU).
//   - A failing list or watch (client-go's watch error handler) is reported by WatchFailures,
//     with the time it began, until that informer lists or hears an event again; so is an API
//     server that does not answer GET /version (asked every HealthInterval: client-go retries
//     a refused watch without calling the handler), until it answers.
type Source struct {
	cfg      Config
	log      *slog.Logger
	selector labels.Selector
	inf      *Informers
	// ownInformers: the Source made inf (Config.Informers was nil), so Run stops it.
	ownInformers bool
	wake         latest.Signal // an event touched something: a pass is due

	events   prometheus.Counter
	rebuilds prometheus.Counter
	skipped  *prometheus.GaugeVec

	mu       sync.Mutex
	current  *State
	synced   bool
	failures map[string]*watchFailure // informer name → its failing watch; guarded by mu
	dirty    dirty                    // what changed since the last pass; guarded by mu
	apiDown  *watchFailure            // the API server not answering GET /version; guarded by mu

	trace *trace // the scale benchmark's probes; nil outside it
}

// trace observes the Source from inside, for the scale benchmark (scale_test.go): event is
// called when a handler has taken an informer event (rebuild: it asked for a rebuild), pass
// after each pass of Run's loop.
type trace struct {
	event func(obj any, rebuild bool)
	pass  func(start, end time.Time)
}

// watchFailure is an informer whose list or watch failed.
type watchFailure struct {
	since time.Time
	last  error
	rv    string // the informer's last synced resource version when it began failing
	inf   cache.SharedIndexInformer
}

// NewSource validates cfg and registers the metrics; it starts nothing.
func NewSource(cfg Config) (*Source, error) {
	if cfg.Client == nil && cfg.Informers == nil {
		return nil, errors.New("kube: Config.Client is nil")
	}
	if cfg.Informers != nil {
		cfg.Client = cfg.Informers.Client()
	}
	sel, err := labels.Parse(cfg.Selector)
	if err != nil {
		return nil, fmt.Errorf("kube: selector %q: %w", cfg.Selector, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.HealthInterval <= 0 {
		cfg.HealthInterval = DefaultHealthInterval
	}
	switch cfg.IPFamily {
	case "", corev1.IPv4Protocol, corev1.IPv6Protocol:
	default:
		return nil, fmt.Errorf("kube: IP family %q: want IPv4, IPv6 or empty (each pod's primary family)", cfg.IPFamily)
	}
	cfg.Namespaces = UniqueNamespaces(cfg.Namespaces)
	s := &Source{cfg: cfg, log: cfg.Logger, selector: sel, failures: map[string]*watchFailure{},
		dirty: dirty{services: map[string]bool{}}, inf: cfg.Informers}
	if err := s.newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	if s.inf == nil {
		if s.inf, err = NewInformers(InformersConfig{Client: cfg.Client, Namespaces: cfg.Namespaces, EndpointSlices: true}); err != nil {
			return nil, err
		}
		s.ownInformers = true
	} else if !slices.Equal(s.inf.Namespaces(), cfg.Namespaces) {
		return nil, fmt.Errorf("kube: the informers watch namespaces %v, the Source wants %v", s.inf.Namespaces(), cfg.Namespaces)
	} else if len(s.inf.EndpointSlices) == 0 {
		return nil, errors.New("kube: the informers do not watch EndpointSlices (InformersConfig.EndpointSlices)")
	}
	if err := s.register(); err != nil {
		return nil, err
	}
	return s, nil
}

// Current returns the last delivered State (nil before the caches synced).
func (s *Source) Current() *State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

// Synced says whether the informer caches have synced.
func (s *Source) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

// WatchFailure is an informer whose list or watch is failing.
type WatchFailure struct {
	// Informer names the resource and namespace ("pods in shop", "nodes").
	Informer string
	// Since is when it began failing; Err is the last error.
	Since time.Time
	Err   error
}

// WatchFailures lists the informers whose list or watch has failed and not recovered since:
// recovery is an event from that informer or a new list (its last synced resource version
// moved). Safe for concurrent use.
func (s *Source) WatchFailures() []WatchFailure {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []WatchFailure
	if f := s.apiDown; f != nil {
		out = append(out, WatchFailure{Informer: apiServerCheck, Since: f.since, Err: f.last})
	}
	for name, f := range s.failures {
		if rv := f.inf.LastSyncResourceVersion(); rv != f.rv && rv != "" {
			delete(s.failures, name)
			s.log.Info("kube: watch recovered", "informer", name, "failing_since", f.since)
			continue
		}
		out = append(out, WatchFailure{Informer: name, Since: f.since, Err: f.last})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Informer < out[j].Informer })
	return out
}

// apiServerCheck names the API server's health in WatchFailures.
const apiServerCheck = "the API server (GET /version)"

// checkAPIServer asks the API server for its version every HealthInterval (on Config.Clock's
// ticker) until ctx is done, recording when it stops answering and when it answers again.
func (s *Source) checkAPIServer(ctx context.Context) {
	t := s.cfg.Clock.NewTicker(s.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		rctx, cancel := context.WithTimeout(ctx, s.cfg.HealthInterval)
		var err error
		if rc := s.cfg.Client.Discovery().RESTClient(); rc != nil && !reflect.ValueOf(rc).IsNil() {
			err = rc.Get().AbsPath("/version").Do(rctx).Error()
		} else {
			_, err = s.cfg.Client.Discovery().ServerVersion()
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		switch {
		case err != nil && s.apiDown == nil:
			s.apiDown = &watchFailure{since: s.cfg.Clock.Now(), last: err}
			s.log.Error("kube: the API server does not answer; the last known state stays in effect", "error", err)
		case err != nil:
			s.apiDown.last = err
		case s.apiDown != nil:
			s.log.Info("kube: the API server answers again", "failing_since", s.apiDown.since)
			s.apiDown = nil
		}
		s.mu.Unlock()
	}
}

// watchFailed records a failed list or watch of an informer (client-go's watch error handler).
func (s *Source) watchFailed(name string, inf cache.SharedIndexInformer, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.failures[name]; ok {
		f.last = err
		f.rv = inf.LastSyncResourceVersion()
		return
	}
	s.failures[name] = &watchFailure{since: s.cfg.Clock.Now(), last: err, rv: inf.LastSyncResourceVersion(), inf: inf}
	s.log.Error("kube: watch failing; the last known state stays in effect", "informer", name, "error", err)
}

func (s *Source) logSkips(prev, st *State) {
	for reason, msg := range map[string]string{
		SkipAmbiguousName: "kube: endpoints of default-namespace pods whose names hold a '.' are left out (the name would read as POD.NAMESPACE)",
		SkipBadName:       "kube: endpoints whose targetRef is not a valid pod name are left out",
	} {
		if n := st.Skipped[reason]; n > 0 && (prev == nil || prev.Skipped[reason] != n) {
			s.log.Warn(msg, "count", n)
		}
	}
	if !slices.Equal(st.Refused, refusedOf(prev)) && len(st.Refused) > 0 {
		s.log.Warn("kube: managed services beyond --max-managed-services are refused (the first by namespace, then name, are kept)",
			"max", s.cfg.MaxServices, "count", len(st.Refused), "refused", ListRefused(st.Refused))
	}
	if prev == nil || prev.Skipped[SkipNoReadyPods] != st.Skipped[SkipNoReadyPods] {
		if n := st.Skipped[SkipNoReadyPods]; n > 0 {
			s.log.Warn("kube: managed services without a ready endpoint are left out", "count", n)
		}
	}
}

func refusedOf(st *State) []string {
	if st == nil {
		return nil
	}
	return st.Refused
}

// maxListedRefused bounds the services one log or /readyz line names: a tenant may label many.
const maxListedRefused = 10

// ListRefused joins refused services for a log or /readyz line: at most 10 of them, then how
// many more.
func ListRefused(refused []string) string {
	if len(refused) > maxListedRefused {
		return strings.Join(refused[:maxListedRefused], ", ") + fmt.Sprintf(" and %d more", len(refused)-maxListedRefused)
	}
	return strings.Join(refused, ", ")
}

// UniqueNamespaces returns namespaces without repeats (each would get its own informers and
// list every Service twice), or nil (all) when one of them is "".
func UniqueNamespaces(namespaces []string) []string {
	var out []string
	for _, ns := range namespaces {
		if ns == "" {
			return nil
		}
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out
}

func (s *Source) inNamespaces(ns string) bool {
	if len(s.cfg.Namespaces) == 0 {
		return true
	}
	for _, n := range s.cfg.Namespaces {
		if n == ns {
			return true
		}
	}
	return false
}

// service builds one managed service from its EndpointSlices; nil when no endpoint is ready.
func (s *Source) service(svc *corev1.Service, known map[string]bool, skipped map[string]int) (*optimizer.Service, []Workload, map[string]int64) {
	slices := s.inf.SlicesOf(svc.Namespace, svc.Name)
	sort.Slice(slices, func(a, b int) bool { return slices[a].Name < slices[b].Name })
	out := &optimizer.Service{Name: svc.Name, Namespace: svc.Namespace, Selector: maps.Clone(svc.Spec.Selector)}
	if out.Selector == nil {
		out.Selector = map[string]string{} // selects no pods: no default (optimizer.Service.Selector)
	}
	for _, p := range svc.Spec.Ports {
		port := optimizer.Port{Name: p.Name, Port: p.Port}
		if p.TargetPort.IntVal > 0 {
			port.TargetPort = p.TargetPort.IntVal
		}
		for _, sl := range slices { // a named target port resolves through the slices
			for _, ep := range sl.Ports {
				if ep.Port != nil && ptrString(ep.Name) == p.Name {
					port.TargetPort = *ep.Port
				}
			}
		}
		out.Ports = append(out.Ports, port)
	}
	type podInfo struct {
		pod    optimizer.Pod
		cpu    int64
		appCPU int64 // cpu without the sidecar's
		// appLimit is the application containers' CPU limits summed, millicores; -1 when one of
		// them has none (the pod is not bound by a quota as a whole).
		appLimit int64
		mem      int64
	}
	var pods []podInfo
	seen := map[string]bool{}
	workloads := map[Workload]bool{}
	family := s.cfg.IPFamily
	if family == "" {
		family = corev1.IPv4Protocol
		if len(svc.Spec.IPFamilies) > 0 {
			family = svc.Spec.IPFamilies[0]
		}
	}
	for _, sl := range slices {
		if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		for _, ep := range sl.Endpoints {
			var pod *corev1.Pod
			name := ""
			if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
				name = ep.TargetRef.Name
				counted := string(sl.AddressType) == string(family) // once, not once per family
				if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
					if counted {
						skipped[SkipBadName]++
					}
					s.log.Debug("kube: endpoint's targetRef is not a pod name; left out", "service", svc.Namespace+"/"+svc.Name, "name", name, "problems", errs)
					continue
				}
				if strings.Contains(name, ".") && svc.Namespace == metav1.NamespaceDefault {
					if counted {
						skipped[SkipAmbiguousName]++
					}
					continue
				}
				pod = s.inf.PodByUID(svc.Namespace, ep.TargetRef.Name, string(ep.TargetRef.UID))
			}
			// One address family per endpoint: the pod's primary one unless configured.
			want := family
			if s.cfg.IPFamily == "" && pod != nil && pod.Status.PodIP != "" {
				if ip, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
					want = corev1.IPv4Protocol
					if ip.Is6() && !ip.Is4In6() {
						want = corev1.IPv6Protocol
					}
				}
			}
			if string(sl.AddressType) != string(want) {
				continue
			}
			if ep.Conditions.Terminating != nil && *ep.Conditions.Terminating {
				skipped[SkipTerminating]++
				continue
			}
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				skipped[SkipNotReady]++
				continue
			}
			if len(ep.Addresses) == 0 {
				skipped[SkipNoAddress]++
				continue
			}
			ip := ep.Addresses[0]
			if name == "" {
				name = "ip-" + strings.NewReplacer(".", "-", ":", "-").Replace(ip)
			}
			if seen[name] {
				continue
			}
			node := ptrString(ep.NodeName)
			if node == "" && pod != nil {
				node = pod.Spec.NodeName
			}
			switch {
			case node == "":
				skipped[SkipNoNode]++
				continue
			case !known[node]:
				skipped[SkipUnknownNode]++
				continue
			}
			seen[name] = true
			sidecar := pod != nil && pod.Labels[optimizer.SidecarLabel] == optimizer.SidecarLabelValue
			pi := podInfo{pod: optimizer.Pod{Name: name, Node: node, IP: ip, Sidecar: &sidecar}}
			if pod != nil {
				pi.pod.ServiceAccount = pod.Spec.ServiceAccountName
				for _, c := range pod.Spec.Containers {
					pi.cpu += c.Resources.Requests.Cpu().MilliValue()
					if c.Name != SidecarContainer {
						pi.appCPU += c.Resources.Requests.Cpu().MilliValue()
						switch l := c.Resources.Limits.Cpu().MilliValue(); {
						case l <= 0 || pi.appLimit < 0:
							pi.appLimit = -1
						default:
							pi.appLimit += l
						}
					}
					pi.mem += c.Resources.Requests.Memory().Value() >> 20
				}
				workloads[workloadOf(pod)] = true
			}
			pods = append(pods, pi)
		}
	}
	if len(pods) == 0 {
		return nil, nil, nil
	}
	sort.Slice(pods, func(a, b int) bool { return pods[a].pod.Name < pods[b].pod.Name })
	var sum, n int64
	out.CPULimit = -1 // the least of the pods' limits; 0 when a pod has none
	for _, p := range pods {
		switch {
		case p.appLimit <= 0:
			out.CPULimit = 0
		case out.CPULimit < 0 || out.CPULimit > 0 && p.appLimit < out.CPULimit:
			out.CPULimit = p.appLimit
		}
		if p.cpu > 0 {
			sum += p.cpu
			n++
		}
		out.CPU = max(out.CPU, p.cpu)
		out.Memory = max(out.Memory, p.mem)
	}
	cpu := map[string]int64{}
	for _, p := range pods {
		if p.appCPU > 0 {
			cpu[svc.Namespace+"/"+p.pod.Name] = p.appCPU
		}
		if n > 0 && p.cpu > 0 && p.cpu*n != sum {
			w := float64(p.cpu) * float64(n) / float64(sum)
			p.pod.Weight = &w
		}
		out.Pods = append(out.Pods, p.pod)
	}
	var ws []Workload
	for w := range workloads {
		ws = append(ws, w)
	}
	return out, ws, cpu
}

// workloadOf names the pod's workload as Istio does: the owning controller, a ReplicaSet
// standing for its Deployment (the pod-template-hash suffix removed).
func workloadOf(pod *corev1.Pod) Workload {
	w := Workload{Name: pod.Name, Namespace: pod.Namespace}
	for _, o := range pod.OwnerReferences {
		if o.Controller == nil || !*o.Controller {
			continue
		}
		w.Name = o.Name
		if o.Kind == "ReplicaSet" {
			if h := pod.Labels["pod-template-hash"]; h != "" {
				w.Name = strings.TrimSuffix(o.Name, "-"+h)
			}
		}
	}
	return w
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// WaitSynced polls until the source's caches have synced or ctx is done.
func (s *Source) WaitSynced(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !s.Synced() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// IstioSubzoneLabel is the node label Istio reads a node's subzone from (the region and zone
// come from the well-known topology labels).
const IstioSubzoneLabel = "topology.istio.io/subzone"

// nodeLocality is the locality Istio gives pods on a node with these labels:
// "region/zone/subzone", trailing empty parts dropped ("" when the node has none).
func nodeLocality(labels map[string]string) string {
	l := labels[corev1.LabelTopologyRegion] + "/" + labels[corev1.LabelTopologyZone] + "/" + labels[IstioSubzoneLabel]
	return strings.TrimRight(l, "/")
}
