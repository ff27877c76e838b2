package install

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

// The proxyless gRPC example's bootstrap, as Kubernetes expands it for a pod, is JSON naming
// the pod as edgeflow keys it (POD.NAMESPACE) and edgeflow's xDS Service, with grpc-go's "tls"
// channel credentials and their three files. (grpc-go building its xDS client from it was
// seen to work by hand; its certificate watcher outlives the channel, which this package's
// goroutine check would flag, so the test stops at the document.)
func TestProxylessExampleBootstrap(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(testkit.RepoRoot(), "install", "helm", "edgeflow", "examples", "proxyless-grpc.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	convert(t, decodeAll(t, raw)[0], &dep)
	var value string
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "GRPC_XDS_BOOTSTRAP_CONFIG" {
			value = e.Value
		}
	}
	if value == "" {
		t.Fatal("the example sets no GRPC_XDS_BOOTSTRAP_CONFIG")
	}
	// Kubernetes' $(VAR) expansion of the earlier env vars (the downward API's values).
	bootstrap := strings.NewReplacer("$(POD_NAME)", "web-7d4b9-x2x", "$(POD_NAMESPACE)", "shop").Replace(value)
	var parsed struct {
		Servers []struct {
			URI   string `json:"server_uri"`
			Creds []struct {
				Type   string            `json:"type"`
				Config map[string]string `json:"config"`
			} `json:"channel_creds"`
		} `json:"xds_servers"`
		Node struct {
			ID string `json:"id"`
		} `json:"node"`
	}
	if err := json.Unmarshal([]byte(bootstrap), &parsed); err != nil {
		t.Fatalf("the bootstrap is not JSON: %v\n%s", err, bootstrap)
	}
	if parsed.Node.ID != "web-7d4b9-x2x.shop" {
		t.Errorf("node id %q, want POD.NAMESPACE", parsed.Node.ID)
	}
	if len(parsed.Servers) != 1 || parsed.Servers[0].URI != release+"."+namespace+".svc:18000" {
		t.Fatalf("xds_servers %+v, want edgeflow's xDS Service", parsed.Servers)
	}
	c := parsed.Servers[0].Creds
	if len(c) != 1 || c[0].Type != "tls" || c[0].Config["ca_certificate_file"] == "" || c[0].Config["certificate_file"] == "" || c[0].Config["private_key_file"] == "" {
		t.Errorf("channel_creds %+v, want tls with a CA, a certificate and a key file", c)
	}
}
