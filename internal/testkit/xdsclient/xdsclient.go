// Package xdsclient dials through grpc-go's real xDS client, as a proxyless caller pod does, for
// tests. It is apart from testkit because importing grpc-go's xds package registers its
// resolver and balancers in the test process (and links them into the test binary).
package xdsclient

import (
	"encoding/json"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpcxds "google.golang.org/grpc/xds"
)

// Node is the node a client's bootstrap names: ID is the caller pod's node id (edgeflow's
// POD or POD.NAMESPACE); Cluster and Zone (its locality) are left out when empty.
type Node struct{ ID, Cluster, Zone string }

// Dial returns a channel to xds:///target resolved by grpc-go's xDS client, with its own
// resolver built from a bootstrap that names the management server at xdsAddr (insecure,
// xds_v3) and node; opts are added to the channel's (a dialer, say). The channel is closed when
// the test ends (closing it earlier is fine).
func Dial(t testing.TB, xdsAddr string, node Node, target string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	n := map[string]any{"id": node.ID}
	if node.Cluster != "" {
		n["cluster"] = node.Cluster
	}
	if node.Zone != "" {
		n["locality"] = map[string]string{"zone": node.Zone}
	}
	bootstrap, err := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{"server_uri": xdsAddr,
			"channel_creds": []any{map[string]any{"type": "insecure"}}, "server_features": []string{"xds_v3"}}},
		"node": n,
	})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := grpcxds.NewXDSResolverWithConfigForTesting(bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///"+target, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(rb)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
