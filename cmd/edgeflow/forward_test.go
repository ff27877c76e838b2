package main

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// The leader's webhook is its pod's IP, from the Lease holder's identity (leader.Identity:
// POD_SUFFIX), in the Lease's namespace, at this replica's webhook port.
func TestLeaderWebhookResolvesThePod(t *testing.T) {
	t.Parallel()
	f := &rebalanceFlags{webhookAddress: "0.0.0.0:8443", leaseNamespace: "edgeflow"}
	podIP := func(ns, name string) (string, error) {
		if ns == "edgeflow" && name == "edgeflow-5d9c7-x2kq1" {
			return "fd00::7", nil
		}
		return "", errors.New("no such pod")
	}
	resolve := f.leaderWebhook(podIP)
	for _, tt := range []struct{ identity, want, err string }{
		{"edgeflow-5d9c7-x2kq1_0f4c2a8e-6b1d-4f7e-9a3c-2d5e8f1b7c90", "[fd00::7]:8443", ""},
		{"edgeflow-gone_0f4c2a8e-6b1d-4f7e-9a3c-2d5e8f1b7c90", "", "no such pod"},
		{"laptop", "", "not POD-NAME_SUFFIX"},
	} {
		got, err := resolve(context.Background(), tt.identity)
		if got != tt.want || (tt.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: %q, %v; want %q, an error with %q", tt.identity, got, err, tt.want, tt.err)
		}
	}
}
