package reproduce

import (
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/demo/app"
	"github.com/edgeflow/edgeflow/rebalancer"
)

// Deploy creates the application's managed Services and Deployments (the kube-scheduler places
// the pods) and waits until every pod runs and is ready.
func (h *Harness) Deploy(a App, w Workload) {
	h.nodeCores(w)
	for _, c := range a.Components {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: ns, Labels: map[string]string{kubeapi.ManagedLabel: "true"}},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": c.Name},
				Ports: []corev1.ServicePort{{Name: "grpc", Port: podPort, TargetPort: intstr.FromInt32(podPort)}}}}
		if _, err := h.cs.CoreV1().Services(ns).Create(h.ctx, svc, metav1.CreateOptions{}); err != nil {
			h.t.Fatal(err)
		}
		if _, err := h.cs.AppsV1().Deployments(ns).Create(h.ctx, deployment(c, w, c.Name, c.Replicas, ""), metav1.CreateOptions{}); err != nil {
			h.t.Fatal(err)
		}
	}
	h.waitSettled(a, 90*time.Second)
}

// pinLabel is the label of a pinned pod's node (Pin).
const pinLabel = "reproduce.edgeflow.io/pinned-to"

// deployment is the Deployment of component c's pods: name, replicas, and, when node is set,
// every pod bound to that node (spec.nodeName: no scheduler; Pin's per-node Deployments).
func deployment(c Component, w Workload, name string, replicas int, node string) *appsv1.Deployment {
	cpu := resource.MustParse(c.CPU)
	args := []string{"--workers", strconv.Itoa(w.Workers), "--service-time", w.ServiceTime.String(),
		"--workload", c.Name, "--namespace", ns, "--cpu-request", strconv.FormatFloat(cpu.AsApproximateFloat64(), 'g', -1, 64)}
	if w.ServiceFixed > 0 {
		args = append(args, "--service-fixed", w.ServiceFixed.String())
	}
	resources := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: cpu, corev1.ResourceMemory: resource.MustParse("128Mi")}}
	if w.LimitCPU {
		args = append(args, "--cpu-limit", strconv.FormatFloat(cpu.AsApproximateFloat64(), 'g', -1, 64))
		resources.Limits = resources.Requests.DeepCopy()
	}
	for _, callee := range c.Calls {
		args = append(args, "--call", callee+"."+ns)
	}
	var annotations map[string]string
	var env []corev1.EnvVar
	ports := []corev1.ContainerPort{{Name: "grpc", ContainerPort: podPort}}
	if w.Metrics {
		// As a pod Istio's sample Prometheus scrapes: annotated, its metrics on its IP (the
		// kubelet expands $(POD_IP) from the downward API).
		annotations = map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": strconv.Itoa(podMetricsPort),
			"prometheus.io/path": "/metrics"}
		env = []corev1.EnvVar{{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}}
		args = append(args, "--metrics-addr", "$(POD_IP):"+strconv.Itoa(podMetricsPort))
	}
	n := int32(replicas)
	labels := map[string]string{"app": c.Name}
	if node != "" { // the per-node Deployments of a component must not select each other's pods
		labels[pinLabel] = node
	}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: maps.Clone(labels), Annotations: annotations},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "edgeflow-reproduce-pod", Args: args, Env: env,
					Ports: ports, Resources: resources}}}}}}
	d.Spec.Template.Spec.NodeName = node
	return d
}

// Pin runs the application's pods on the nodes pl gives (component → node → pods) and waits
// until they run there, ready: each component as one Deployment per node whose pods are bound
// to it (spec.nodeName), in place of the scheduler's Deployment the first time (its pods are
// stopped first), scaled after that. A placement's pods are thus the same processes however
// often a run returns to it, and two placements are switched between in seconds, which the
// interleaved runs need (Run). pl must give every component its replicas.
func (h *Harness) Pin(a App, w Workload, pl map[string]map[string]int) {
	for _, c := range a.Components {
		total := 0
		for _, k := range pl[c.Name] {
			total += k
		}
		if total != c.Replicas {
			h.t.Fatalf("pin %s: %d pods of %s placed, want its %d replicas", a.Name, total, c.Name, c.Replicas)
		}
	}
	deps := h.cs.AppsV1().Deployments(ns)
	for _, c := range a.Components {
		if err := deps.Delete(h.ctx, c.Name, metav1.DeleteOptions{}); err == nil {
			h.eventually(90*time.Second, "the scheduler's pods of "+c.Name+" gone", func() bool {
				l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{LabelSelector: "app=" + c.Name})
				return err == nil && len(l.Items) == 0
			})
		} else if !apierrors.IsNotFound(err) {
			h.t.Fatal(err)
		}
		for _, n := range Nodes {
			name, k := c.Name+"-"+n, pl[c.Name][n]
			d, err := deps.Get(h.ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				_, err = deps.Create(h.ctx, deployment(c, w, name, k, n), metav1.CreateOptions{})
			case err == nil && (d.Spec.Replicas == nil || int(*d.Spec.Replicas) != k):
				n := int32(k)
				d.Spec.Replicas = &n
				_, err = deps.Update(h.ctx, d, metav1.UpdateOptions{})
			}
			if err != nil {
				h.t.Fatalf("pin %s: %v", name, err)
			}
		}
	}
	h.eventually(90*time.Second, "every pod of "+a.Name+" ready where pinned", func() bool {
		return h.unsettled(a) == "" && samePlacement(h.Placement(a), pl)
	})
}

// samePlacement reports whether two placements put as many pods of each component on each
// node (a node missing counts 0).
func samePlacement(a, b map[string]map[string]int) bool {
	for _, m := range []map[string]map[string]int{a, b} {
		for c, nodes := range m {
			for n := range nodes {
				if a[c][n] != b[c][n] {
					return false
				}
			}
		}
	}
	return true
}

// Undeploy deletes the application and waits until its pods are gone. It also deletes the
// rebalancer's state ConfigMap: each application × scenario is a new experiment, but its
// Deployments have the names of the last one, and the state's cool-downs ("productpage left
// n1") would refuse the next rebalance moves planned on a new RTT matrix. A full run of
// 2026-12-02 had scenario B's rebalancer make 1 of its planned moves in 184 s for Bookinfo,
// every other refused by scenario A's cool-down.
func (h *Harness) Undeploy(a App) {
	// The scheduler's Deployments and Pin's per-node ones.
	if err := h.cs.AppsV1().Deployments(ns).DeleteCollection(h.ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		h.t.Fatalf("deleting the application's Deployments: %v", err)
	}
	for _, c := range a.Components {
		_ = h.cs.CoreV1().Services(ns).Delete(h.ctx, c.Name, metav1.DeleteOptions{})
	}
	state := metav1.ListOptions{LabelSelector: rebalancer.ManagedByLabel + "=" + rebalancer.ManagedByValue + "," +
		rebalancer.ComponentLabel + "=" + rebalancer.ComponentValue}
	if err := h.cs.CoreV1().ConfigMaps("default").DeleteCollection(h.ctx, metav1.DeleteOptions{}, state); err != nil {
		h.t.Fatalf("deleting the rebalancer's state: %v", err)
	}
	h.eventually(90*time.Second, "the application's pods gone", func() bool {
		l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
	h.stopCores()
}

// nodeCores serves each node's cores to the pods started from now on, as w says (none when w
// gives neither cores nor speeds): one app.ServeNodeCPU per node on a Unix socket in the
// harness's folder, which the pods of every network namespace reach. They stop at Undeploy, or
// at the test's end.
func (h *Harness) nodeCores(w Workload) {
	h.stopCores()
	if w.NodeCores == 0 && len(w.NodeSpeed) == 0 {
		return
	}
	for n := range w.NodeSpeed {
		if !slices.Contains(Nodes, n) {
			h.t.Fatalf("workload: node speed for %q, which is not a node of the testbed (%v)", n, Nodes)
		}
	}
	socks := map[string]string{}
	var stops []func() error
	h.coresStop = func() {
		for _, stop := range stops {
			if err := stop(); err != nil {
				fmt.Fprintf(h.log, "node cores: %v\n", err)
			}
		}
	}
	for _, n := range Nodes {
		cpu, err := app.NewNodeCPU(app.NodeConfig{Name: n, Cores: w.NodeCores, Speed: w.NodeSpeed[n]})
		if err != nil {
			h.t.Fatal(err)
		}
		socks[n] = filepath.Join(h.dir, "cores-"+n+".sock")
		stop, err := app.StartNodeCPU(socks[n], cpu)
		if err != nil {
			h.t.Fatal(err)
		}
		stops = append(stops, stop)
	}
	h.rt.setCores(socks)
}

// stopCores stops the node cores nodeCores serves, if any.
func (h *Harness) stopCores() {
	h.rt.setCores(nil)
	if h.coresStop != nil {
		h.coresStop()
		h.coresStop = nil
	}
}

// waitSettled waits until every component has exactly its replicas, all bound, running and
// ready, none terminating.
func (h *Harness) waitSettled(a App, d time.Duration) {
	h.eventually(d, "every pod of "+a.Name+" ready", func() bool { return h.unsettled(a) == "" })
}

// unsettled says what is not settled yet ("" when all is).
func (h *Harness) unsettled(a App) string {
	l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	count := map[string]int{}
	for _, p := range l.Items {
		if p.DeletionTimestamp != nil {
			return "pod " + p.Name + " terminating"
		}
		if p.Spec.NodeName == "" {
			return "pod " + p.Name + " pending"
		}
		if !podReady(&p) {
			return "pod " + p.Name + " not ready"
		}
		count[p.Labels["app"]]++
	}
	for _, c := range a.Components {
		if count[c.Name] != c.Replicas {
			return fmt.Sprintf("%s has %d pods, want %d", c.Name, count[c.Name], c.Replicas)
		}
	}
	return ""
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Pending lists the pods not bound to a node (and not terminating).
func (h *Harness) Pending() []string {
	l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, p := range l.Items {
		if p.Spec.NodeName == "" && p.DeletionTimestamp == nil {
			out = append(out, p.Name)
		}
	}
	return out
}

// Placement returns, per component, how many of its pods run on each node.
func (h *Harness) Placement(a App) map[string]map[string]int {
	l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]map[string]int{}
	for _, c := range a.Components {
		out[c.Name] = map[string]int{}
	}
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil && p.Spec.NodeName != "" && out[p.Labels["app"]] != nil {
			out[p.Labels["app"]][p.Spec.NodeName]++
		}
	}
	return out
}

// endpoints returns the IPs of the ready pods of a component.
func (h *Harness) endpoints(component string) []string {
	l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{LabelSelector: "app=" + component})
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil && podReady(&p) && p.Status.PodIP != "" {
			out = append(out, net.JoinHostPort(p.Status.PodIP, strconv.Itoa(podPort)))
		}
	}
	sort.Strings(out)
	return out
}

// callers counts the pods that call another service (the xDS node ids serve must see) and the
// xDS streams they open: grpc-go (v1.85) keeps one xDS client, so one ADS stream, per channel
// target (internal/xds/resolver/xds_resolver.go: newXDSClient(target.String(), …)), so a pod
// calling two services holds two streams. Counting streams alone once let the first slice
// after the rebalancer start while the pods of one service were still in their reconnect
// backoff, their RPCs waiting for a listener: a slice of P50 ≈ 290 ms.
func callers(a App) (pods, streams int) {
	for _, c := range a.Components {
		if len(c.Calls) > 0 {
			pods += c.Replicas
			streams += c.Replicas * len(c.Calls)
		}
	}
	return pods, streams
}

// callGraph writes the application's call graph with the load rate as ingress, the file
// `--calls` of serve and rebalance reads (there is no Istio telemetry to measure it here).
func (h *Harness) callGraph(a App, rate float64) string {
	var b strings.Builder
	b.WriteString("calls:\n")
	for _, c := range a.Components {
		for _, callee := range c.Calls {
			fmt.Fprintf(&b, "  - {from: %s.%s, to: %s.%s}\n", c.Name, ns, callee, ns)
		}
	}
	fmt.Fprintf(&b, "ingress:\n  - {service: %s.%s, rps: %g}\n", a.Entry(), ns, rate)
	path := filepath.Join(h.dir, fmt.Sprintf("calls-%s-%g.yaml", a.Name, rate))
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		h.t.Fatal(err)
	}
	return path
}
