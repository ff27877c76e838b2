// Package kubeapi runs a real Kubernetes control plane for tests: etcd (Debian's etcd-server)
// and kube-apiserver built from the Go module proxy by e2e/k8s/build.sh and cached under
// ~/.cache/edgeflow/k8s-VERSION/. Optionally kube-scheduler and kube-controller-manager from the
// same build. No kubelet runs: tests play it, by hand (Kubelet: bind pods, set them ready) or
// with a FakeKubelet that runs whatever kube-scheduler binds and renews the nodes' Leases.
package kubeapi

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Cluster is a running etcd + kube-apiserver on 127.0.0.1. Start registers its teardown with
// t.Cleanup; every process it starts is killed and waited for, also when the test fails.
type Cluster struct {
	// Config reaches the apiserver as a cluster admin (system:masters).
	Config *rest.Config
	// Client is a clientset on Config.
	Client kubernetes.Interface
	// Kubeconfig is the path of a kubeconfig file for Config (for CLI flags).
	Kubeconfig string
	// AuditLog is the path of the API server's audit log (Options.AuditLog), else "".
	AuditLog string

	t      testing.TB
	dir    string
	binDir string
	token  string
	procs  []*process
}

// Options says what to run besides etcd and kube-apiserver.
type Options struct {
	// Scheduler and ControllerManager start kube-scheduler and kube-controller-manager.
	Scheduler, ControllerManager bool
	// AuditLog makes kube-apiserver log every request at level Metadata (who, user agent,
	// verb, resource) to Cluster.AuditLog, as JSON lines.
	AuditLog bool
}

type process struct {
	name  string
	bin   string
	args  []string
	ready string // the URL that answers 200 once it serves
	cmd   *exec.Cmd
	log   string
	done  chan struct{}
}

// Require skips the test with one line when the control plane cannot run here (the binaries
// are not built, or etcd is not installed), unless CI=true, when it fails it instead: in CI the
// live tests must run. It returns the binary folder.
func Require(t testing.TB) string {
	t.Helper()
	dir, err := BinDir()
	if err == nil {
		_, err = exec.LookPath("etcd")
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("kube-apiserver test cannot run in CI: %v (.ci/run installs etcd-server and runs e2e/k8s/build.sh)", err)
		}
		t.Skipf("skipped: no real control plane here (%v); run e2e/k8s/build.sh and apt-get install etcd-server", err)
	}
	return dir
}

// BinDir returns the folder of the cached control-plane binaries for the version e2e/k8s pins.
func BinDir() (string, error) {
	_, file, _, _ := runtime.Caller(0)
	mod := filepath.Join(filepath.Dir(file), "..", "k8s", "go.mod")
	version, err := pinnedVersion(mod)
	if err != nil {
		return "", err
	}
	cache := os.Getenv("EDGEFLOW_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache", "edgeflow")
	}
	dir := filepath.Join(cache, "k8s-"+version)
	for _, b := range []string{"kube-apiserver", "kube-scheduler", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s not built (%s)", b, dir)
		}
	}
	return dir, nil
}

func pinnedVersion(goMod string) (string, error) {
	f, err := os.Open(goMod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "k8s.io/kubernetes" {
			return fields[1], nil
		}
	}
	return "", fmt.Errorf("%s: no k8s.io/kubernetes requirement", goMod)
}

// Start runs etcd and kube-apiserver (and what opts asks for) and waits until the apiserver is
// ready. It skips or fails the test as Require does when they cannot run.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	binDir := Require(t)
	c := &Cluster{t: t, dir: t.TempDir(), binDir: binDir}
	t.Cleanup(c.stop)
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	c.token = hex.EncodeToString(tok)
	if err := c.start(opts); err != nil {
		t.Fatal(err)
	}
	return c
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (c *Cluster) start(opts Options) error {
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer, apiPort, schedPort, cmPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	if err := c.writeFiles(apiPort); err != nil {
		return err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	if err := c.run("etcd", "etcd", "--name", "edgeflow-test", "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "edgeflow-test="+peerURL, "--unsafe-no-fsync"); err != nil {
		return err
	}
	var audit []string
	if opts.AuditLog {
		policy := filepath.Join(c.dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n"), 0o600); err != nil {
			return err
		}
		c.AuditLog = filepath.Join(c.dir, "audit.log")
		audit = []string{"--audit-policy-file", policy, "--audit-log-path", c.AuditLog, "--audit-log-mode", "blocking"}
	}
	if err := c.run("kube-apiserver", filepath.Join(c.binDir, "kube-apiserver"), append([]string{
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		fmt.Sprintf("--secure-port=%d", apiPort), "--cert-dir", filepath.Join(c.dir, "certs"),
		"--service-cluster-ip-range", "10.0.0.0/24",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", filepath.Join(c.dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(c.dir, "sa.key"),
		"--token-auth-file", filepath.Join(c.dir, "tokens.csv"), "--authorization-mode", "RBAC",
		"--disable-admission-plugins", "ServiceAccount", "--allow-privileged=true",
		"--endpoint-reconciler-type", "none"}, audit...)...); err != nil {
		return err
	}
	c.Config = &rest.Config{Host: fmt.Sprintf("https://127.0.0.1:%d", apiPort), BearerToken: c.token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 200, Burst: 400}
	if err := c.waitReady(fmt.Sprintf("https://127.0.0.1:%d/readyz", apiPort)); err != nil {
		return err
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}
	if opts.Scheduler {
		if err := c.run("kube-scheduler", filepath.Join(c.binDir, "kube-scheduler"),
			"--kubeconfig", c.Kubeconfig, "--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
			"--bind-address", "127.0.0.1", fmt.Sprintf("--secure-port=%d", schedPort), "--leader-elect=false"); err != nil {
			return err
		}
		if err := c.waitReady(fmt.Sprintf("https://127.0.0.1:%d/healthz", schedPort)); err != nil {
			return err
		}
	}
	if opts.ControllerManager {
		if err := c.run("kube-controller-manager", filepath.Join(c.binDir, "kube-controller-manager"),
			"--kubeconfig", c.Kubeconfig, "--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
			"--bind-address", "127.0.0.1", fmt.Sprintf("--secure-port=%d", cmPort), "--leader-elect=false",
			"--service-account-private-key-file", filepath.Join(c.dir, "sa.key"),
			"--use-service-account-credentials=false", "--controllers", "*,-serviceaccount-token-controller"); err != nil {
			return err
		}
		if err := c.waitReady(fmt.Sprintf("https://127.0.0.1:%d/healthz", cmPort)); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) writeFiles(apiPort int) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
		"tokens.csv": []byte(c.token + ",admin,admin-uid,system:masters\n"),
		"kubeconfig": []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:%d", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: %s}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
`, apiPort, c.token)),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(c.dir, name), data, 0o600); err != nil {
			return err
		}
	}
	c.Kubeconfig = filepath.Join(c.dir, "kubeconfig")
	return nil
}

// run starts a child in its own process group that dies with the test binary (Pdeathsig).
func (c *Cluster) run(name, bin string, args ...string) error {
	p := &process{name: name, bin: bin, args: args}
	if err := c.launch(p); err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil
}

// launch starts p's binary (again), appending to its log.
func (c *Cluster) launch(p *process) error {
	name, bin, args := p.name, p.bin, p.args
	logPath := filepath.Join(c.dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p.cmd, p.log, p.done = cmd, logPath, make(chan struct{})
	done := p.done
	go func() { _ = cmd.Wait(); logFile.Close(); close(done) }()
	return nil
}

// waitReady waits until url answers 200, for the process started last.
func (c *Cluster) waitReady(url string) error {
	p := c.procs[len(c.procs)-1]
	p.ready = url
	return c.waitProcess(p)
}

func (c *Cluster) waitProcess(p *process) error {
	url, name := p.ready, p.name
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited during start-up:\n%s", name, tail(p.log, 30))
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready within 90 s (last: %s):\n%s", name, last, tail(p.log, 30))
}

// Stop stops one of the processes (by name, e.g. "kube-apiserver") and waits for it to exit.
func (c *Cluster) Stop(name string) error {
	for _, p := range c.procs {
		if p.name == name {
			return p.stop()
		}
	}
	return fmt.Errorf("kubeapi: no process %q", name)
}

// Restart starts a process Stop stopped (by name, e.g. "kube-scheduler") again, with the same
// arguments, and waits until it serves.
func (c *Cluster) Restart(name string) error {
	for _, p := range c.procs {
		if p.name != name {
			continue
		}
		if err := p.stop(); err != nil {
			return err
		}
		if err := c.launch(p); err != nil {
			return err
		}
		return c.waitProcess(p)
	}
	return fmt.Errorf("kubeapi: no process %q", name)
}

func (p *process) stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("kubeapi: " + p.name + " did not exit after SIGKILL")
	}
}

func (c *Cluster) stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		if err := p.stop(); err != nil {
			c.t.Error(err)
		}
		if c.t.Failed() {
			c.t.Logf("%s log (tail):\n%s", p.name, tail(p.log, 20))
		}
	}
}

// Context returns a context for API calls bounded by the test's deadline (or 2 minutes).
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
