package rebalance

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/kube"
)

const ns = "shop"

// world is one real control plane (etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager) with a fake kubelet running the bound pods, the namespace shop, and
// edgeflow's cluster source on it (call graph given, every node pair 10 ms apart).
type world struct {
	t       *testing.T
	ctx     context.Context
	cluster *kubeapi.Cluster
	cs      kubernetes.Interface
	kubelet *kubeapi.FakeKubelet
	topo    *watcher.Live
	latency float64
}

func newWorld(t *testing.T, nodes ...kubeapi.NodeSpec) *world {
	return newWorldWith(t, worldOptions{}, nodes...)
}

// worldOptions: what a test needs beyond the default world.
type worldOptions struct {
	audit   bool   // the API server's audit log (kubeapi.Options.AuditLog)
	podCIDR string // the fake kubelet's pod addresses (default a /24: 253 pods)
}

func newWorldWith(t *testing.T, o worldOptions, nodes ...kubeapi.NodeSpec) *world {
	kubeapi.Require(t)
	c := kubeapi.Start(t, kubeapi.Options{Scheduler: true, ControllerManager: true, AuditLog: o.audit})
	// API calls end with the test (some tests run for minutes: not kubeapi.Context's 2).
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel)
	w := &world{t: t, ctx: ctx, cluster: c, cs: c.Client, latency: 10}
	if _, err := w.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if _, err := kubeapi.CreateNode(ctx, w.cs, n); err != nil {
			t.Fatal(err)
		}
	}
	w.kubelet = kubeapi.RunFakeKubelet(ctx, t, w.cs, kubeapi.FakeKubeletOptions{PodCIDR: o.podCIDR})
	return w
}

// topology starts edgeflow's cluster source (kube informers; the call graph: 300 req/s into
// frontend, each making one call to backend).
func (w *world) topology() {
	one := 1.0
	w.topologyWith(&watcher.CallGraph{
		Calls:   []optimizer.Call{{From: "frontend.shop", To: "backend.shop", Rate: &one}},
		Ingress: []optimizer.Ingress{{Service: "frontend.shop", RPS: 300}}})
}

// topologyWith starts edgeflow's cluster source with the call graph g.
func (w *world) topologyWith(g *watcher.CallGraph) {
	ks, err := kube.NewSource(kube.Config{Client: w.cs, Namespaces: []string{ns}, Selector: kube.DefaultSelector,
		Logger: quiet()})
	if err != nil {
		w.t.Fatal(err)
	}
	w.topo, err = watcher.NewLive(watcher.LiveConfig{Kube: ks, DefaultLatencyMS: &w.latency, Logger: quiet(),
		CallGraph: g})
	if err != nil {
		w.t.Fatal(err)
	}
	w.run("cluster source", func(ctx context.Context) error { return w.topo.Run(ctx, nop{}) })
}

type nop struct{}

func (nop) Update(*optimizer.Topology) {}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// run runs fn until the test ends (cancelled and waited for in t.Cleanup); an error fails it.
func (w *world) run(name string, fn func(ctx context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			w.t.Errorf("%s: %v", name, err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	w.t.Cleanup(stop)
	return stop
}

// controller is a rebalancer on the world, acting unless cfg says dry-run, with short
// timings unless cfg gives them; start runs it. Its client is an admin's with edgeflow's
// default rate limits (--kube-qps 50, --kube-burst 100) and the user agent
// edgeflow-rebalancer/IDENTITY.
func (w *world) controller(cfg rebalancer.Config) (*rebalancer.Controller, *prometheus.Registry) {
	return w.controllerAs(cfg, w.cluster.Config)
}

// controllerAs is controller with the credentials of rc (a service account's, for RBAC).
func (w *world) controllerAs(cfg rebalancer.Config, rc *rest.Config) (*rebalancer.Controller, *prometheus.Registry) {
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = rebalancer.DefaultKubeQPS, rebalancer.DefaultKubeBurst
	rc.UserAgent = "edgeflow-rebalancer/" + cfg.Identity
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		w.t.Fatal(err)
	}
	cfg.Client = cs
	cfg.Topology = w.topo.Current
	cfg.Namespaces = []string{ns}
	cfg.Selector = kube.DefaultSelector
	cfg.DefaultLatencyMS = &w.latency
	if cfg.Period == 0 {
		cfg.Period = 2 * time.Second
	}
	if cfg.MinAge == 0 {
		cfg.MinAge = time.Second
	}
	if cfg.Cooldown == 0 {
		cfg.Cooldown = 10 * time.Minute
	}
	if cfg.GateTimeout == 0 {
		cfg.GateTimeout = 30 * time.Second
	}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{w.t, cfg.Identity}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c, err := rebalancer.New(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	return c, reg
}

// start runs c, electing on default/edgeflow-rebalancer, until the test ends or stop (which
// releases the Lease: another replica takes it at its next try, every 500 ms). A leader keeps
// the Lease while it renews within client-go's 10 s, also on an API server slowed by the tests
// running beside it.
func (w *world) start(c *rebalancer.Controller, name string) (stop func()) {
	return w.run("rebalancer "+name, func(ctx context.Context) error {
		return c.Run(ctx, rebalancer.LeaderConfig{Namespace: "default", Name: rebalancer.DefaultLeaseName,
			LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 500 * time.Millisecond})
	})
}

// metric sums the samples of the named counter or gauge whose labels include want.
func metric(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	samples:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue samples
				}
			}
			if m.Counter != nil {
				sum += m.Counter.GetValue()
			} else if m.Gauge != nil {
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

type testWriter struct {
	t    *testing.T
	name string
}

func (tw testWriter) Write(p []byte) (int, error) {
	tw.t.Log(tw.name + ": " + string(p))
	return len(p), nil
}

// service creates a managed Service app.
func (w *world) service(app string) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns, Labels: map[string]string{kube.ManagedLabel: "true"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": app},
			Ports: []corev1.ServicePort{{Name: "grpc", Port: 9000, TargetPort: intstr.FromInt32(9000)}}}}
	if _, err := w.cs.CoreV1().Services(ns).Create(w.ctx, svc, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

// deployment creates a Deployment app with replicas pods requesting cpu each.
func (w *world) deployment(app string, replicas int32, cpu string) {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app",
					Ports: []corev1.ContainerPort{{ContainerPort: 9000}},
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse("64Mi")}}}}}}}}
	if _, err := w.cs.AppsV1().Deployments(ns).Create(w.ctx, d, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) scale(app string, replicas int32) {
	// The Deployment controller writes its status meanwhile: retry on conflict.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := w.cs.AppsV1().Deployments(ns).GetScale(w.ctx, app, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Spec.Replicas = replicas
		_, err = w.cs.AppsV1().Deployments(ns).UpdateScale(w.ctx, app, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		w.t.Fatal(err)
	}
}

// pdb creates a PodDisruptionBudget on app with minAvailable.
func (w *world) pdb(app string, minAvailable int) {
	mina := intstr.FromInt(minAvailable)
	p := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &mina,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}
	if _, err := w.cs.PolicyV1().PodDisruptionBudgets(ns).Create(w.ctx, p, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
	testkit.Eventually(w.t, 30*time.Second, "PDB "+app+" observed", func() bool {
		p, err := w.cs.PolicyV1().PodDisruptionBudgets(ns).Get(w.ctx, app, metav1.GetOptions{})
		return err == nil && p.Status.ObservedGeneration == p.Generation && p.Status.ExpectedPods > 0
	})
}

// cordon marks nodes (un)schedulable.
func (w *world) cordon(on bool, nodes ...string) {
	for _, name := range nodes {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := w.cs.CoreV1().Nodes().Get(w.ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Spec.Unschedulable = on
			_, err = w.cs.CoreV1().Nodes().Update(w.ctx, n, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			w.t.Fatal(err)
		}
	}
}

// pods lists the pods of app (all, terminating included).
func (w *world) pods(app string) []corev1.Pod {
	l, err := w.cs.CoreV1().Pods(ns).List(w.ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		w.t.Fatal(err)
	}
	return l.Items
}

func isReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Spec.NodeName == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// settled waits until app has exactly n pods, all ready, and returns pod → node.
func (w *world) settled(app string, n int) map[string]string {
	var out map[string]string
	testkit.Eventually(w.t, 60*time.Second, fmt.Sprintf("%d ready pods of %s", n, app), func() bool {
		out = map[string]string{}
		ps := w.pods(app)
		for i := range ps {
			if !isReady(&ps[i]) {
				return false
			}
			out[ps[i].Name] = ps[i].Spec.NodeName
		}
		return len(ps) == n
	})
	return out
}

// perNode counts app's pods per node.
func perNode(pods map[string]string) map[string]int {
	out := map[string]int{}
	for _, n := range pods {
		out[n]++
	}
	return out
}

// lataCost is the optimal LATA cost of the cluster source's current topology.
func (w *world) lataCost() float64 {
	t := w.topo.Current()
	if t == nil {
		return -1
	}
	m, err := optimizer.Compile(t, optimizer.Options{DefaultLatencyMS: &w.latency})
	if err != nil {
		return -1
	}
	a, err := optimizer.Plan(m, optimizer.LATA)
	if err != nil {
		return -1
	}
	return a.Cost
}

// readyWatch follows the pods of the apps with an informer and records the fewest ready pods
// each app had at any moment.
type readyWatch struct {
	mu     sync.Mutex
	lowest map[string]int
	ready  map[string]map[string]bool
}

func (w *world) watchReady(apps ...string) *readyWatch {
	rw := &readyWatch{lowest: map[string]int{}, ready: map[string]map[string]bool{}}
	for _, a := range apps {
		rw.ready[a] = map[string]bool{}
		rw.lowest[a] = -1
	}
	w.watchPods(func(p *corev1.Pod, gone bool) {
		if rw.ready[p.Labels["app"]] == nil {
			return
		}
		rw.mu.Lock()
		defer rw.mu.Unlock()
		app := p.Labels["app"]
		if gone || !isReady(p) {
			delete(rw.ready[app], p.Name)
		} else {
			rw.ready[app][p.Name] = true
		}
		if n := len(rw.ready[app]); rw.lowest[app] < 0 || n < rw.lowest[app] {
			rw.lowest[app] = n
		}
	})
	// The initial list fills ready without counting the lows on the way up.
	rw.mu.Lock()
	for a := range rw.lowest {
		rw.lowest[a] = len(rw.ready[a])
	}
	rw.mu.Unlock()
	return rw
}

// watchPods calls update, on an informer's goroutine, with every pod of the namespace as it is
// added or changes (gone false) or is deleted (gone true), until the test ends; it returns once
// the informer has listed the pods there are.
func (w *world) watchPods(update func(p *corev1.Pod, gone bool)) {
	f := informers.NewSharedInformerFactoryWithOptions(w.cs, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Pods().Informer()
	on := func(obj any, gone bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if p, ok := obj.(*corev1.Pod); ok {
			update(p, gone)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { on(obj, false) },
		UpdateFunc: func(_, obj any) { on(obj, false) },
		DeleteFunc: func(obj any) { on(obj, true) },
	})
	ctx, cancel := context.WithCancel(w.ctx)
	f.Start(ctx.Done())
	w.t.Cleanup(func() { cancel(); f.Shutdown() })
	cache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
}

func (rw *readyWatch) min(app string) int {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.lowest[app]
}

// webhook serves the controller's webhook on 127.0.0.1 with a fresh self-signed certificate,
// once the controller's caches synced (start the controller next), and registers it with the
// API server (failurePolicy Ignore); up waits until it serves. stop stops the server and
// leaves the registration: the API server then cannot reach it.
func (w *world) webhook(c *rebalancer.Controller) (stop, up func()) {
	certPEM, certFile, keyFile := w.webhookCert()
	addr, stop := w.serveAt(c, "127.0.0.1:0", certFile, keyFile)
	url := fmt.Sprintf("https://%s%s", addr, rebalancer.WebhookPath)
	cfg := rebalancer.MutatingWebhookConfiguration(admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: certPEM})
	if _, err := w.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(w.ctx, cfg, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
	up = func() {
		testkit.Eventually(w.t, 30*time.Second, "the webhook serving", func() bool {
			conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
			if err == nil {
				conn.Close()
			}
			return err == nil
		})
	}
	return stop, up
}

// gated lists the pods of the namespace that carry edgeflow's gate or are not bound.
func (w *world) unplaced() []string {
	l, err := w.cs.CoreV1().Pods(ns).List(w.ctx, metav1.ListOptions{LabelSelector: labels.Everything().String()})
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, p := range l.Items {
		if p.Spec.NodeName == "" && p.DeletionTimestamp == nil {
			out = append(out, p.Name)
		}
	}
	return out
}
