package main

import (
	"context"
	"fmt"
	"slices"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
)

// startDelta opens stream i as a delta ADS stream (DeltaAggregatedResources) and subscribes to
// the Listener. It follows the same resources as an adsClient, by name: it subscribes to the
// names a response's resources name and unsubscribes from those they no longer do, ACKs every
// response by its nonce, and takes a response's system_version_info (the version of the set
// it was computed from, which both servers' snapshot caches send) as the version it holds.
func (f *fleet) startDelta(ctx context.Context, conn *grpc.ClientConn, i int, id string) error {
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("pushbench: %s delta stream %s: %w", f.side, id, err)
	}
	c := &deltaClient{f: f, i: i, stream: st}
	c.names[lds] = []string{calleeSvc}
	if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: id}, TypeUrl: typeURLs[lds],
		ResourceNamesSubscribe: c.names[lds]}); err != nil {
		return fmt.Errorf("pushbench: %s delta stream %s: %w", f.side, id, err)
	}
	f.follow("delta stream "+id, func() error {
		resp, err := st.Recv()
		if err == nil {
			err = c.handle(resp)
		}
		return err
	})
	return nil
}

// deltaClient is one delta stream's state, used only by its goroutine (after startDelta).
type deltaClient struct {
	f      *fleet
	i      int
	stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	names  [numTypes][]string // subscribed resource names, sorted
}

// handle ACKs a delta response, then changes the next type's subscription when the resources
// name others; an EDS response records its arrival. A response a client would NACK fails the
// benchmark instead.
func (c *deltaClient) handle(resp *discovery.DeltaDiscoveryResponse) error {
	t := typeIndex(resp.GetTypeUrl())
	if t < 0 {
		return fmt.Errorf("delta response of unexpected type %s", resp.GetTypeUrl())
	}
	c.f.responses[t].Add(1)
	res := make([]*anypb.Any, 0, len(resp.GetResources()))
	for _, r := range resp.GetResources() {
		res = append(res, r.GetResource())
	}
	var next []string
	var err error
	if len(res) > 0 { // only removals: the next type's names stay (one resource per type here)
		switch t {
		case lds:
			next, err = routeNames(res)
		case rds:
			next, err = clusterNames(res)
		case cds:
			next, err = assignmentNames(res)
		case eds:
			if c.f.verify {
				err = checkAssignments(res, c.names[eds])
			}
		}
	}
	if err != nil {
		return fmt.Errorf("%s system version %s: %w", typeURLs[t], resp.GetSystemVersionInfo(), err)
	}
	if err := c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: typeURLs[t], ResponseNonce: resp.GetNonce()}); err != nil {
		return err
	}
	if t == eds {
		v := resp.GetSystemVersionInfo()
		c.f.current[c.i].Store(&v)
		c.f.arrived(c.i, v)
		return nil
	}
	if next == nil || slices.Equal(next, c.names[t+1]) {
		return nil
	}
	var sub, unsub []string
	for _, n := range next {
		if !slices.Contains(c.names[t+1], n) {
			sub = append(sub, n)
		}
	}
	for _, n := range c.names[t+1] {
		if !slices.Contains(next, n) {
			unsub = append(unsub, n)
		}
	}
	c.names[t+1] = next
	return c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: typeURLs[t+1], ResourceNamesSubscribe: sub, ResourceNamesUnsubscribe: unsub})
}
