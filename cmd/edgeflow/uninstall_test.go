package main

import (
	"strings"
	"testing"
)

// uninstall's own flags fail at once, naming the value, before any cluster is reached.
func TestUninstallBadFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--only", "istio,webhook"}, `--only "webhook": want rebalancer, envoyfilter, destinationrule or istio`},
		{[]string{"--stop-deployment", "edgeflow"}, `--stop-deployment "edgeflow": want NAMESPACE/NAME`},
	} {
		args := append([]string{"uninstall", "--kubeconfig", "/nonexistent/kubeconfig"}, tc.args...)
		code, out, errOut := runCLI(t, "", args...)
		if code != exitBadInput || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("edgeflow %s: exit %d, stdout %q, stderr %q; want exit %d naming %q", strings.Join(args, " "), code, out, errOut, exitBadInput, tc.want)
		}
	}
}
