package main

import (
	"slices"
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
		{[]string{"istio", "bootstrap", "--istio-xds-address", "edgeflow:1", "--xds-tls"}, "--xds-tls needs --istio-xds-server-san"},
		{[]string{"istio", "bootstrap", "--istio-xds-address", "edgeflow:1", "--xds-tls", "--istio-xds-server-san", "any,spiffe://cluster.local/ns/edgeflow/sa/edgeflow"}, "goes alone"},
	} {
		code, _, errOut := runCLI(t, "", tt.args...)
		if code != 2 || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %q", tt.args, code, errOut, tt.want)
		}
	}
}

// TestIstioBootstrapAnyServer: --istio-xds-server-san=any, said explicitly, is the one way to a
// TLS bootstrap whose sidecars take any certificate the mesh root signed for edgeflow's.
func TestIstioBootstrapAnyServer(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, "", "istio", "bootstrap", "--istio-xds-address", "edgeflow.edgeflow.svc.cluster.local:18000",
		"-n", "bookinfo", "--xds-tls", "--istio-xds-server-san", "any")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict([]byte(out), &cm); err != nil {
		t.Fatalf("output is not one ConfigMap: %v\n%s", err, out)
	}
	want, err := istio.BootstrapConfigMap(istio.Config{XDSAddress: "edgeflow.edgeflow.svc.cluster.local:18000", TLS: true, TLSAnyServer: true}, "bookinfo")
	if err != nil {
		t.Fatal(err)
	}
	got := cm.Data[istio.BootstrapOverrideKey]
	if got != want.Data[istio.BootstrapOverrideKey] {
		t.Errorf("bootstrap %s, want %s", got, want.Data[istio.BootstrapOverrideKey])
	}
	if !strings.Contains(got, `"envoy.transport_sockets.tls"`) || strings.Contains(got, "match_typed_subject_alt_names") {
		t.Errorf("--istio-xds-server-san=any: want TLS without a SAN match:\n%s", got)
	}
}

// TestXDSServerSANRequired: serve in the per-pod mode with a TLS xDS port refuses to run
// without --istio-xds-server-san, naming the flag and its "any"; with a SAN or an explicit
// "any" it goes on, and the sidecars' configuration says which.
func TestXDSServerSANRequired(t *testing.T) {
	t.Parallel()
	const spiffe = "spiffe://cluster.local/ns/edgeflow/sa/edgeflow"
	for _, tc := range []struct {
		name     string
		cert     string
		sans     []string
		want     string // in the error; "" accepted
		wantSANs []string
		wantAny  bool
	}{
		{"TLS without a SAN", "tls.crt", nil, "--istio-mode=envoyfilter with --xds-tls-cert needs --istio-xds-server-san: ", nil, false},
		{"TLS with edgeflow's SPIFFE id", "tls.crt", []string{spiffe}, "", []string{spiffe}, false},
		{"TLS with two SANs", "tls.crt", []string{spiffe, "edgeflow.edgeflow.svc"}, "", []string{spiffe, "edgeflow.edgeflow.svc"}, false},
		{"TLS, any said explicitly", "tls.crt", []string{"any"}, "", nil, true},
		{"any among SANs", "tls.crt", []string{"any", spiffe}, "goes alone", nil, false},
		{"an empty SAN", "tls.crt", []string{""}, "an empty SAN", nil, false},
		{"plaintext", "", nil, "", nil, false},
		{"plaintext with a SAN", "", []string{spiffe}, "--istio-xds-server-san without TLS", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &serveFlags{}
			f.namespaces = []string{"shop"}
			f.istio = istioFlags{mode: istioModeEnvoyFilter, xdsAddress: "edgeflow.edgeflow.svc.cluster.local:18000", xdsServerSANs: tc.sans}
			f.tls.CertFile = tc.cert
			_, err := f.checkIstio()
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("checkIstio() = %v, want an error naming %q", err, tc.want)
				}
				if tc.sans == nil && !strings.Contains(err.Error(), "--istio-xds-server-san=any") {
					t.Errorf("the refusal does not say how to accept any certificate: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("checkIstio() = %v, want nil", err)
			}
			f.istio.xdsTLS = tc.cert != "" // as buildIstio sets it
			cfg := f.istio.config()
			if err := cfg.Validate(); err != nil {
				t.Fatalf("the reconciler's config: %v", err)
			}
			if !slices.Equal(cfg.TLSServerSANs, tc.wantSANs) || cfg.TLSAnyServer != tc.wantAny {
				t.Errorf("config SANs %q any %v, want %q any %v", cfg.TLSServerSANs, cfg.TLSAnyServer, tc.wantSANs, tc.wantAny)
			}
		})
	}
	// Another mode: the flag has nothing to configure.
	f := &serveFlags{}
	f.istio = istioFlags{mode: istioModeDestinationRule, xdsServerSANs: []string{spiffe}}
	if _, err := f.checkIstio(); err == nil || !strings.Contains(err.Error(), "--istio-xds-server-san is for --istio-mode=envoyfilter") {
		t.Errorf("--istio-mode=destinationrule with a SAN: %v", err)
	}
}
