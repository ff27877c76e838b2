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
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/edgeflow/edgeflow/internal/testkit"
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
	since int64 // where this run's output begins in log
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
	cache, err := cacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "k8s-"+version)
	for _, b := range []string{"kube-apiserver", "kube-scheduler", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s not built (%s)", b, dir)
		}
	}
	return dir, nil
}

// cacheDir is $EDGEFLOW_CACHE, else ~/.cache/edgeflow.
func cacheDir() (string, error) {
	if cache := os.Getenv("EDGEFLOW_CACHE"); cache != "" {
		return cache, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".cache", "edgeflow"), nil
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
//
// At most $EDGEFLOW_KUBEAPI_BOOTS control planes (default 2) boot at once on this machine, across
// test processes: Start waits for a boot slot, holds it until every process it starts is ready and
// lets it go when it returns. When etcd or a Kubernetes component cannot bind the port picked for
// it (taken in between by another test), Start stops what it started and boots again on other
// ports, a few times.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	binDir := Require(t)
	c := &Cluster{t: t, binDir: binDir}
	t.Cleanup(c.stop)
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	c.token = hex.EncodeToString(tok)
	base := t.TempDir()
	dir, slots, err := bootSlots()
	if err != nil {
		t.Fatal(err)
	}
	release, err := acquireBootSlot(t, dir, slots)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	for attempt := 1; ; attempt++ {
		c.dir = filepath.Join(base, fmt.Sprintf("boot%d", attempt))
		err := c.start(opts)
		if err == nil {
			return c
		}
		var taken *portTakenError
		if !errors.As(err, &taken) || attempt == bootAttempts {
			t.Fatal(err)
		}
		t.Logf("kubeapi: %v; booting again on other ports", err)
		if err := c.stopAll(); err != nil {
			t.Fatal(err)
		}
	}
}

// bootAttempts bounds how many times Start boots a control plane whose ports were taken.
const bootAttempts = 4

// BootSlotsEnv names the environment variable that bounds how many control planes boot at once
// on this machine (a positive integer; default 2).
const BootSlotsEnv = "EDGEFLOW_KUBEAPI_BOOTS"

// bootSlots is where the boot slots' lock files are (the cache folder) and how many there are.
func bootSlots() (dir string, n int, err error) {
	n = 2
	if v := os.Getenv(BootSlotsEnv); v != "" {
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			return "", 0, fmt.Errorf("kubeapi: %s=%q: want a positive integer", BootSlotsEnv, v)
		}
	}
	dir, err = cacheDir()
	return dir, n, err
}

// acquireBootSlot takes one of n boot slots in dir, waiting while they are all held: slot i is
// an exclusive flock on dir/kubeapi-boot-i.lock, held by an open file of this process (not
// inherited by the processes it starts), so a test process that dies holding one lets it go.
// release gives it back.
func acquireBootSlot(t testing.TB, dir string, n int) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	began := time.Now()
	for {
		for i := range n {
			f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("kubeapi-boot-%d.lock", i)), os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				return nil, err
			}
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
			if err == nil {
				if waited := time.Since(began); waited > time.Second {
					t.Logf("kubeapi: waited %v for one of %d boot slots (%s)", waited.Round(time.Millisecond), n, BootSlotsEnv)
				}
				return func() { f.Close() }, nil
			}
			f.Close()
			if !errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("kubeapi: boot slot %d: %w", i, err)
			}
		}
		time.Sleep(20*time.Millisecond + time.Duration(mrand.Int64N(int64(30*time.Millisecond))))
	}
}

// portTakenError: a process exited during start-up because its port was taken (line: the
// line of its log that says so).
type portTakenError struct {
	name, line string
}

func (e *portTakenError) Error() string {
	return fmt.Sprintf("%s could not bind its port: %s", e.name, e.line)
}

// pickPorts is freePorts (a test makes it hand out a port that is taken).
var pickPorts = freePorts

// freePorts picks n ports that are free now. They are closed again for the processes to bind:
// another test may take one in between, which Start notices (portTakenError) and boots again.
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

// start boots one attempt in c.dir, on ports picked afresh.
func (c *Cluster) start(opts Options) error {
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return err
	}
	ports, err := pickPorts(5)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer, apiPort, schedPort, cmPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	if err := c.writeFiles(apiPort); err != nil {
		return err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	// The member name is this cluster's own: the apiserver is started only once the etcd at
	// etcdURL answers with it, never on another test's etcd that holds the port.
	member := "edgeflow-" + c.token[:12]
	if err := c.run("etcd", "etcd", "--name", member, "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", member+"="+peerURL, "--unsafe-no-fsync"); err != nil {
		return err
	}
	if err := c.waitEtcd(etcdURL, member); err != nil {
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
	since, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		logFile.Close()
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	exited, err := testkit.StartChild(cmd) // Pdeathsig follows the forking thread: StartChild keeps it
	if err != nil {
		logFile.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p.cmd, p.log, p.since, p.done = cmd, logPath, since, make(chan struct{})
	done := p.done
	go func() { <-exited; logFile.Close(); close(done) }()
	return nil
}

// waitReady waits until ready (a URL) answers 200, for the process started last (while every process
// started so far runs).
func (c *Cluster) waitReady(ready string) error {
	p := c.procs[len(c.procs)-1]
	p.ready = ready
	return c.waitProcess(p, c.procs...)
}

// startupTimeout bounds how long a process may take to serve.
const startupTimeout = 90 * time.Second

// waitProcess waits until p's ready URL answers 200 to the cluster's token (a server of another
// test that took the port answers 401), while the processes watched run.
func (c *Cluster) waitProcess(p *process, watched ...*process) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	return c.waitServing(p, watched, func() error {
		req, _ := http.NewRequest(http.MethodGet, p.ready, nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
}

// waitEtcd waits until the etcd at endpoint serves and is the member named member: the etcd started
// last, not another test's.
func (c *Cluster) waitEtcd(endpoint, member string) error {
	p := c.procs[len(c.procs)-1]
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	return c.waitServing(p, c.procs, func() error {
		resp, err := client.Post(endpoint+"/v3/cluster/member/list", "application/json", strings.NewReader("{}"))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var list struct {
			Members []struct{ Name string } `json:"members"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			return fmt.Errorf("%s: %w", resp.Status, err)
		}
		if len(list.Members) != 1 || list.Members[0].Name != member {
			return fmt.Errorf("members %+v, want only %s", list.Members, member)
		}
		return nil
	})
}

// waitServing checks serving until it holds, failing when one of the processes watched (p among
// them) exits first (with a portTakenError when its port was taken) or startupTimeout passes.
func (c *Cluster) waitServing(p *process, watched []*process, serving func() error) error {
	ctx, cancel := context.WithTimeout(context.Background(), startupTimeout)
	defer cancel()
	var exited error
	err := testkit.WaitContext(ctx, func() (bool, error) {
		for _, q := range watched {
			select {
			case <-q.done:
				log := q.tail(30)
				if i := strings.Index(log, "address already in use"); i >= 0 {
					line := log[strings.LastIndexByte(log[:i], '\n')+1:]
					line, _, _ = strings.Cut(line, "\n")
					exited = &portTakenError{name: q.name, line: line}
				} else {
					exited = fmt.Errorf("%s exited during start-up:\n%s", q.name, log)
				}
				cancel()
				return false, nil
			default:
			}
		}
		err := serving()
		return err == nil, err
	})
	if exited != nil {
		return exited
	}
	if err != nil {
		return fmt.Errorf("%s not ready within %v (%v):\n%s", p.name, startupTimeout, err, p.tail(30))
	}
	return nil
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
		for attempt := 1; ; attempt++ {
			if err := c.launch(p); err != nil {
				return err
			}
			err := c.waitProcess(p, p)
			var taken *portTakenError
			if err == nil || !errors.As(err, &taken) || attempt == bootAttempts || !p.repick() {
				return err
			}
			c.t.Logf("kubeapi: %v; starting it again on another port", err)
		}
	}
	return fmt.Errorf("kubeapi: no process %q", name)
}

// repick moves p to another --secure-port, picked afresh, when no other process dials it
// (kube-scheduler, kube-controller-manager); it reports whether it did.
func (p *process) repick() bool {
	if p.name == "kube-apiserver" || p.name == "etcd" {
		return false
	}
	ports, err := freePorts(1)
	if err != nil {
		return false
	}
	u, err := url.Parse(p.ready)
	if err != nil {
		return false
	}
	for i, a := range p.args {
		if strings.HasPrefix(a, "--secure-port=") {
			p.args[i] = fmt.Sprintf("--secure-port=%d", ports[0])
			u.Host = fmt.Sprintf("127.0.0.1:%d", ports[0])
			p.ready = u.String()
			return true
		}
	}
	return false
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
			c.t.Logf("%s log (tail):\n%s", p.name, p.tail(20))
		}
	}
}

// stopAll stops every process of a failed boot and forgets them, for Start to boot again.
func (c *Cluster) stopAll() error {
	for i := len(c.procs) - 1; i >= 0; i-- {
		if err := c.procs[i].stop(); err != nil {
			return err
		}
	}
	c.procs = nil
	return nil
}

// Context returns a context for API calls bounded by the test's deadline (or 2 minutes).
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// tail is the last n lines p's current run wrote to its log.
func (p *process) tail(n int) string {
	f, err := os.Open(p.log)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if _, err := f.Seek(p.since, io.SeekStart); err != nil {
		return err.Error()
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
