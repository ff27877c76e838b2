package install

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/internal/testkit/xdsclient"
	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/watcher/kube"
)

const (
	appNS   = "shop"
	appPort = 9000
	saUser  = "system:serviceaccount:" + namespace + ":edgeflow"
)

// edgeflow runs `edgeflow serve` with exactly the chart's permissions: the chart (rebalancer
// acting, Istio DestinationRules with node labels, services in one namespace) is applied to
// a real control plane (kube-apiserver, kube-scheduler, kube-controller-manager; the fake
// kubelet runs the application's pods), and the real edgeflow binary runs with the rendered
// container's arguments, a token of the chart's ServiceAccount (TokenRequest) and the
// rendered volumes' contents. It serves xDS to a real grpc-go client, writes its
// DestinationRules and node labels, and moves a pod through eviction and the placement gate,
// with no "forbidden" in its log and no request refused in the API server's audit log. Then
// SubjectAccessReviews show what the account cannot do, and helm uninstall — the pre-delete
// hook's command with the hook's own account, then deleting what was rendered — leaves nothing
// behind.
func TestRunsWithTheChartsPermissions(t *testing.T) {
	t.Parallel()
	c, cl := startAPIServer(t, kubeapi.Options{Scheduler: true, ControllerManager: true, AuditLog: true})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	cs := c.Client
	cl.installCRDs(ctx, t, istioCRDs(t))
	createNamespaces(ctx, t, cs, namespace, appNS)
	for _, n := range []string{"n1", "n2", "n3"} {
		// One zone: the subzone edgeflow gives each node (istio.labelNodes) is what lets the
		// mesh weigh the nodes apart.
		if _, err := kubeapi.CreateNode(ctx, cs, kubeapi.NodeSpec{Name: n, Labels: map[string]string{
			"topology.kubernetes.io/region": "edge", "topology.kubernetes.io/zone": "z1"}}); err != nil {
			t.Fatal(err)
		}
	}
	// Pod addresses from 198.18.2.0/24 (EndpointSlices refuse loopback); the test's client
	// dials each pod's address at a loopback server standing in for the pod.
	// edgeflow's own pods (the chart's Deployment) too: the pre-delete hook stops them.
	kubeapi.RunFakeKubelet(ctx, t, cs, kubeapi.FakeKubeletOptions{Namespaces: []string{appNS, namespace}})
	a := &apps{t: t, ctx: ctx, cs: cs, watched: []string{appNS}}
	a.badLayout()
	time.Sleep(2 * time.Second) // kube-root-ca.crt and the default ServiceAccounts of the new namespaces
	before := cl.snapshot(ctx, t)

	// The operator's part: the webhook's certificate (cert-manager's, in a cluster).
	webhookCert, webhookKey := testkit.SelfSigned(t, "edgeflow-webhook", "127.0.0.1", release+"-webhook."+namespace+".svc")
	values := map[string]any{
		"replicaCount":     1,
		"watch":            map[string]any{"namespaces": []any{appNS}},
		"prometheus":       map[string]any{"url": ""},
		"callGraph":        map[string]any{"calls": []any{map[string]any{"from": "frontend.shop", "to": "backend.shop"}}, "ingress": []any{map[string]any{"service": "frontend.shop", "rps": 300}}},
		"defaultLatencyMs": 10,
		"xds":              map[string]any{"proxylessClients": true, "tls": map[string]any{"enabled": false}}, // the grpc-go client below
		"istio":            map[string]any{"mode": "destinationrule", "labelNodes": true},
		"rebalancer":       map[string]any{"mode": "act", "period": "3s", "minAge": "1s"},
		"webhook":          map[string]any{"certificate": "secret", "caBundle": base64.StdEncoding.EncodeToString(webhookCert)},
	}
	rendered := render(t, values)
	objs := withoutHooks(rendered) // helm install creates the hooks only when their event comes
	preDelete, _ := hookObjects(rendered, "pre-delete")
	if got, want := granted(t, objs), expected(features{rebalance: true, act: true, dr: true, labelNodes: true, namespaced: true}); !slices.Equal(got, want) {
		t.Fatalf("the chart grants %v, the table %v", got, want)
	}
	if _, err := cs.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "edgeflow-webhook-tls"},
		Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": webhookCert, "tls.key": webhookKey}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cl.create(ctx, objs); err != nil {
		t.Fatalf("the API server refused the chart: %v", err)
	}

	r := a.launch(objs, c.Config.Host, func(addrs map[string]string) {
		// The API server reaches the webhook through its Service; here, at the address the
		// process listens on (kube-proxy's part).
		a.pointWebhookAt(addrs["webhook"], webhookCert)
	})
	addrs, started, stop, bin := r.addrs, r.started, r.stop, r.bin

	waitHTTP(t, "http://"+addrs["metrics"]+"/readyz", 60*time.Second)

	// xDS: a real grpc-go xDS client with a frontend pod's identity reaches backend.
	stopBackends := a.serveBackends()
	defer stopBackends()
	front := a.podsOf("frontend")[0].Name + "." + appNS
	client := xdsClient(t, addrs["xds"], front, "backend."+appNS, a.dial)
	served := firstCall(t, client, addrs["xds"])
	t.Logf("xDS: %s reached %s through edgeflow's weights", front, served)

	// Istio: the node labels and a DestinationRule for frontend → backend.
	testkit.Eventually(t, 60*time.Second, "every node labelled with its subzone", func() bool {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, n := range nodes.Items {
			if n.Labels["topology.istio.io/subzone"] != n.Name {
				return false
			}
		}
		return true
	})
	drs := destinationRules(t, ctx, cl, appNS)
	testkit.Eventually(t, 60*time.Second, "edgeflow's DestinationRule frontend → backend", func() bool {
		drs = destinationRules(t, ctx, cl, appNS)
		return slices.Contains(drs, "edgeflow.frontend.backend.shop")
	})
	t.Logf("DestinationRules in %s: %v", appNS, drs)

	// The rebalancer: a pod evicted and its replacement placed through the gate.
	var placed string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("edgeflow's rebalancer metrics:\n%s", grepLines(metricsText(addrs["metrics"]), "edgeflow_rebalance_"))
		}
	})
	testkit.Eventually(t, 120*time.Second, "a replacement placed on its planned node", func() bool {
		for _, app := range []string{"frontend", "backend"} {
			for _, p := range a.podsOf(app) {
				if on := p.Annotations["edgeflow.io/placed-on"]; on != "" && p.Spec.NodeName == on {
					placed = fmt.Sprintf("%s on %s", p.Name, on)
					return true
				}
			}
		}
		return false
	})
	t.Logf("moved: %s, %v after edgeflow started (rebalancer period 3 s)", placed, time.Since(started).Round(100*time.Millisecond))
	stop()

	// edgeflow down: the client keeps its last configuration and keeps calling.
	failed := 0
	const calls = 50
	for range calls {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
			failed++
		}
		cancel()
		time.Sleep(20 * time.Millisecond)
	}
	if failed > 0 {
		t.Errorf("with edgeflow stopped, %d of %d RPCs failed", failed, calls)
	}
	t.Logf("edgeflow stopped: %d of %d RPCs failed", failed, calls)

	grants := a.checkRequests(r, objs, c.AuditLog)
	a.accessReviews(grants)

	// helm uninstall: the pre-delete hook's Job (edgeflow uninstall with its own account: it
	// stops the Deployment, then removes what edgeflow wrote), the hook's objects deleted once
	// it succeeded, then the release's objects: nothing left but the application's churn.
	if err := cl.create(ctx, preDelete); err != nil {
		t.Fatalf("the API server refused the pre-delete hook: %v", err)
	}
	runHookJob(t, ctx, c, bin, preDelete)
	auditedRequestsOf(t, c.AuditLog, "system:serviceaccount:"+namespace+":"+release+"-uninstall") // fails on a refused request
	if err := cl.remove(ctx, preDelete); err != nil {
		t.Fatal(err)
	}
	if err := cl.remove(ctx, objs); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Secrets(namespace).Delete(ctx, "edgeflow-webhook-tls", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	cl.waitNoLeftovers(ctx, t, before, 60*time.Second, func(k string) bool {
		// the application's own pods and endpoints (moved pods have new names)
		return strings.HasPrefix(k, "/pods "+appNS+"/") || strings.HasPrefix(k, "discovery.k8s.io/endpointslices "+appNS+"/") ||
			strings.HasPrefix(k, "apps/replicasets "+appNS+"/") || strings.HasPrefix(k, "coordination.k8s.io/leases kube-node-lease/")
	})
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var labelled []string
	for _, n := range nodes.Items {
		if _, ok := n.Labels["topology.istio.io/subzone"]; ok {
			labelled = append(labelled, n.Name)
		}
	}
	// Not an object left behind, but a change: edgeflow uninstall does not take the subzone
	// labels back (docs/operations.md says how to).
	t.Logf("nodes still labelled topology.istio.io/subzone after uninstall: %v", labelled)
}

// apps is the application the rebalancer moves: frontend (3 pods, all on n1) calling
// backend (3 pods on n2 and n3), PodDisruptionBudgets minAvailable 2.
type apps struct {
	t       *testing.T
	ctx     context.Context
	cs      kubernetes.Interface
	watched []string // the chart's watch.namespaces

	mu    sync.Mutex
	local map[string]string // POD_IP:PORT → its stand-in's loopback address
}

// dial reaches a pod's address at its stand-in server.
func (a *apps) dial(ctx context.Context, addr string) (net.Conn, error) {
	a.mu.Lock()
	local, ok := a.local[addr]
	a.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("no pod serves %s", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", local)
}

func (a *apps) badLayout() {
	for _, app := range []string{"frontend", "backend"} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: appNS, Labels: map[string]string{kube.ManagedLabel: "true"}},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": app},
				Ports: []corev1.ServicePort{{Name: "grpc", Port: appPort, TargetPort: intstr.FromInt32(appPort)}}}}
		if _, err := a.cs.CoreV1().Services(appNS).Create(a.ctx, svc, metav1.CreateOptions{}); err != nil {
			a.t.Fatal(err)
		}
		two := intstr.FromInt32(2)
		pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: appNS},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &two, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}
		if _, err := a.cs.PolicyV1().PodDisruptionBudgets(appNS).Create(a.ctx, pdb, metav1.CreateOptions{}); err != nil {
			a.t.Fatal(err)
		}
	}
	a.cordon(true, "n2", "n3")
	a.deployment("frontend")
	a.settled("frontend")
	a.cordon(true, "n1")
	a.cordon(false, "n2", "n3")
	a.deployment("backend")
	a.settled("backend")
	a.cordon(false, "n1")
}

func (a *apps) deployment(app string) {
	replicas := int32(3)
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: appNS},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app",
					Ports: []corev1.ContainerPort{{ContainerPort: appPort}},
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")}}}}}}}}
	if _, err := a.cs.AppsV1().Deployments(appNS).Create(a.ctx, d, metav1.CreateOptions{}); err != nil {
		a.t.Fatal(err)
	}
}

func (a *apps) cordon(on bool, nodes ...string) {
	for _, name := range nodes {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := a.cs.CoreV1().Nodes().Get(a.ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Spec.Unschedulable = on
			_, err = a.cs.CoreV1().Nodes().Update(a.ctx, n, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			a.t.Fatal(err)
		}
	}
}

func (a *apps) podsOf(app string) []corev1.Pod {
	l, err := a.cs.CoreV1().Pods(appNS).List(a.ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		a.t.Fatal(err)
	}
	return l.Items
}

func ready(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Spec.NodeName == "" || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (a *apps) settled(app string) {
	testkit.Eventually(a.t, 60*time.Second, "3 ready pods of "+app, func() bool {
		ps := a.podsOf(app)
		n := 0
		for i := range ps {
			if ready(&ps[i]) {
				n++
			}
		}
		return n == 3 && len(ps) == 3
	})
}

// containerArgs turns the rendered container's arguments into this host's: each volume's
// contents (Secrets and ConfigMaps read from the API server, emptyDirs empty) in a folder
// standing in for its mount path, and each 0.0.0.0:PORT listener on a free loopback port (a
// pod has its own network namespace; this host is shared). It returns the arguments and the
// addresses by name (xds, metrics, webhook).
func (a *apps) containerArgs(ctr corev1.Container, vols []corev1.Volume) ([]string, map[string]string) {
	t := a.t
	dirs := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		i := slices.IndexFunc(vols, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 {
			t.Fatalf("volume mount %s names no volume", m.Name)
		}
		dir := t.TempDir()
		files := map[string][]byte{}
		switch v := vols[i]; {
		case v.Secret != nil:
			s, err := a.cs.CoreV1().Secrets(namespace).Get(a.ctx, v.Secret.SecretName, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("volume %s: %v", v.Name, err)
			}
			files = s.Data
		case v.ConfigMap != nil:
			cm, err := a.cs.CoreV1().ConfigMaps(namespace).Get(a.ctx, v.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("volume %s: %v", v.Name, err)
			}
			for k, s := range cm.Data {
				files[k] = []byte(s)
			}
		case v.EmptyDir != nil:
		default:
			t.Fatalf("volume %s: a kind this test does not mount", v.Name)
		}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		dirs[m.MountPath] = dir
	}
	addrs := map[string]string{}
	flagName := map[string]string{"--xds-address": "xds", "--metrics-address": "metrics", "--webhook-address": "webhook"}
	var out []string
	for _, arg := range ctr.Args {
		flag, val, _ := strings.Cut(arg, "=")
		if name, ok := flagName[flag]; ok && strings.HasPrefix(val, "0.0.0.0:") {
			addrs[name] = pickAddr(t)
			arg = flag + "=" + addrs[name]
		}
		for mount, dir := range dirs {
			if strings.HasPrefix(val, mount+"/") {
				arg = flag + "=" + dir + strings.TrimPrefix(val, mount)
			}
		}
		out = append(out, arg)
	}
	return out, addrs
}

// pickAddr picks a free loopback port for a process to listen on (launch starts again when
// another took it in between).
func pickAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// pointWebhookAt sets the rendered registration's client to the process's webhook address.
func (a *apps) pointWebhookAt(addr string, ca []byte) {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		wh, err := a.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(a.ctx, rebalancer.WebhookName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		url := "https://" + addr + rebalancer.WebhookPath
		wh.Webhooks[0].ClientConfig.Service = nil
		wh.Webhooks[0].ClientConfig.URL = &url
		wh.Webhooks[0].ClientConfig.CABundle = ca
		_, err = a.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(a.ctx, wh, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		a.t.Fatal(err)
	}
}

// tokenKubeconfig writes a kubeconfig holding a token of the chart's ServiceAccount (the
// TokenRequest API, as the kubelet's projected token): what in-cluster configuration would
// give the process, which reads its token and CA from fixed paths under /var/run/secrets.
func (a *apps) tokenKubeconfig(server string) string {
	return saKubeconfig(a.t, a.ctx, a.cs, "edgeflow", server)
}

// saKubeconfig writes a kubeconfig holding a TokenRequest token of the ServiceAccount sa in
// the release namespace.
func saKubeconfig(t *testing.T, ctx context.Context, cs kubernetes.Interface, sa, server string) string {
	t.Helper()
	secs := int64(3600)
	tok, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: edgeflow, user: {token: %q}}]
contexts: [{name: c, context: {cluster: c, user: edgeflow}}]
current-context: c
`, server, tok.Status.Token)
	if err := os.WriteFile(f, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// runEdgeflow starts the binary with args and env (and KUBECONFIG), its output in logFile; the
// returned stop sends SIGTERM and waits (SIGKILL after 15 s). It also runs at the test's end.
// exited is closed when the process has exited.
func runEdgeflow(t *testing.T, bin string, args []string, env []corev1.EnvVar, kubeconfig, logFile string) (stop func(), exited <-chan struct{}) {
	t.Helper()
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBERNETES_SERVICE_") && !strings.HasPrefix(e, "KUBECONFIG=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	for _, e := range env {
		if e.ValueFrom != nil {
			t.Fatalf("env %s from %v: not supported by this test", e.Name, e.ValueFrom)
		}
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	cmd.Env = append(cmd.Env, "KUBECONFIG="+kubeconfig)
	waited, err := testkit.StartChild(cmd) // Pdeathsig follows the forking thread: StartChild keeps it
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { <-waited; close(done) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			f.Close()
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			if b, err := os.ReadFile(logFile); err == nil {
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("edgeflow's log (last 80 lines):\n%s", strings.Join(lines[max(0, len(lines)-80):], "\n"))
			}
		}
	})
	return stop, done
}

func waitHTTP(t *testing.T, url string, d time.Duration) {
	t.Helper()
	testkit.EventuallyNoError(t, d, url+" answering 200", func() error { return getOK(url) })
}

// getOK says why a GET of url did not answer 200 (nil when it did).
func getOK(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// serveBackends serves a gRPC stand-in (testkit.Echo, answering with the pod's name) for
// POD_IP:9000 of every backend pod, as pods come; stop ends the watch, the stand-ins stop when
// the test ends.
func (a *apps) serveBackends() (stop func()) {
	a.local = map[string]string{}
	ctx, cancel := context.WithCancel(a.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for _, p := range a.podsOf("backend") {
				if p.Status.PodIP == "" {
					continue
				}
				addr := net.JoinHostPort(p.Status.PodIP, fmt.Sprint(appPort))
				a.mu.Lock()
				if a.local[addr] == "" {
					// not testkit.Listen: its Fatal must not run on this goroutine
					if l, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
						a.local[addr] = testkit.ServeEcho(a.t, l, p.Name).Addr
					}
				}
				a.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// xdsClient is a real grpc-go xDS client with node id node, dialing xds:///target (pod
// addresses through dial); its connection closes at the test's end.
func xdsClient(t *testing.T, xdsAddr, node, target string, dial func(context.Context, string) (net.Conn, error)) testgrpc.TestServiceClient {
	t.Helper()
	conn := xdsclient.Dial(t, xdsAddr, xdsclient.Node{ID: node, Cluster: "edgeflow-install"}, target, grpc.WithContextDialer(dial))
	return testgrpc.NewTestServiceClient(conn)
}

// firstCall returns the pod that answered the client's first successful call.
func firstCall(t *testing.T, client testgrpc.TestServiceClient, xdsAddr string) string {
	t.Helper()
	var served string
	testkit.EventuallyNoError(t, 60*time.Second, "an RPC over xDS from "+xdsAddr, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		served = resp.GetServerId()
		return err
	})
	return served
}

// destinationRules lists the DestinationRules' names in ns.
func destinationRules(t *testing.T, ctx context.Context, cl *client, ns string) []string {
	t.Helper()
	list, err := cl.dyn.Resource(drGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range list.Items {
		out = append(out, o.GetName())
	}
	return out
}

// auditedRequestsOf reads the API server's audit log: every request of the account user as
// "group/resource verb" (non-resource requests as "nonResource PATH verb"); a refused one
// fails the test.
func auditedRequestsOf(t *testing.T, path, user string) map[string]bool {
	t.Helper()
	calls, out := auditedCallsOf(t, path, user)
	for _, c := range calls {
		out[grant(c.group, c.resource, c.verb)] = true
	}
	return out
}

// auditedCallsOf reads the API server's audit log: every resource request of the account user
// as a call (its namespace and name as the authorizer saw them: a list's from its
// metadata.name field selector), and the non-resource ones as "nonResource PATH verb"; a
// refused request fails the test.
func auditedCallsOf(t *testing.T, path, user string) ([]call, map[string]bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var calls []call
	nonResource := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev struct {
			Stage      string `json:"stage"`
			Verb       string `json:"verb"`
			RequestURI string `json:"requestURI"`
			User       struct {
				Username string `json:"username"`
			} `json:"user"`
			ObjectRef *struct {
				Resource, Subresource, APIGroup, Namespace, Name string
			} `json:"objectRef"`
			ResponseStatus *struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"responseStatus"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.User.Username != user || ev.Stage != "ResponseComplete" {
			continue
		}
		if ev.ResponseStatus != nil && ev.ResponseStatus.Code == http.StatusForbidden {
			t.Errorf("the API server refused %s: %s %s: %s", user, ev.Verb, ev.RequestURI, ev.ResponseStatus.Message)
		}
		if ev.ObjectRef == nil {
			nonResource["nonResource "+strings.SplitN(ev.RequestURI, "?", 2)[0]+" "+ev.Verb] = true
			continue
		}
		res := ev.ObjectRef.Resource
		if ev.ObjectRef.Subresource != "" {
			res += "/" + ev.ObjectRef.Subresource
		}
		calls = append(calls, call{group: ev.ObjectRef.APIGroup, resource: res, verb: ev.Verb, namespace: ev.ObjectRef.Namespace, name: ev.ObjectRef.Name})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return calls, nonResource
}

// accessReviews asks the real authorizer what the chart's account may do (accessReviews).
func (a *apps) accessReviews(grants []string) { accessReviews(a.t, a.ctx, a.cs, grants, a.watched) }

// accessReviews asks the real authorizer what the chart's account may do, for every resource
// of the table and Secrets, every verb, in the release namespace, a watched one, istio-system,
// kube-system and cluster-wide, for no name, another name and each name the table limits that
// resource to: it must be allowed exactly where one of grants (the table's, the chart's)
// covers it, watched being the chart's watch.namespaces. So no ConfigMap or Lease verb reaches
// a name outside the named ones, no pod is patched, deleted or evicted outside the watched
// namespaces when there are some, and never a Secret. A disagreement is asked again for 10 s
// (the authorizer follows RBAC objects through informers).
func accessReviews(t *testing.T, ctx context.Context, cs kubernetes.Interface, grants, watched []string) {
	t.Helper()
	allowed := func(c call) bool {
		resource, sub, _ := strings.Cut(c.resource, "/")
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: saUser, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: c.namespace, Verb: c.verb, Group: c.group,
				Resource: resource, Subresource: sub, Name: c.name}}}
		out, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return out.Status.Allowed
	}
	type kind struct{ group, resource string }
	names := map[kind][]string{{"", "secrets"}: {"", "not-edgeflows"}}
	kinds := []kind{{"", "secrets"}}
	for _, p := range permissions {
		k := kind{p.group, p.resource}
		if _, ok := names[k]; !ok {
			kinds = append(kinds, k)
			names[k] = []string{"", "not-edgeflows"}
		}
		for _, n := range p.names {
			if !slices.Contains(names[k], n) {
				names[k] = append(names[k], n)
			}
		}
	}
	verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	var calls []call
	for _, k := range kinds {
		for _, v := range verbs {
			for _, ns := range []string{namespace, appNS, "istio-system", "kube-system", ""} {
				for _, n := range names[k] {
					calls = append(calls, call{group: k.group, resource: k.resource, verb: v, namespace: ns, name: n})
				}
			}
		}
	}
	// Four reviews at a time.
	got := make([]bool, len(calls))
	var wg sync.WaitGroup
	next := make(chan int)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				got[i] = allowed(calls[i])
			}
		}()
	}
	for i := range calls {
		next <- i
	}
	close(next)
	wg.Wait()
	var wrong []int
	yes := 0
	for i, c := range calls {
		if got[i] {
			yes++
		}
		if got[i] != allowedBy(grants, c, watched) {
			wrong = append(wrong, i)
		}
	}
	if len(wrong) > 0 {
		testkit.WaitUntil(10*time.Second, func() bool {
			wrong = slices.DeleteFunc(wrong, func(i int) bool { return allowed(calls[i]) == allowedBy(grants, calls[i], watched) })
			return len(wrong) == 0
		})
	}
	for _, i := range wrong {
		c := calls[i]
		what, want := "may", "no grant covers it"
		if allowedBy(grants, c, watched) {
			what, want = "may not", "a grant covers it"
		}
		res := c.resource
		if c.group != "" {
			res += "." + c.group
		}
		t.Errorf("the chart's account %s %s %s %q in %q; of the grants %s", what, c.verb, res, c.name, c.namespace, want)
	}
	t.Logf("SubjectAccessReviews: %d (resource, verb, namespace, name) asked, %d allowed, %d not as granted (watched namespaces %v)", len(calls), yes, len(wrong), watched)
}

func grepLines(s, word string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(strings.ToLower(l), word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func metricsText(addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// run is one edgeflow process started as the chart's container.
type run struct {
	bin, logFile string
	addrs        map[string]string // xds, metrics, webhook
	started      time.Time
	stop         func()
}

// launch runs the rendered Deployment's container as the kubelet would: the rendered
// arguments, the volumes' contents in folders standing in for their mount paths, a token of
// the chart's ServiceAccount. before runs once the addresses are known, before the start. It
// returns once /readyz answers 200.
func (a *apps) launch(objs []*unstructured.Unstructured, server string, before func(addrs map[string]string)) *run {
	t := a.t
	var dep appsv1.Deployment
	convert(t, find(t, objs, "Deployment", release), &dep)
	ctr := dep.Spec.Template.Spec.Containers[0]
	kubeconfig := a.tokenKubeconfig(server)
	r := &run{bin: testkit.Binary(t)}
	// The listeners' ports are picked before the start (the webhook's address is registered
	// first): when another process took one in between, edgeflow exits and starts again.
	for attempt := 1; ; attempt++ {
		args, addrs := a.containerArgs(ctr, dep.Spec.Template.Spec.Volumes)
		if before != nil {
			before(addrs)
		}
		r.addrs, r.logFile, r.started = addrs, filepath.Join(t.TempDir(), "edgeflow.log"), time.Now()
		var exited <-chan struct{}
		r.stop, exited = runEdgeflow(t, r.bin, args, ctr.Env, kubeconfig, r.logFile)
		t.Logf("edgeflow %s", strings.Join(args, " "))
		readyz := "http://" + addrs["metrics"] + "/readyz"
		var last error
		testkit.WaitUntil(60*time.Second, func() bool {
			select {
			case <-exited:
				return true
			default:
			}
			last = getOK(readyz)
			return last == nil
		})
		select {
		case <-exited:
			log, _ := os.ReadFile(r.logFile)
			if attempt < 3 && strings.Contains(string(log), "address already in use") {
				continue
			}
			t.Fatal("edgeflow exited during start-up (its log follows)")
		default:
		}
		if last != nil {
			t.Fatalf("%s not 200 after %v: %v", readyz, 60*time.Second, last)
		}
		return r
	}
}

// checkRequests (after r stopped) fails on "forbidden" in the log, a 403 in the audit log or a
// request no rendered grant covers (its scope and name included), logs which grants the run
// used and which not, and returns the grants.
func (a *apps) checkRequests(r *run, objs []*unstructured.Unstructured, auditLog string) []string {
	t := a.t
	log, err := os.ReadFile(r.logFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(string(log)), "forbidden") {
		t.Errorf("edgeflow's log names a forbidden request:\n%s", grepLines(string(log), "forbidden"))
	}
	calls, _ := auditedCallsOf(t, auditLog, saUser)
	grants := granted(t, objs)
	used := map[string]bool{}
	beyond := map[string]bool{}
	for _, c := range calls {
		hit := false
		for _, g := range grants {
			if covers(g, c, a.watched) {
				used[g], hit = true, true
			}
		}
		if !hit {
			beyond[fmt.Sprintf("%s in %q name %q", grant(c.group, c.resource, c.verb), c.namespace, c.name)] = true
		}
	}
	var unused []string
	for _, g := range grants {
		if !used[g] {
			unused = append(unused, g)
		}
	}
	t.Logf("grants edgeflow's requests used (audit log, %d requests): %v", len(calls), sortedSet(used))
	t.Logf("granted but not exercised in this run: %v", unused)
	for _, b := range sortedSet(beyond) {
		t.Errorf("edgeflow made a request no rendered grant covers: %s", b)
	}
	return grants
}
