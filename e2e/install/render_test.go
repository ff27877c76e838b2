// Package install tests the Helm chart install/helm/edgeflow on a real kube-apiserver: every
// rendering is accepted, uninstalling leaves nothing, and edgeflow runs with exactly the
// chart's permissions.
package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/testkit"
)

// helmVersion is the Helm the Makefile's helm target builds (keep them equal).
const helmVersion = "v3.22.0"

// kubeVersion is the Kubernetes version helm template renders for (the Makefile's KUBE_VERSION;
// a helm built with go install would assume v1.20, which the chart refuses).
const kubeVersion = "v1.37.2"

// The CRDs the chart's objects need besides Istio's, from these modules of the Go module proxy
// (their YAML, not their Go code: nothing is imported).
const (
	promOperatorModule = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
	certManagerModule  = "github.com/cert-manager/cert-manager@v1.21.2"
)

// release and namespace of every rendering.
const (
	release   = "edgeflow"
	namespace = "edgeflow"
)

// helmBinary is the cached helm (make helm), else the test skips (fails under CI=true).
func helmBinary(t *testing.T) string {
	t.Helper()
	cache := os.Getenv("EDGEFLOW_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "edgeflow")
	}
	bin := filepath.Join(cache, "bin", "helm-"+helmVersion, "helm")
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("helm %s not built (%s): make helm", helmVersion, bin)
		}
		t.Skipf("skipped: helm %s not built (%s); run make helm", helmVersion, bin)
	}
	return bin
}

// render runs helm template on the chart with values (nil: the defaults) and returns the
// objects in the order helm prints them.
func render(t *testing.T, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	out, err := renderRaw(t, values)
	if err != nil {
		t.Fatal(err)
	}
	return decodeAll(t, out)
}

// renderRaw is helm template's output for the Kubernetes the tests run (kubeVersion, serving
// policyAPI, as helm install would read from its discovery; the Makefile's KUBE_API_VERSIONS).
func renderRaw(t *testing.T, values map[string]any, extra ...string) ([]byte, error) {
	t.Helper()
	return renderFor(t, values, append([]string{"--api-versions", policyAPI}, extra...)...)
}

// everyNamespaceUnlessNamed returns values with watch.namespaces ["*"] (every namespace,
// explicitly) when they name none, as make manifests renders: the chart refuses an Istio mode
// (the default, destinationrule) without watch.namespaces. values itself is not modified.
func everyNamespaceUnlessNamed(values map[string]any) map[string]any {
	watch, _ := values["watch"].(map[string]any)
	if _, named := watch["namespaces"]; named {
		return values
	}
	out := maps.Clone(values)
	if out == nil {
		out = map[string]any{}
	}
	w := maps.Clone(watch)
	if w == nil {
		w = map[string]any{}
	}
	w["namespaces"] = []any{"*"}
	out["watch"] = w
	return out
}

// renderFor is helm template's output with only the capabilities extra gives it beyond its
// own (Kubernetes kubeVersion's group versions, no kinds).
func renderFor(t *testing.T, values map[string]any, extra ...string) ([]byte, error) {
	t.Helper()
	args := []string{"template", release, filepath.Join(testkit.RepoRoot(), "install", "helm", "edgeflow"), "--namespace", namespace, "--kube-version", kubeVersion}
	values = everyNamespaceUnlessNamed(values)
	if values != nil {
		raw, err := yaml.Marshal(values)
		if err != nil {
			t.Fatal(err)
		}
		// helm splits --values at commas, which t.TempDir's subtest names may hold
		dir, err := os.MkdirTemp("", "edgeflow-values-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		f := filepath.Join(dir, "values.yaml")
		if err := os.WriteFile(f, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--values", f)
	}
	args = append(args, extra...)
	cmd := exec.Command(helmBinary(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

func decodeAll(t *testing.T, raw []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if m == nil {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// find returns the rendered object of kind and name, or fails.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("rendered chart has no %s %s", kind, name)
	return nil
}

// convert turns an unstructured object into a typed one.
func convert(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	raw, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, into); err != nil {
		t.Fatal(err)
	}
}

// client reaches the API server with the dynamic client and a REST mapper that rediscovers
// after CRDs are added.
type client struct {
	dyn    dynamic.Interface
	disc   discovery.DiscoveryInterface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newClient(t *testing.T, cfg *rest.Config) *client {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &client{dyn: dyn, disc: disc, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
}

func (c *client) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		c.mapper.Reset()
		if m, err = c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return nil, fmt.Errorf("%s: %w", gvk, err)
		}
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return c.dyn.Resource(m.Resource).Namespace(o.GetNamespace()), nil
	}
	return c.dyn.Resource(m.Resource), nil
}

// create creates every object (the API server validates each: schema, CRD schema, admission).
func (c *client) create(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		r, err := c.resource(o)
		if err != nil {
			return err
		}
		if _, err := r.Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			return fmt.Errorf("%s %s/%s: %w", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
	return nil
}

// remove deletes every object (helm uninstall does this: every object of the release) and
// waits until each is gone.
func (c *client) remove(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range slices.Backward(objs) {
		r, err := c.resource(o)
		if err != nil {
			return err
		}
		bg := metav1.DeletePropagationBackground
		if err := r.Delete(ctx, o.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %s %s/%s: %w", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
	return nil
}

// installCRDs creates the CustomResourceDefinitions in files and waits until they are served.
func (c *client) installCRDs(ctx context.Context, t *testing.T, files ...string) {
	t.Helper()
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	var names []string
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range decodeAll(t, raw) {
			if o.GetKind() != "CustomResourceDefinition" {
				continue
			}
			if _, err := c.dyn.Resource(gvr).Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatalf("CRD %s (%s): %v", o.GetName(), f, err)
			}
			names = append(names, o.GetName())
		}
	}
	for _, n := range names {
		testkit.EventuallyNoError(t, 30*time.Second, "CRD "+n+" established", func() error {
			crd, err := c.dyn.Resource(gvr).Get(ctx, n, metav1.GetOptions{})
			if err == nil && !established(crd) {
				err = errors.New("not established")
			}
			return err
		})
	}
	c.mapper.Reset()
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// moduleDir downloads a module (module@version) through the Go module proxy into the module
// cache and returns its folder.
func moduleDir(t *testing.T, module string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", module)
	cmd.Dir = t.TempDir() // outside any module: the download needs no go.mod entry
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); err != nil || jerr != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: %v %s", module, err, info.Error)
	}
	return info.Dir
}

// istioCRDs is Istio's crd-all.gen.yaml from the istio.io/istio module e2e/istio builds
// against (downloaded through the module proxy if the cache lacks it).
func istioCRDs(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", "istio.io/istio")
	cmd.Dir = filepath.Join(testkit.RepoRoot(), "e2e", "istio")
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); err != nil || jerr != nil || info.Dir == "" {
		t.Fatalf("go mod download istio.io/istio (in e2e/istio): %v %s", err, info.Error)
	}
	return filepath.Join(info.Dir, "manifests", "charts", "base", "files", "crd-all.gen.yaml")
}

// installAllCRDs installs Istio's, the Prometheus Operator's (PodMonitor, ScrapeConfig) and
// cert-manager's (Certificate, Issuer) CRDs.
func installAllCRDs(ctx context.Context, t *testing.T, c *client) {
	t.Helper()
	po := filepath.Join(moduleDir(t, promOperatorModule), "example", "prometheus-operator-crd")
	cm := filepath.Join(moduleDir(t, certManagerModule), "deploy", "crds")
	c.installCRDs(ctx, t, istioCRDs(t),
		filepath.Join(po, "monitoring.coreos.com_podmonitors.yaml"),
		filepath.Join(po, "monitoring.coreos.com_scrapeconfigs.yaml"),
		filepath.Join(cm, "cert-manager.io_certificates.yaml"),
		filepath.Join(cm, "cert-manager.io_issuers.yaml"))
}

// snapshot lists every object of every kind the API server serves that can be listed,
// as "group/resource namespace/name" (events excluded: the API server's own record).
func (c *client) snapshot(ctx context.Context, t *testing.T) map[string]bool {
	t.Helper()
	lists, err := c.disc.ServerPreferredResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			if !slices.Contains(r.Verbs, "list") || strings.Contains(r.Name, "/") || r.Name == "events" {
				continue
			}
			list, err := c.dyn.Resource(gv.WithResource(r.Name)).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatalf("listing %s: %v", r.Name, err)
			}
			for _, o := range list.Items {
				if o.GetDeletionTimestamp() != nil {
					continue
				}
				out[fmt.Sprintf("%s/%s %s/%s", gv.Group, r.Name, o.GetNamespace(), o.GetName())] = true
			}
		}
	}
	return out
}

// leftovers is what after holds that before did not.
func leftovers(before, after map[string]bool) []string {
	var out []string
	for k := range after {
		if !before[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// waitNoLeftovers waits (deletion is asynchronous: garbage collection of owned objects)
// until the cluster holds nothing more than before, else fails naming what is left.
func (c *client) waitNoLeftovers(ctx context.Context, t *testing.T, before map[string]bool, d time.Duration, ignore func(string) bool) {
	t.Helper()
	var left []string
	if !testkit.WaitUntil(d, func() bool {
		left = left[:0]
		for _, k := range leftovers(before, c.snapshot(ctx, t)) {
			if ignore == nil || !ignore(k) {
				left = append(left, k)
			}
		}
		return len(left) == 0
	}) {
		t.Fatalf("left behind after uninstall (%v):\n  %s", d, strings.Join(left, "\n  "))
	}
}

// createNamespaces creates the namespaces names.
func createNamespaces(ctx context.Context, t *testing.T, cs kubernetes.Interface, names ...string) {
	t.Helper()
	for _, ns := range names {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// startAPIServer runs etcd and kube-apiserver (and what opts asks for).
func startAPIServer(t *testing.T, opts kubeapi.Options) (*kubeapi.Cluster, *client) {
	t.Helper()
	helmBinary(t) // skip before starting anything when helm is missing
	c := kubeapi.Start(t, opts)
	return c, newClient(t, c.Config)
}

var drGVR = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}
