package kube

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/edgeflow/edgeflow/internal/kubetest"
	"github.com/edgeflow/edgeflow/optimizer"
)

// The scale benchmark (make bench-watch) drives a Source through client-go's own machinery: a
// fake clientset's object tracker and watches feed the real shared informers, indexers and
// handlers. Its size comes from these flags (make bench-watch sets the 100,000 pods);
// `make test` runs it at 10,000 pods with generous bounds (TestWatchScale).
var (
	scalePods       = flag.Int("watch.pods", 10000, "pods in the scale benchmark")
	scaleNodes      = flag.Int("watch.nodes", 1000, "nodes in the scale benchmark")
	scaleServices   = flag.Int("watch.services", 400, "services (half of them managed) in the scale benchmark")
	scaleNamespaces = flag.Int("watch.namespaces", 20, "namespaces in the scale benchmark")
	scaleZones      = flag.Int("watch.zones", 50, "zones in the scale benchmark")
	scaleReady      = flag.Int("watch.ready-samples", 100, "pod-ready samples")
	scaleHeartbeat  = flag.Duration("watch.heartbeat", 15*time.Second, "how long node status reports arrive at their real rate (every node every 5 min); 5m sends one from each node")
	scaleChurn      = flag.Duration("watch.churn", 20*time.Second, "how long the churn scenario runs (100 pod events/s)")
	scaleCheck      = flag.Bool("watch.check", true, "fail when a figure misses the generous CI bound (TestWatchScale)")
	scaleProfile    = flag.String("watch.cpuprofile", "", "folder for a CPU profile of each scenario (SCENARIO.cpu.pb.gz)")
)

// profileScenario starts a CPU profile of one scenario when -watch.cpuprofile is set; the
// result stops it.
func profileScenario(t *testing.T, name string) func() {
	if *scaleProfile == "" {
		return func() {}
	}
	if err := os.MkdirAll(*scaleProfile, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(*scaleProfile, name+".cpu.pb.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		t.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}
}

// Real kubelets report an unchanged node status every 5 minutes (nodeStatusReportFrequency).
const heartbeatPeriod = 5 * time.Minute

// TestWatchScale measures the watcher's Kubernetes stage at scale and prints one line per
// scenario:
//
//	watch: scenario=NAME pods=N nodes=N event_p50_ms=X event_p99_ms=X cpu_cores=X heap_mib=X
//
// pod-ready: one pod becomes ready (its status, then its EndpointSlice) → the State holding it
// is delivered; the latency is from the slice write. node-heartbeat: node status reports at the
// real rate → no State; the latency is until the Source is done with the event (dropped, or
// the rebuild that read it finished). churn: 100 pod events/s (a managed pod's readiness flips:
// its status, then its slice) → each is delivered. cpu_cores is the process's CPU time over
// the scenario's wall time, the fake API server's work included; heap_mib is the live heap
// after GC less the live heap before the Source started (the fake API server's objects).
func TestWatchScale(t *testing.T) {
	if raceEnabled {
		t.Skip("timing test: runs without the race detector (make unit's second pass)")
	}
	if testing.Short() {
		t.Skip("scale test: not in -short")
	}
	w := newScaleWorld(*scalePods, *scaleNodes, *scaleServices, *scaleNamespaces, *scaleZones)
	cs := kubetest.CopyingWatches(fake.NewSimpleClientset(w.objects()...))
	w.objs, w.podObj = nil, nil // the fake API server holds its own copies
	runtime.GC()
	base := liveHeap()

	b := &scaleBench{t: t, w: w, cs: cs, delivered: make(chan *State, 1024)}
	src, err := NewSource(Config{Client: cs, Selector: DefaultSelector, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	src.trace = &trace{event: b.event, pass: b.pass}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	syncStart := time.Now()
	go func() { done <- src.Run(ctx, b.deliver) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	first := b.next(t, 10*time.Minute)
	t.Logf("first State after %v: %d nodes, %d services", time.Since(syncStart).Round(time.Millisecond), len(first.Nodes), len(first.Services))
	if len(first.Services) != w.managed {
		t.Fatalf("first State: %d services, want %d managed", len(first.Services), w.managed)
	}
	b.settle()
	runtime.GC()
	// heap also returns what the collection freed to the OS at once: else the runtime's
	// background scavenger does it during the next scenario (1 % of the CPU, madvise), which
	// the heartbeats' profile showed as more than half of their CPU, none of it the Source's.
	heap := func() float64 { debug.FreeOSMemory(); return float64(liveHeap()-min(base, liveHeap())) / (1 << 20) }

	type result struct {
		name     string
		p50, p99 float64
		cpu      float64
		heap     float64
	}
	var results []result
	passesFrom := 0
	report := func(name string, lat []time.Duration, cpu float64) result {
		b.mu.Lock()
		var spans []time.Duration
		for _, p := range b.passes[passesFrom:] {
			spans = append(spans, p.end.Sub(p.start))
		}
		passesFrom = len(b.passes)
		b.mu.Unlock()
		var load [3]float64
		if data, err := os.ReadFile("/proc/loadavg"); err == nil {
			fmt.Sscan(string(data), &load[0], &load[1], &load[2])
		}
		t.Logf("%s: %d passes of the Source's loop, wall time p50 %.2f ms, p99 %.2f ms; load average %.1f", name, len(spans), percentile(spans, 0.5), percentile(spans, 0.99), load[0])
		r := result{name: name, cpu: cpu, heap: heap()}
		r.p50, r.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
		fmt.Printf("watch: scenario=%s pods=%d nodes=%d event_p50_ms=%.1f event_p99_ms=%.1f cpu_cores=%.3f heap_mib=%.0f\n",
			name, w.pods, w.nodes, r.p50, r.p99, r.cpu, r.heap)
		results = append(results, r)
		return r
	}

	// pod-ready
	b.mu.Lock()
	passesFrom = len(b.passes) // not the first, full pass
	b.mu.Unlock()
	var lat []time.Duration
	stopProfile := profileScenario(t, "pod-ready")
	cpu := cpuMeter()
	for i := range *scaleReady {
		lat = append(lat, b.flip(t, w.notReady[i%len(w.notReady)], true))
		b.flip(t, w.notReady[i%len(w.notReady)], false)
		cs.ClearActions()
		time.Sleep(50 * time.Millisecond) // one pod at a time, as pods become ready
	}
	readyCPU := cpu()
	stopProfile()
	report("pod-ready", lat, readyCPU)

	// node-heartbeat
	b.settle()
	states, rebuilds := b.counts()
	n := int(float64(*scaleHeartbeat) / float64(heartbeatPeriod) * float64(w.nodes))
	every := heartbeatPeriod / time.Duration(w.nodes)
	stopProfile = profileScenario(t, "node-heartbeat")
	cpu = cpuMeter()
	hbStart := time.Now()
	b.heartbeats(t, n, every)
	hbCPU := cpu()
	stopProfile()
	lat = b.heartbeatLatencies(t, n, hbStart)
	states2, rebuilds2 := b.counts()
	t.Logf("node-heartbeat: %d reports every %v: %d States delivered, %d rebuilds", n, every, states2-states, rebuilds2-rebuilds)
	hb := report("node-heartbeat", lat, hbCPU)
	if states2 != states {
		t.Errorf("node-heartbeat: %d States delivered, want none (a node status report changes nothing edgeflow reads)", states2-states)
	}

	// churn
	b.settle()
	lat = nil
	stopProfile = profileScenario(t, "churn")
	cpu = cpuMeter()
	tick := time.NewTicker(10 * time.Millisecond) // 100 events/s
	end := time.Now().Add(*scaleChurn)
	rng := rand.New(rand.NewPCG(1, 2))
	var pending []churnEvent
	for time.Now().Before(end) {
		select {
		case <-b.delivered:
			pending, lat = b.drain(pending, lat)
			continue
		case <-tick.C:
		}
		i := w.managedPods[rng.IntN(len(w.managedPods))]
		if slices.ContainsFunc(pending, func(e churnEvent) bool { return e.pod == i }) {
			continue
		}
		ready := !w.ready[i]
		pending = append(pending, churnEvent{pod: i, ready: ready, at: b.write(t, i, ready)})
		cs.ClearActions() // the fake clientset records every action: not the Source's memory
	}
	tick.Stop()
	for deadline := time.Now().Add(time.Minute); len(pending) > 0 && time.Now().Before(deadline); {
		pending, lat = b.drain(pending, lat)
		time.Sleep(time.Millisecond)
	}
	churnCPU := cpu()
	stopProfile()
	if len(pending) > 0 {
		t.Errorf("churn: %d events never delivered", len(pending))
	}
	ch := report("churn", lat, churnCPU)

	if !*scaleCheck {
		return
	}
	// Generous bounds for CI (a shared 2-core machine, the fake API server's work counted).
	pr := results[0]
	for _, c := range []struct {
		what       string
		got, bound float64
	}{
		{"pod-ready p99 ms", pr.p99, 250},
		{"node-heartbeat cpu cores", hb.cpu, 0.25},
		{"churn cpu cores", ch.cpu, 1.5},
		{"heap MiB", max(pr.heap, hb.heap, ch.heap), 1024},
	} {
		if c.got > c.bound {
			t.Errorf("%s = %.3f, over the bound %.3f", c.what, c.got, c.bound)
		}
	}
}

type churnEvent struct {
	pod   int
	ready bool
	at    time.Time
}

// scaleWorld is the cluster of the benchmark: pods spread over nodes and services, services
// over namespaces, nodes over zones. Every second service is managed; in each managed service
// one pod starts not ready (the pod-ready scenario's).
type scaleWorld struct {
	pods, nodes, services, managed int
	objs                           []kruntime.Object
	podObj                         []*corev1.Pod // until the fake API server has them; then nil
	podRef                         []types.NamespacedName
	svcOf                          []int // pod → service
	slices                         []*discoveryv1.EndpointSlice
	ready                          []bool
	notReady                       []int // pods not ready at the start
	managedPods                    []int
	nodeObj                        []*corev1.Node
}

func newScaleWorld(pods, nodes, services, namespaces, zones int) *scaleWorld {
	w := &scaleWorld{pods: pods, nodes: nodes, services: services}
	for i := range nodes {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%05d", i), UID: types.UID(fmt.Sprintf("node-uid-%d", i)),
			Labels: map[string]string{corev1.LabelTopologyRegion: "region-1", corev1.LabelTopologyZone: fmt.Sprintf("zone-%02d", i%zones),
				corev1.LabelHostname: fmt.Sprintf("node-%05d", i), "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m5.2xlarge"},
			Annotations:   map[string]string{"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
			ManagedFields: managedFields("kubelet", 6)},
			Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)},
			Status: corev1.NodeStatus{
				Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi"), corev1.ResourcePods: resource.MustParse("110")},
				Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("7910m"), corev1.ResourceMemory: resource.MustParse("30Gi"), corev1.ResourcePods: resource.MustParse("110")},
				Addresses:   []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("172.20.%d.%d", i/256, i%256)}, {Type: corev1.NodeHostName, Address: fmt.Sprintf("node-%05d", i)}},
				Conditions:  nodeConditions(time.Now()),
				NodeInfo:    corev1.NodeSystemInfo{KubeletVersion: "v1.37.2", ContainerRuntimeVersion: "containerd://2.1.0", OSImage: "Ubuntu 24.04", KernelVersion: "6.8.0"},
				Images:      nodeImages(),
			}}
		w.nodeObj = append(w.nodeObj, n)
		w.objs = append(w.objs, n)
	}
	perService := pods / services
	w.pods = perService * services
	for s := range services {
		ns, name := fmt.Sprintf("ns-%03d", s%namespaces), fmt.Sprintf("svc-%04d", s)
		managed := s%2 == 0
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("svc-" + name),
			Labels: map[string]string{"app": name}, ManagedFields: managedFields("kubectl", 2)},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, ClusterIP: fmt.Sprintf("10.96.%d.%d", s/256, s%256),
				IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
				Ports:      []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}}
		if managed {
			svc.Labels[ManagedLabel] = "true"
			w.managed++
		}
		w.objs = append(w.objs, svc)
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-abcde",
			Labels:          map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name, UID: svc.UID}},
			ManagedFields:   managedFields("endpointslice-controller", 1)},
			AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}}}
		for k := range perService {
			i := len(w.podObj)
			node := w.nodeObj[(s*perService+k*7)%nodes].Name
			ready := !(managed && k == 0)
			p := scalePod(ns, name, k, i, node, ready)
			w.podObj = append(w.podObj, p)
			w.podRef = append(w.podRef, types.NamespacedName{Namespace: ns, Name: p.Name})
			w.svcOf = append(w.svcOf, s)
			w.ready = append(w.ready, ready)
			if managed {
				if ready {
					w.managedPods = append(w.managedPods, i)
				} else {
					w.notReady = append(w.notReady, i)
				}
			}
			w.objs = append(w.objs, p)
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.Status.PodIP},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(ready), Terminating: ptr(false)},
				NodeName:   ptr(node), Zone: ptr(w.nodeObj[(s*perService+k*7)%nodes].Labels[corev1.LabelTopologyZone]),
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: p.Name, UID: p.UID}})
		}
		w.slices = append(w.slices, sl)
		w.objs = append(w.objs, sl)
	}
	return w
}

func (w *scaleWorld) objects() []kruntime.Object { return w.objs }

// scalePod is a Deployment's pod as a real cluster holds it: managed fields, annotations, an
// app container and an Istio sidecar with env, probes and mounts, a full status.
func scalePod(ns, svc string, k, i int, node string, ready bool) *corev1.Pod {
	hash := "7c9f8d6b5"
	name := fmt.Sprintf("%s-%s-%05d", svc, hash, k)
	ip := fmt.Sprintf("10.%d.%d.%d", 100+i/65536, (i/256)%256, i%256)
	yes := true
	env := func(n int) []corev1.EnvVar {
		var out []corev1.EnvVar
		for j := range n {
			out = append(out, corev1.EnvVar{Name: fmt.Sprintf("ENV_VARIABLE_%02d", j), Value: fmt.Sprintf("value-of-the-setting-%02d-for-%s", j, svc)})
		}
		return out
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(fmt.Sprintf("pod-uid-%08d", i)),
		GenerateName:    svc + "-" + hash + "-",
		Labels:          map[string]string{"app": svc, "pod-template-hash": hash, "version": "v1", "security.istio.io/tlsMode": "istio"},
		Annotations:     map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-30T10:00:00Z", "prometheus.io/scrape": "true", "sidecar.istio.io/status": `{"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":["workload-socket","credential-socket","workload-certs","istio-envoy","istio-data","istio-podinfo","istio-token","istiod-ca-cert"],"imagePullSecrets":null,"revision":"default"}`},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: svc + "-" + hash, UID: types.UID("rs-" + svc), Controller: &yes, BlockOwnerDeletion: &yes}},
		ManagedFields:   append(managedFields("kube-controller-manager", 4), managedFields("kubelet", 4)...)},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: svc, RestartPolicy: corev1.RestartPolicyAlways,
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/" + svc + ":1.4.2", Env: env(12),
				Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				Resources:      corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("256Mi")}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 5},
				VolumeMounts:   []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}},
				{Name: "istio-proxy", Image: "docker.io/istio/proxyv2:1.28.0", Args: []string{"proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"}, Env: env(20),
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}}},
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
			Volumes:     []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "172.20.0.1", PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, QOSClass: corev1.PodQOSBurstable},
	}
	setPodReady(p, ready, time.Now())
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image + "@sha256:0123456789abcdef",
			ContainerID: "containerd://" + fmt.Sprintf("%064d", i), Ready: ready, Started: &yes,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}})
	}
	return p
}

func setPodReady(p *corev1.Pod, ready bool, at time.Time) {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	t := metav1.NewTime(at)
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: t},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: t},
		{Type: corev1.PodReady, Status: st, LastTransitionTime: t},
		{Type: corev1.ContainersReady, Status: st, LastTransitionTime: t},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: t},
	}
	for j := range p.Status.ContainerStatuses {
		p.Status.ContainerStatuses[j].Ready = ready
	}
}

func nodeConditions(at time.Time) []corev1.NodeCondition {
	t := metav1.NewTime(at)
	var out []corev1.NodeCondition
	for _, c := range []struct {
		typ corev1.NodeConditionType
		st  corev1.ConditionStatus
	}{{corev1.NodeMemoryPressure, corev1.ConditionFalse}, {corev1.NodeDiskPressure, corev1.ConditionFalse},
		{corev1.NodePIDPressure, corev1.ConditionFalse}, {corev1.NodeReady, corev1.ConditionTrue}} {
		out = append(out, corev1.NodeCondition{Type: c.typ, Status: c.st, LastHeartbeatTime: t, LastTransitionTime: metav1.NewTime(time.Unix(1.7e9, 0)),
			Reason: "KubeletReady", Message: "kubelet is posting ready status"})
	}
	return out
}

func nodeImages() []corev1.ContainerImage {
	var out []corev1.ContainerImage
	for j := range 12 {
		out = append(out, corev1.ContainerImage{Names: []string{fmt.Sprintf("registry.example/image-%02d@sha256:%064d", j, j), fmt.Sprintf("registry.example/image-%02d:1.0", j)}, SizeBytes: 1 << 26})
	}
	return out
}

// managedFields are n entries of server-side-apply bookkeeping, as large as real ones.
func managedFields(manager string, n int) []metav1.ManagedFieldsEntry {
	var out []metav1.ManagedFieldsEntry
	for j := range n {
		raw := `{"f:metadata":{"f:labels":{".":{},"f:app":{},"f:version":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"0\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{".":{},"f:env":{},"f:image":{},"f:ports":{},"f:resources":{}}}},"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:status":{}}}},"n":` + strconv.Itoa(j) + `}`
		out = append(out, metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
			Time: &metav1.Time{Time: time.Unix(1.7e9, 0)}, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(raw)})
	}
	return out
}

// scaleBench drives the world and watches the Source.
type scaleBench struct {
	t         *testing.T
	w         *scaleWorld
	cs        *fake.Clientset
	delivered chan *State

	mu       sync.Mutex
	last     *State
	states   int
	rebuilds int
	passes   []passSpan           // the passes of Run's loop
	sent     map[string]time.Time // node → its heartbeat written, not taken yet
	seen     []heartbeatSeen      // heartbeats the handlers took
}

type passSpan struct{ start, end time.Time }

type heartbeatSeen struct {
	sent, at time.Time
	rebuild  bool
}

func (b *scaleBench) deliver(st *State) {
	b.mu.Lock()
	b.last = st
	b.states++
	b.mu.Unlock()
	select {
	case b.delivered <- st:
	default: // only the latest matters to waiters; they re-read b.last
	}
}

func (b *scaleBench) event(obj any, rebuild bool) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return // (the informers may have trimmed the heartbeat itself from the object)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if sent, ok := b.sent[n.Name]; ok {
		delete(b.sent, n.Name)
		b.seen = append(b.seen, heartbeatSeen{sent: sent, at: time.Now(), rebuild: rebuild})
	}
}

func (b *scaleBench) pass(start, end time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rebuilds++
	b.passes = append(b.passes, passSpan{start, end})
}

func (b *scaleBench) counts() (states, rebuilds int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.states, b.rebuilds
}

func (b *scaleBench) next(t *testing.T, d time.Duration) *State {
	t.Helper()
	select {
	case st := <-b.delivered:
		return st
	case <-time.After(d):
		t.Fatalf("no State within %v", d)
		return nil
	}
}

// settle waits until the Source has been idle for a second.
func (b *scaleBench) settle() {
	for {
		_, r := b.counts()
		time.Sleep(time.Second)
		if _, r2 := b.counts(); r2 == r {
			for len(b.delivered) > 0 {
				<-b.delivered
			}
			return
		}
	}
}

// write sets pod i ready or not as a kubelet and the EndpointSlice controller would: the pod's
// status, then its slice. It returns when the slice was written.
func (b *scaleBench) write(t *testing.T, i int, ready bool) time.Time {
	t.Helper()
	w := b.w
	ctx := context.Background()
	obj, err := b.cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), w.podRef[i].Namespace, w.podRef[i].Name)
	if err != nil {
		t.Fatal(err)
	}
	p := obj.(*corev1.Pod) // a copy
	setPodReady(p, ready, time.Now())
	if _, err := b.cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := w.svcOf[i]
	sl := w.slices[s].DeepCopy()
	for j := range sl.Endpoints {
		if sl.Endpoints[j].TargetRef.Name == p.Name {
			sl.Endpoints[j].Conditions = discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(ready), Terminating: ptr(false)}
		}
	}
	if _, err := b.cs.DiscoveryV1().EndpointSlices(sl.Namespace).Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.slices[s] = sl
	w.ready[i] = ready
	return time.Now()
}

// holds says whether st has pod i ready (true) or left out (false).
func (b *scaleBench) holds(st *State, i int) bool {
	p := b.w.podRef[i]
	key := (&optimizer.Service{Namespace: p.Namespace, Name: b.w.slices[b.w.svcOf[i]].Labels[discoveryv1.LabelServiceName]}).Key()
	k, ok := slices.BinarySearchFunc(st.Services, key, func(s optimizer.Service, key string) int { return strings.Compare(s.Key(), key) })
	if !ok {
		return false
	}
	return slices.ContainsFunc(st.Services[k].Pods, func(q optimizer.Pod) bool { return q.Name == p.Name })
}

// flip writes pod i's readiness and waits for the State that shows it: the latency.
func (b *scaleBench) flip(t *testing.T, i int, ready bool) time.Duration {
	t.Helper()
	at := b.write(t, i, ready)
	deadline := time.After(5 * time.Minute)
	for {
		b.mu.Lock()
		st := b.last
		b.mu.Unlock()
		if b.holds(st, i) == ready {
			return time.Since(at)
		}
		select {
		case <-b.delivered:
		case <-deadline:
			t.Fatalf("pod %s ready=%v never delivered", b.w.podRef[i].Name, ready)
		}
	}
}

// drain takes the churn events the last State shows, recording their latency.
func (b *scaleBench) drain(pending []churnEvent, lat []time.Duration) ([]churnEvent, []time.Duration) {
	b.mu.Lock()
	st := b.last
	b.mu.Unlock()
	now := time.Now()
	kept := pending[:0]
	for _, e := range pending {
		if b.holds(st, e.pod) == e.ready {
			lat = append(lat, now.Sub(e.at))
			continue
		}
		kept = append(kept, e)
	}
	return kept, lat
}

// heartbeats sends n node status reports, one every period, round robin over the nodes, and
// waits until the Source has taken the last.
func (b *scaleBench) heartbeats(t *testing.T, n int, every time.Duration) {
	t.Helper()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for k := range n {
		<-tick.C
		node := b.w.nodeObj[k%len(b.w.nodeObj)].DeepCopy()
		node.Status.Conditions = nodeConditions(time.Now())
		b.mu.Lock()
		if b.sent == nil {
			b.sent = map[string]time.Time{}
		}
		b.sent[node.Name] = time.Now()
		b.mu.Unlock()
		if _, err := b.cs.CoreV1().Nodes().UpdateStatus(context.Background(), node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		b.w.nodeObj[k%len(b.w.nodeObj)] = node
		b.cs.ClearActions()
	}
	b.settle()
}

// heartbeatLatencies is, for the last report of each node, the time until the Source was done
// with it: the handler dropped it, or the first pass that began after the handler marked the
// state dirty ended.
func (b *scaleBench) heartbeatLatencies(t *testing.T, n int, since time.Time) []time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []time.Duration
	for _, s := range b.seen {
		if s.sent.Before(since) {
			continue // from the initial list
		}
		done := s.at
		if s.rebuild {
			k, _ := slices.BinarySearchFunc(b.passes, s.at, func(p passSpan, at time.Time) int { return p.start.Compare(at) })
			if k == len(b.passes) {
				t.Errorf("a heartbeat marked the state dirty after the last pass began")
				continue
			}
			done = b.passes[k].end
		}
		out = append(out, done.Sub(s.sent))
	}
	if len(out) < min(n, len(b.w.nodeObj))/2 {
		t.Errorf("node-heartbeat: the handlers took %d reports, want about %d", len(out), min(n, len(b.w.nodeObj)))
	}
	return out
}

func percentile(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(q*float64(len(s))))]) / float64(time.Millisecond)
}

// cpuMeter starts measuring the process's CPU time; calling the result gives the cores used
// since (CPU time over wall time).
func cpuMeter() func() float64 {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	c0, t0 := cpu(), time.Now()
	return func() float64 { return float64(cpu()-c0) / float64(time.Since(t0)) }
}

func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
