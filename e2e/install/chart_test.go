package install

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/watcher/probesd"
)

// variant is one rendering of the chart: its values and the RBAC features they switch on.
type variant struct {
	name   string
	values map[string]any
	f      features
}

func variants(t *testing.T) []variant {
	caPEM, _ := testkit.SelfSigned(t, "webhook-ca")
	return []variant{
		{"defaults", nil, features{rebalance: true, dr: true}},
		{"rebalancer off, istio off", map[string]any{"rebalancer": map[string]any{"mode": "off"}, "istio": map[string]any{"mode": "off"}}, features{}},
		{"rebalancer acting, webhook certificate by cert-manager", map[string]any{"rebalancer": map[string]any{"mode": "act"}},
			features{rebalance: true, act: true, dr: true}},
		{"rebalancer acting, webhook certificate from a Secret", map[string]any{"rebalancer": map[string]any{"mode": "act"},
			"webhook": map[string]any{"certificate": "secret", "caBundle": base64.StdEncoding.EncodeToString(caPEM)}, "istio": map[string]any{"mode": "off"}},
			features{rebalance: true, act: true}},
		{"istio destinationrule, node labels", map[string]any{"istio": map[string]any{"mode": "destinationrule", "labelNodes": true}},
			features{rebalance: true, dr: true, labelNodes: true}},
		{"istio envoyfilter", map[string]any{"istio": map[string]any{"mode": "envoyfilter"}}, features{rebalance: true, ef: true}},
		{"istio destinationrule, rebalancer off", map[string]any{"istio": map[string]any{"mode": "destinationrule"}, "rebalancer": map[string]any{"mode": "off"}},
			features{dr: true}},
		{"prometheus operator, probes per zone, proxyless clients, xds certificate by cert-manager", map[string]any{
			"scrape":        map[string]any{"operator": true},
			"latencyProbes": map[string]any{"granularity": "zone"},
			"xds": map[string]any{"proxylessClients": true,
				"tls": map[string]any{"certManager": map[string]any{"enabled": true, "issuerRef": map[string]any{"name": "mesh-ca"}}}},
		}, features{rebalance: true, dr: true}},
		{"watched namespaces, call graph, plaintext xds, everything on", map[string]any{
			"watch":            map[string]any{"namespaces": []any{"shop", "web"}},
			"prometheus":       map[string]any{"url": ""},
			"callGraph":        map[string]any{"calls": []any{map[string]any{"from": "web.shop", "to": "api.shop"}}, "ingress": []any{map[string]any{"service": "web.shop", "rps": 100}}},
			"defaultLatencyMs": 10,
			"xds":              map[string]any{"tls": map[string]any{"enabled": false}},
			"rebalancer":       map[string]any{"mode": "act"},
			"istio":            map[string]any{"mode": "destinationrule"},
			"scrape":           map[string]any{"operator": true},
			"antiAffinity":     "preferred",
		}, features{rebalance: true, act: true, dr: true, namespaced: true}},
	}
}

// Every rendering of the chart — the defaults and each switch — is accepted by the real
// kube-apiserver (with Istio's, the Prometheus Operator's and cert-manager's CRDs), grants
// exactly the permission table's rules for its features, and deleting what was rendered
// (helm uninstall) then edgeflow uninstall leaves no object of any kind behind.
func TestChartOnTheAPIServer(t *testing.T) {
	t.Parallel()
	c, cl := startAPIServer(t, kubeapi.Options{})
	// eight renderings, each listed kind by kind: minutes under -race on a busy machine
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	installAllCRDs(ctx, t, cl)
	createNamespaces(ctx, t, c.Client, namespace, "istio-system", "shop", "web")
	edgeflow := testkit.Binary(t)
	before := cl.snapshot(ctx, t)
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			objs := render(t, v.values)
			if got, want := granted(t, objs), expected(v.f); !reflect.DeepEqual(got, want) {
				t.Errorf("RBAC: %s", cmp.Diff(want, got))
			}
			for _, o := range objs {
				if o.GetKind() == "Secret" {
					t.Errorf("the chart renders a Secret (%s): certificates come from cert-manager or the operator", o.GetName())
				}
			}
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.GetKind()]++
			}
			if err := cl.create(ctx, objs); err != nil {
				t.Fatalf("the API server refused the chart: %v", err)
			}
			t.Logf("%d objects accepted: %v", len(objs), kinds)
			// The listing of every kind sees them (so that it would see one left behind).
			if n := len(leftovers(before, cl.snapshot(ctx, t))); n < len(objs) {
				t.Fatalf("the listing of every kind finds %d new objects, want at least the %d created", n, len(objs))
			}
			if err := cl.remove(ctx, objs); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(edgeflow, "uninstall", "--kubeconfig", c.Kubeconfig).CombinedOutput()
			if err != nil {
				t.Fatalf("edgeflow uninstall: %v\n%s", err, out)
			}
			cl.waitNoLeftovers(ctx, t, before, 30*time.Second, nil)
		})
	}
}

// The table's rebalancer rows are the acting rebalancer's own list (rebalancer.PolicyRules,
// which e2e/rebalance runs with, where the rebalancer creates its state ConfigMap and Lease),
// less the reads every mode has and less the two creates the chart spares it by creating those
// objects itself.
func TestRebalancerRulesAreTheChartsRules(t *testing.T) {
	t.Parallel()
	acting, reading := unscoped(expected(features{rebalance: true, act: true})), unscoped(expected(features{}))
	code := flatten(rebalancer.PolicyRules())
	chartCreates := []string{grant("", "configmaps", "create"), grant("coordination.k8s.io", "leases", "create")}
	// Every rule the rebalancer's list holds is granted when it acts (but the creates the
	// chart makes unneeded), and every grant of the acting chart beyond the read-only one is in
	// its list.
	for _, g := range code {
		if !contains(acting, g) && !contains(chartCreates, g) {
			t.Errorf("rebalancer.PolicyRules grants %s; the chart with rebalancer.mode=act does not", g)
		}
	}
	for _, g := range chartCreates {
		if contains(acting, g) {
			t.Errorf("the chart with rebalancer.mode=act grants %s, though it creates the object itself", g)
		}
	}
	for _, g := range acting {
		if !contains(reading, g) && !contains(code, g) {
			t.Errorf("the chart with rebalancer.mode=act grants %s; rebalancer.PolicyRules does not", g)
		}
	}
	t.Logf("permission table:\n%s", permissionTable())
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// The rendered webhook registration is rebalancer.MutatingWebhookConfiguration's, with the
// webhook Service as its client.
func TestWebhookRegistrationIsTheRebalancers(t *testing.T) {
	t.Parallel()
	objs := render(t, map[string]any{"rebalancer": map[string]any{"mode": "act"}})
	var got admissionregistrationv1.MutatingWebhookConfiguration
	convert(t, find(t, objs, "MutatingWebhookConfiguration", rebalancer.WebhookName), &got)
	path, port := rebalancer.WebhookPath, int32(443)
	want := rebalancer.MutatingWebhookConfiguration(admissionregistrationv1.WebhookClientConfig{
		Service: &admissionregistrationv1.ServiceReference{Name: release + "-webhook", Namespace: namespace, Path: &path, Port: &port}})
	if diff := cmp.Diff(want.Webhooks, got.Webhooks); diff != "" {
		t.Errorf("webhooks differ from rebalancer.MutatingWebhookConfiguration (-want +got):\n%s", diff)
	}
	for k, v := range want.Labels {
		if got.Labels[k] != v {
			t.Errorf("label %s=%q, want %q (edgeflow uninstall removes only a registration labelled so)", k, got.Labels[k], v)
		}
	}
	if got.Annotations["cert-manager.io/inject-ca-from"] != namespace+"/"+release+"-webhook" {
		t.Errorf("cert-manager CA injection annotation %q", got.Annotations["cert-manager.io/inject-ca-from"])
	}
}

// The plain scrape configuration's probe job is the one the live tests run
// (e2e/testbed.ScrapeConfig) with its static targets discovered from edgeflow instead: same
// job, module, labels and relabelling, and edgeflow's answer (probesd) for the testbed's nodes
// is the testbed's static_configs exactly, so its series carry exactly the labels edgeflow's
// latency queries read. The ScrapeConfig object says the same; Prometheus' own promtool
// accepts the probe job.
func TestScrapeConfigIsTheTestbeds(t *testing.T) {
	t.Parallel()
	objs := render(t, map[string]any{"scrape": map[string]any{"operator": true}})
	cm := find(t, objs, "ConfigMap", release+"-scrape-config")
	data, _, _ := unstructuredString(cm.Object, "data", "scrape_configs.yml")
	var chart struct {
		ScrapeConfigs []map[string]any `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal([]byte(data), &chart); err != nil {
		t.Fatal(err)
	}
	ips := map[string]string{"edge-1": "10.0.0.1", "edge-2": "10.0.0.2", "edge-3": "10.0.0.3"}
	var bed struct {
		ScrapeConfigs []map[string]any `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal([]byte(testbed.ScrapeConfig([]string{"edge-1", "edge-2", "edge-3"}, ips, 15*time.Second)), &bed); err != nil {
		t.Fatal(err)
	}
	got, want := maps.Clone(chart.ScrapeConfigs[0]), maps.Clone(bed.ScrapeConfigs[0])
	if got["scrape_interval"] != "15s" {
		t.Errorf("probe job scrape_interval %v, want 15s", got["scrape_interval"])
	}
	sdURL := fmt.Sprintf("http://%s-metrics.%s.svc.cluster.local:9090%s", release, namespace, probesd.Path)
	wantSD := []any{map[string]any{"url": sdURL, "refresh_interval": "15s"}}
	if diff := cmp.Diff(wantSD, got["http_sd_configs"]); diff != "" {
		t.Errorf("the probe job's discovery (-want +got):\n%s", diff)
	}
	delete(got, "scrape_interval") // the testbed sets it globally
	delete(got, "http_sd_configs")
	delete(want, "static_configs")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the chart's probe job differs from the testbed's (-testbed +chart):\n%s", diff)
	}
	// edgeflow's answer for the testbed's nodes is the testbed's static targets.
	var nodes []*corev1.Node
	for n, ip := range ips {
		nodes = append(nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}})
	}
	answer, err := json.Marshal(probesd.TargetGroups(nodes, probesd.Config{Port: 9115}))
	if err != nil {
		t.Fatal(err)
	}
	var groups []any
	if err := json.Unmarshal(answer, &groups); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(bed.ScrapeConfigs[0]["static_configs"], groups); diff != "" {
		t.Errorf("edgeflow's answer differs from the testbed's static_configs (-testbed +edgeflow):\n%s", diff)
	}
	sc := find(t, objs, "ScrapeConfig", release+"-icmp")
	spec, _ := sc.Object["spec"].(map[string]any)
	if spec["jobName"] != testbed.ProbeJob || spec["metricsPath"] != "/probe" {
		t.Errorf("ScrapeConfig job %v path %v", spec["jobName"], spec["metricsPath"])
	}
	if diff := cmp.Diff([]any{map[string]any{"url": sdURL, "refreshInterval": "15s"}}, spec["httpSDConfigs"]); diff != "" {
		t.Errorf("ScrapeConfig httpSDConfigs (-want +got):\n%s", diff)
	}
	if spec["staticConfigs"] != nil {
		t.Errorf("ScrapeConfig has staticConfigs %v", spec["staticConfigs"])
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found (Debian's prometheus package)")
		}
		t.Skip("skipped: promtool not found (apt-get install prometheus)")
	}
	// Debian's Prometheus is built without Kubernetes service discovery, so its promtool
	// checks the probe job alone (edgeflow's own job discovers pods).
	probeOnly, err := yaml.Marshal(map[string]any{"scrape_configs": []any{chart.ScrapeConfigs[0]}})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(f, probeOnly, 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(promtool, "check", "config", "--syntax-only", f)
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err != nil {
		t.Fatalf("promtool check config: %v\n%s%s", err, out, stderr.String())
	}
}

func unstructuredString(obj map[string]any, fields ...string) (string, bool, error) {
	cur := any(obj)
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[f]
	}
	s, ok := cur.(string)
	return s, ok, nil
}

// install/manifests/edgeflow.yaml is the chart rendered with its defaults, without the Helm
// hooks (make manifests): kubectl apply would run a pre-delete Job at once.
func TestManifestsUpToDate(t *testing.T) {
	t.Parallel()
	want, err := renderRaw(t, nil, "--no-hooks")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(testkit.RepoRoot(), "install", "manifests", "edgeflow.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("install/manifests/edgeflow.yaml is stale: run make manifests\n%s", cmp.Diff(strings.Split(string(want), "\n"), strings.Split(string(got), "\n")))
	}
}

// Bad values fail the render with an error naming the value: values.schema.json refuses a
// wrong type, an unknown value of a switch, a malformed duration, port or name, and a
// misspelt key; the templates refuse what depends on several values.
func TestBadValuesNamed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		values map[string]any
		want   string
	}{
		// values.schema.json
		{map[string]any{"istio": map[string]any{"mode": "mesh"}}, `at '/istio/mode': value must be one of 'off', 'destinationrule', 'envoyfilter'`},
		{map[string]any{"rebalancer": map[string]any{"mode": "yes"}}, `at '/rebalancer/mode': value must be one of 'off', 'dry-run', 'act'`},
		{map[string]any{"webhook": map[string]any{"certificate": "edgeflow"}}, `at '/webhook/certificate': value must be one of 'cert-manager', 'secret'`},
		{map[string]any{"latencyProbes": map[string]any{"nodes": []any{map[string]any{"name": "a", "address": "10.0.0.1"}}}}, `at '/latencyProbes': additional properties 'nodes' not allowed`},
		{map[string]any{"latencyProbes": map[string]any{"addressType": "Hostname"}}, `at '/latencyProbes/addressType': value must be one of 'InternalIP', 'ExternalIP'`},
		{map[string]any{"latencyProbes": map[string]any{"granularity": "rack"}}, `at '/latencyProbes/granularity': value must be one of 'node', 'zone'`},
		{map[string]any{"antiAffinity": "soft"}, `at '/antiAffinity': value must be one of 'required', 'preferred'`},
		{map[string]any{"replicas": 3}, `additional properties 'replicas' not allowed`},
		{map[string]any{"xds": map[string]any{"tls": map[string]any{"enable": false}}}, `at '/xds/tls': additional properties 'enable' not allowed`},
		{map[string]any{"replicaCount": 0}, `at '/replicaCount': minimum: got 0, want 1`},
		{map[string]any{"xds": map[string]any{"tls": map[string]any{"enabled": "yes"}}}, `at '/xds/tls/enabled': value must be one of 'auto', true, false`},
		{map[string]any{"rebalancer": map[string]any{"period": 600}}, `at '/rebalancer/period': got number, want string`},
		{map[string]any{"rebalancer": map[string]any{"period": "10 minutes"}}, `at '/rebalancer/period': '10 minutes' does not match pattern`},
		{map[string]any{"xds": map[string]any{"port": 70000}}, `at '/xds/port': maximum: got 70,000, want 65,535`},
		{map[string]any{"policy": "fastest"}, `at '/policy': value must be one of 'round-robin', 'localization', 'opttraffic', 'lata', 'lata-q', 'closed-loop'`},
		{map[string]any{"logLevel": "verbose"}, `at '/logLevel': value must be one of 'debug', 'info', 'warn', 'error'`},
		// the templates
		{map[string]any{"istio": map[string]any{"mode": "off", "labelNodes": true}}, "istio.labelNodes needs istio.mode=destinationrule"},
		{map[string]any{"watch": map[string]any{"namespaces": []any{}}}, "istio.mode=destinationrule needs watch.namespaces"},
		{map[string]any{"watch": map[string]any{"namespaces": []any{}}, "istio": map[string]any{"mode": "envoyfilter"}}, "istio.mode=envoyfilter needs watch.namespaces"},
		{map[string]any{"watch": map[string]any{"namespaces": []any{"*", "shop"}}}, `"*" is every namespace, so it goes alone`},
		{map[string]any{"istio": map[string]any{"mode": "destinationrule", "leaseName": "edgeflow-rebalancer"}}, "istio.leaseName must differ from rebalancer.leaseName"},
		{map[string]any{"rebalancer": map[string]any{"mode": "act"}, "webhook": map[string]any{"certificate": "secret"}}, "webhook.caBundle"},
		{map[string]any{"prometheus": map[string]any{"url": ""}}, "callGraph"},
	} {
		_, err := renderRaw(t, tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %v: error %v, want one naming %q", tc.values, err, tc.want)
		}
	}
}

// xDS TLS is required only where xDS has a client: by default (destinationrule mode, no
// proxyless clients) edgeflow serves xDS on loopback only, with no Secret mounted and no
// Service; the sidecars of envoyfilter mode or declared proxyless clients get it over TLS
// from the Secret; xds.tls.enabled true or false forces either.
func TestXDSTLSWhereItHasClients(t *testing.T) {
	t.Parallel()
	type xds struct {
		address string // --xds-address's host
		tls     bool   // --xds-tls-cert and the Secret mounted
		flags   []string
		service bool
	}
	plain := xds{address: "127.0.0.1"}
	mtls := xds{address: "0.0.0.0", tls: true, flags: []string{"--trust-domain=cluster.local", "--xds-tls-cert=/etc/edgeflow/xds-tls/tls.crt", "--xds-tls-client-ca=/etc/edgeflow/xds-tls/ca.crt", "--xds-tls-key=/etc/edgeflow/xds-tls/tls.key"}, service: true}
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   xds
	}{
		{"defaults (destinationrule)", nil, plain},
		{"istio off", map[string]any{"istio": map[string]any{"mode": "off"}}, plain},
		{"destinationrule, tls false", map[string]any{"xds": map[string]any{"tls": map[string]any{"enabled": false}}}, plain},
		{"envoyfilter", map[string]any{"istio": map[string]any{"mode": "envoyfilter"}}, mtls},
		{"proxyless clients", map[string]any{"xds": map[string]any{"proxylessClients": true}}, mtls},
		{"tls true", map[string]any{"istio": map[string]any{"mode": "off"}, "xds": map[string]any{"tls": map[string]any{"enabled": true}}}, mtls},
		{"proxyless clients, tls false", map[string]any{"xds": map[string]any{"proxylessClients": true, "tls": map[string]any{"enabled": false}}},
			xds{address: "0.0.0.0", flags: []string{"--insecure-xds"}, service: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.values)
			var d appsv1.Deployment
			convert(t, find(t, objs, "Deployment", release), &d)
			var got xds
			for _, a := range d.Spec.Template.Spec.Containers[0].Args {
				switch {
				case strings.HasPrefix(a, "--xds-address="):
					got.address, _, _ = strings.Cut(strings.TrimPrefix(a, "--xds-address="), ":")
				case strings.HasPrefix(a, "--xds-tls-"), a == "--insecure-xds", strings.HasPrefix(a, "--trust-domain="):
					got.flags = append(got.flags, a)
				}
			}
			slices.Sort(got.flags)
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Secret != nil && v.Secret.SecretName == "edgeflow-xds-tls" {
					got.tls = true
				}
			}
			for _, o := range objs {
				if o.GetKind() == "Service" && o.GetName() == release {
					got.service = true
				}
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(xds{})); diff != "" {
				t.Errorf("xDS (-want +got):\n%s", diff)
			}
		})
	}
}

// docs/security.md and the chart's README list the permission table as the test knows it.
func TestPermissionTableInTheREADMEs(t *testing.T) {
	t.Parallel()
	table := permissionTable()
	for _, f := range []string{filepath.Join("docs", "security.md"), filepath.Join("install", "helm", "edgeflow", "README.md")} {
		b, err := os.ReadFile(filepath.Join(testkit.RepoRoot(), f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), table) {
			t.Errorf("%s does not hold the permission table; it is:\n%s", f, table)
		}
	}
}

// The chart reads nothing from the cluster (no Helm lookup): rendered against an API server
// that has Nodes (helm template --dry-run=server) it is the same as without one, so helm
// template and GitOps render what helm install does; the probes' pairs are edgeflow's to serve
// (probesd), at the granularity the chart runs edgeflow with.
func TestProbesNeedNoLookup(t *testing.T) {
	t.Parallel()
	c, _ := startAPIServer(t, kubeapi.Options{})
	ctx := kubeapi.Context(t)
	for i, n := range []string{"edge-1", "edge-2"} {
		if _, err := kubeapi.CreateNode(ctx, c.Client, kubeapi.NodeSpec{Name: n, Address: fmt.Sprintf("10.0.0.%d", i+1)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, values := range []map[string]any{nil, {"latencyProbes": map[string]any{"granularity": "zone"}, "scrape": map[string]any{"operator": true}}} {
		offline, err := renderRaw(t, values)
		if err != nil {
			t.Fatal(err)
		}
		online, err := renderRaw(t, values, "--dry-run=server", "--kubeconfig", c.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(strings.Split(string(offline), "\n"), strings.Split(string(online), "\n")); diff != "" {
			t.Errorf("values %v: the rendering depends on the cluster (-helm template +--dry-run=server):\n%s", values, diff)
		}
		args := strings.Join(deploymentArgs(t, decodeAll(t, offline)), " ")
		for _, want := range []string{"--metrics-address=0.0.0.0:9090", "--probe-exporter-port=9115", "--probe-address-type=InternalIP",
			"--probe-representative-label=edgeflow.io/latency-representative"} {
			if !strings.Contains(args, want) {
				t.Errorf("values %v: edgeflow runs without %s: %s", values, want, args)
			}
		}
		if zone := values != nil; zone != strings.Contains(args, "--latency-granularity=zone") {
			t.Errorf("values %v: --latency-granularity=zone %v: %s", values, !zone, args)
		}
	}
}

// deploymentArgs are the arguments of the edgeflow Deployment's container.
func deploymentArgs(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	var d appsv1.Deployment
	convert(t, find(t, objs, "Deployment", release), &d)
	return d.Spec.Template.Spec.Containers[0].Args
}

// The real authorizer allows the chart's ServiceAccount exactly what the permission table
// grants for each rendering's switches — names (resourceNames) and namespaces (Roles) included —
// with only the chart's RBAC objects installed (accessReviews: every resource of the table and
// Secrets, every verb, five namespaces, the named names and another).
func TestAccessReviewsOfTheChart(t *testing.T) {
	t.Parallel()
	c, cl := startAPIServer(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	createNamespaces(ctx, t, c.Client, namespace, "istio-system", "shop", "web")
	caPEM, _ := testkit.SelfSigned(t, "webhook-ca")
	secret := map[string]any{"certificate": "secret", "caBundle": base64.StdEncoding.EncodeToString(caPEM)}
	for _, v := range []variant{
		{"defaults", nil, features{rebalance: true, dr: true}},
		{"rebalancer acting, node labels", map[string]any{"rebalancer": map[string]any{"mode": "act"}, "webhook": secret,
			"istio": map[string]any{"mode": "destinationrule", "labelNodes": true}}, features{rebalance: true, act: true, dr: true, labelNodes: true}},
		{"envoyfilter", map[string]any{"istio": map[string]any{"mode": "envoyfilter"}}, features{rebalance: true, ef: true}},
		{"watched namespaces, rebalancer acting, destinationrule", map[string]any{"watch": map[string]any{"namespaces": []any{"shop", "web"}},
			"rebalancer": map[string]any{"mode": "act"}, "webhook": secret}, features{rebalance: true, act: true, dr: true, namespaced: true}},
		{"watched namespace, rebalancer off, envoyfilter", map[string]any{"watch": map[string]any{"namespaces": []any{"shop"}},
			"rebalancer": map[string]any{"mode": "off"}, "istio": map[string]any{"mode": "envoyfilter"}}, features{ef: true, namespaced: true}},
	} {
		t.Run(v.name, func(t *testing.T) {
			var rbac []*unstructured.Unstructured
			for _, o := range withoutHooks(render(t, v.values)) {
				switch o.GetKind() {
				case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
					rbac = append(rbac, o)
				}
			}
			if err := cl.create(ctx, rbac); err != nil {
				t.Fatalf("the API server refused the chart: %v", err)
			}
			defer func() {
				if err := cl.remove(ctx, rbac); err != nil {
					t.Fatal(err)
				}
			}()
			var watched []string
			if w, ok := v.values["watch"].(map[string]any); ok {
				for _, ns := range w["namespaces"].([]any) {
					watched = append(watched, ns.(string))
				}
			}
			accessReviews(t, ctx, c.Client, expected(v.f), watched)
		})
	}
}
