package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
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
		{[]string{"--dry-run=server"}, `--dry-run "server": edgeflow has no server-side dry run: client (the bare --dry-run) changes nothing; want none or client`},
		{[]string{"--dry-run=maybe"}, `--dry-run "maybe": want none or client`},
	} {
		args := append([]string{"uninstall", "--kubeconfig", "/nonexistent/kubeconfig"}, tc.args...)
		code, out, errOut := runCLI(t, "", args...)
		if code != exitBadInput || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("edgeflow %s: exit %d, stdout %q, stderr %q; want exit %d naming %q", strings.Join(args, " "), code, out, errOut, exitBadInput, tc.want)
		}
	}
}

// --dry-run takes kubectl's values: none acts, client (also the bare flag) changes nothing;
// true and false, its values as a bool, still work.
func TestDryRunValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cmd  func() *cobra.Command
		name string
		args []string
		want string
	}{
		{newUninstallCommand, "dry-run", nil, "none"},
		{newUninstallCommand, "dry-run", []string{"--dry-run"}, "client"},
		{newUninstallCommand, "dry-run", []string{"--dry-run=client"}, "client"},
		{newUninstallCommand, "dry-run", []string{"--dry-run=true"}, "client"},
		{newUninstallCommand, "dry-run", []string{"--dry-run", "--dry-run=none"}, "none"},
		{newRebalanceCommand, "dry-run", nil, "client"},
		{newRebalanceCommand, "dry-run", []string{"--dry-run=none"}, "none"},
		{newRebalanceCommand, "dry-run", []string{"--dry-run=false"}, "none"},
		{newServeCommand, "rebalance-dry-run", []string{"--rebalance-dry-run=None"}, "none"},
	} {
		c := tc.cmd()
		if err := c.ParseFlags(tc.args); err != nil {
			t.Errorf("%s %v: %v", c.Name(), tc.args, err)
			continue
		}
		if got := c.Flags().Lookup(tc.name).Value.String(); got != tc.want {
			t.Errorf("%s %v: --%s is %s, want %s", c.Name(), tc.args, tc.name, got, tc.want)
		}
	}
	code, _, errOut := runCLI(t, "", "rebalance", "--kubeconfig", "/nonexistent/kubeconfig", "--dry-run=server")
	if code != exitBadInput || strings.Contains(errOut, "strconv") || !strings.Contains(errOut, "no server-side dry run") {
		t.Errorf("rebalance --dry-run=server: exit %d, stderr %q; want 2 saying there is no server-side dry run", code, errOut)
	}
}
