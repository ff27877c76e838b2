package main

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/edgeflow/edgeflow/xds/istio"
)

// TestIstioBootstrap: the printed ConfigMap is exactly the one serve manages, kubectl-appliable
// YAML, followed by the pod template patch as comments.
func TestIstioBootstrap(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, "", "istio", "bootstrap", "--istio-xds-address", "edgeflow.edgeflow.svc.cluster.local:18000",
		"-n", "bookinfo", "--xds-tls", "--istio-xds-server-san", "spiffe://cluster.local/ns/edgeflow/sa/edgeflow")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict([]byte(out), &cm); err != nil {
		t.Fatalf("output is not one ConfigMap: %v\n%s", err, out)
	}
	want, err := istio.BootstrapConfigMap(istio.Config{XDSAddress: "edgeflow.edgeflow.svc.cluster.local:18000", TLS: true,
		TLSServerSANs: []string{"spiffe://cluster.local/ns/edgeflow/sa/edgeflow"}}, "bookinfo")
	if err != nil {
		t.Fatal(err)
	}
	if cm.Kind != "ConfigMap" || cm.Name != want.Name || cm.Namespace != "bookinfo" || cm.Labels[istio.ManagedByLabel] != istio.ManagedByValue ||
		cm.Data[istio.BootstrapOverrideKey] != want.Data[istio.BootstrapOverrideKey] {
		t.Errorf("printed ConfigMap differs from the one serve manages:\n%s", out)
	}
	if !strings.Contains(cm.Data[istio.BootstrapOverrideKey], `"envoy.transport_sockets.tls"`) {
		t.Error("--xds-tls: no TLS transport socket in the bootstrap")
	}
	for _, line := range []string{"#           sidecar.istio.io/bootstrapOverride: edgeflow-bootstrap", `#           edgeflow.io/eds: "true"`} {
		if !strings.Contains(out, line+"\n") {
			t.Errorf("output lacks %q:\n%s", line, out)
		}
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"istio", "bootstrap"}, "istio-xds-address"},
		{[]string{"istio", "bootstrap", "--istio-xds-address", "edgeflow"}, `XDSAddress "edgeflow"`},
		{[]string{"istio", "bootstrap", "--istio-xds-address", "edgeflow:1", "-n", "Bad_NS"}, `--namespace "Bad_NS"`},
		{[]string{"istio", "bootstrap", "--istio-xds-address", "edgeflow:1", "--istio-xds-server-san", "x"}, "without TLS"},
	} {
		code, _, errOut := runCLI(t, "", tt.args...)
		if code != 2 || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %q", tt.args, code, errOut, tt.want)
		}
	}
}
