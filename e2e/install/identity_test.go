package install

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// In envoyfilter mode with xDS TLS the chart has the sidecars require edgeflow's own SPIFFE id
// of its certificate (--istio-xds-server-san): by default spiffe://TRUST_DOMAIN/ns/RELEASE
// NAMESPACE/sa/SERVICE ACCOUNT, the URI SAN the chart's cert-manager Certificate gives it, so
// no other mesh workload passes for edgeflow. "any" is there only when asked for; without TLS
// (nothing to check) and outside envoyfilter mode there is no SAN, as edgeflow would refuse one.
func TestSidecarsRequireEdgeflowsIdentity(t *testing.T) {
	t.Parallel()
	const spiffe = "spiffe://cluster.local/ns/" + namespace + "/sa/edgeflow"
	envoyFilter := map[string]any{"mode": "envoyfilter"}
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   []string
	}{
		{"envoyfilter, its defaults", map[string]any{"istio": envoyFilter}, []string{spiffe}},
		{"envoyfilter, another trust domain and service account", map[string]any{"istio": envoyFilter,
			"xds": map[string]any{"tls": map[string]any{"trustDomain": "edge.example"}}, "serviceAccount": map[string]any{"name": "ef"}},
			[]string{"spiffe://edge.example/ns/" + namespace + "/sa/ef"}},
		{"envoyfilter, SANs given", map[string]any{"istio": map[string]any{"mode": "envoyfilter", "xdsServerSAN": []any{"spiffe://a/ns/b/sa/c", "edgeflow.example"}}},
			[]string{"spiffe://a/ns/b/sa/c", "edgeflow.example"}},
		{"envoyfilter, any asked for", map[string]any{"istio": map[string]any{"mode": "envoyfilter", "xdsServerSAN": []any{"any"}}}, []string{"any"}},
		{"envoyfilter, plaintext xDS", map[string]any{"istio": envoyFilter, "xds": map[string]any{"tls": map[string]any{"enabled": false}}}, nil},
		{"the chart's defaults (destinationrule)", nil, nil},
		{"destinationrule, xDS TLS for proxyless clients", map[string]any{"xds": map[string]any{"proxylessClients": true}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.values)
			var got []string
			for _, a := range deploymentArgs(t, objs) {
				if v, ok := strings.CutPrefix(a, "--istio-xds-server-san="); ok {
					got = append(got, v)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("--istio-xds-server-san (-want +got):\n%s", diff)
			}
		})
	}

	// The default SAN is the one the chart's Certificate puts in edgeflow's certificate.
	objs := render(t, map[string]any{"istio": envoyFilter,
		"xds": map[string]any{"tls": map[string]any{"certManager": map[string]any{"enabled": true, "issuerRef": map[string]any{"name": "mesh-ca"}}}}})
	cert := find(t, objs, "Certificate", release+"-xds")
	uris, _ := cert.Object["spec"].(map[string]any)["uris"].([]any)
	if !slices.Equal(uris, []any{spiffe}) || !slices.Contains(deploymentArgs(t, objs), "--istio-xds-server-san="+spiffe) {
		t.Errorf("the Certificate's URI SANs %v, the sidecars require %s", uris, spiffe)
	}
}
