package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/edgeflow/edgeflow/xds"
)

// The xDS types a proxyless client resolves, in order.
const (
	lds = iota
	rds
	cds
	eds
	numTypes
)

var typeURLs = [numTypes]string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}

func typeIndex(url string) int { return slices.Index(typeURLs[:], url) }

// fleet is one server's raw ADS clients: one SOTW ADS stream per caller pod (node id = the pod
// name, sent in the stream's first request as grpc-go does), which follows the Listener
// calleeSvc → its RouteConfiguration → its Clusters → their ClusterLoadAssignments like a
// proxyless gRPC client, and ACKs every response (version_info + response_nonce).
//
// A round sets each stream's awaited EDS version (expect); the round is done when every
// awaited stream has received that version and handed its ACK to gRPC. Each stream's arrival
// time is kept for percentiles.
type fleet struct {
	side      string
	verify    bool // unmarshal every ClusterLoadAssignment and check it has calleePods endpoints
	delta     bool // delta ADS streams (startDelta) instead of SOTW
	conns     []*grpc.ClientConn
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closing   atomic.Bool
	targets   []atomic.Pointer[string]
	arrivals  []atomic.Int64 // unix ns at which the awaited version's ACK was sent
	current   []atomic.Pointer[string]
	left      atomic.Int64
	done      atomic.Pointer[chan struct{}]
	responses [numTypes]atomic.Int64

	errOnce sync.Once
	err     error
	failed  chan struct{} // closed on the first stream failure (err)
}

func newFleet(side string, n int, verify, delta bool) *fleet {
	return &fleet{side: side, verify: verify, delta: delta, targets: make([]atomic.Pointer[string], n), arrivals: make([]atomic.Int64, n),
		current: make([]atomic.Pointer[string], n), failed: make(chan struct{}), cancel: func() {}}
}

func (f *fleet) fail(err error) {
	if f.closing.Load() {
		return
	}
	f.errOnce.Do(func() {
		f.err = fmt.Errorf("pushbench: %s client: %w", f.side, err)
		close(f.failed)
	})
}

// expect starts a round: stream i must receive EDS version want[i] ("" = not awaited). It
// returns the channel closed when all awaited streams have it, and how many are awaited.
func (f *fleet) expect(want []string) (<-chan struct{}, int) {
	ch := make(chan struct{})
	n := 0
	for _, v := range want {
		if v != "" {
			n++
		}
	}
	f.done.Store(&ch)
	f.left.Store(int64(n) + 1) // +1 until every target is set
	for i, v := range want {
		f.arrivals[i].Store(0)
		if v != "" {
			f.targets[i].Store(&v)
		} else {
			f.targets[i].Store(nil)
		}
	}
	if f.left.Add(-1) == 0 {
		close(ch)
	}
	return ch, n
}

func (f *fleet) arrived(i int, version string) {
	t := f.targets[i].Load()
	if t == nil || *t != version || !f.targets[i].CompareAndSwap(t, nil) {
		return
	}
	f.arrivals[i].Store(time.Now().UnixNano())
	if f.left.Add(-1) == 0 {
		close(*f.done.Load())
	}
}

// missing describes up to three awaited streams that have not arrived, with what they hold.
func (f *fleet) missing() string {
	var out []string
	count := 0
	for i := range f.targets {
		if t := f.targets[i].Load(); t != nil {
			count++
			if len(out) < 3 {
				have := "nothing"
				if c := f.current[i].Load(); c != nil {
					have = *c
				}
				out = append(out, fmt.Sprintf("%s holds %s, awaits %s", callerPod(i), have, *t))
			}
		}
	}
	return fmt.Sprintf("%d streams not converged (%v)", count, out)
}

// connect opens one stream per id to addr, perConn streams per gRPC connection, with a few
// connections being set up at once.
func (f *fleet) connect(ctx context.Context, addr string, ids []string, perConn int) error {
	sctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	for i := 0; i < len(ids); i += perConn {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		f.conns = append(f.conns, conn)
	}
	const parallel = 16
	work := make(chan int)
	errs := make(chan error, parallel)
	var starters sync.WaitGroup
	for w := 0; w < parallel; w++ {
		starters.Add(1)
		go func() {
			defer starters.Done()
			for i := range work {
				start := f.start
				if f.delta {
					start = f.startDelta
				}
				if err := start(sctx, f.conns[i/perConn], i, ids[i]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := range ids {
		select {
		case work <- i:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(work)
	starters.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

// start opens stream i and subscribes to the Listener.
func (f *fleet) start(ctx context.Context, conn *grpc.ClientConn, i int, id string) error {
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("pushbench: %s stream %s: %w", f.side, id, err)
	}
	c := &adsClient{f: f, i: i, node: &core.Node{Id: id}, stream: st}
	c.names[lds] = []string{calleeSvc}
	if err := c.send(lds, "", ""); err != nil {
		return fmt.Errorf("pushbench: %s stream %s: %w", f.side, id, err)
	}
	f.follow("stream "+id, func() error {
		resp, err := st.Recv()
		if err == nil {
			err = c.handle(resp)
		}
		return err
	})
	return nil
}

// follow runs next, which receives and handles one response of the stream named name, on a
// goroutine of the fleet until it fails; a failure fails the fleet.
func (f *fleet) follow(name string, next func() error) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			if err := next(); err != nil {
				f.fail(fmt.Errorf("%s: %w", name, err))
				return
			}
		}
	}()
}

// close ends every stream and connection and waits for the streams' goroutines.
func (f *fleet) close() {
	f.closing.Store(true)
	f.cancel()
	for _, c := range f.conns {
		c.Close()
	}
	f.wg.Wait()
}

// adsClient is one stream's state, used only by its goroutine (after start).
type adsClient struct {
	f        *fleet
	i        int
	node     *core.Node
	stream   discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	sentNode bool
	names    [numTypes][]string // subscribed resource names
	version  [numTypes]string   // last version received
	nonce    [numTypes]string   // last nonce received
}

func (c *adsClient) send(t int, version, nonce string) error {
	req := &discovery.DiscoveryRequest{TypeUrl: typeURLs[t], ResourceNames: c.names[t], VersionInfo: version, ResponseNonce: nonce}
	if !c.sentNode {
		req.Node, c.sentNode = c.node, true
	}
	return c.stream.Send(req)
}

// handle ACKs a response, then subscribes to the next type's names if they changed; an EDS
// response records its arrival. A response a client would NACK fails the benchmark instead.
func (c *adsClient) handle(resp *discovery.DiscoveryResponse) error {
	t := typeIndex(resp.GetTypeUrl())
	if t < 0 {
		return fmt.Errorf("response of unexpected type %s", resp.GetTypeUrl())
	}
	c.f.responses[t].Add(1)
	c.version[t], c.nonce[t] = resp.GetVersionInfo(), resp.GetNonce()
	var next []string
	var err error
	switch t {
	case lds:
		next, err = routeNames(resp.GetResources())
	case rds:
		next, err = clusterNames(resp.GetResources())
	case cds:
		next, err = assignmentNames(resp.GetResources())
	case eds:
		if c.f.verify {
			err = checkAssignments(resp.GetResources(), c.names[eds])
		}
	}
	if err != nil {
		return fmt.Errorf("%s version %s: %w", typeURLs[t], resp.GetVersionInfo(), err)
	}
	if err := c.send(t, resp.GetVersionInfo(), resp.GetNonce()); err != nil {
		return err
	}
	if t == eds {
		v := resp.GetVersionInfo()
		c.f.current[c.i].Store(&v)
		c.f.arrived(c.i, v)
		return nil
	}
	if !slices.Equal(next, c.names[t+1]) {
		c.names[t+1] = next
		return c.send(t+1, c.version[t+1], c.nonce[t+1])
	}
	return nil
}

// routeNames is the RDS name of the Listener calleeSvc (an api_listener, as xds:///callee
// resolves it).
func routeNames(res []*anypb.Any) ([]string, error) {
	for _, a := range res {
		var l listener.Listener
		if err := a.UnmarshalTo(&l); err != nil {
			return nil, err
		}
		if l.GetName() != calleeSvc {
			continue
		}
		if names := xds.RouteConfigRefs(&l); len(names) > 0 {
			return names, nil
		}
		return nil, fmt.Errorf("listener %s: no RDS route name", l.GetName())
	}
	return nil, fmt.Errorf("no listener %s", calleeSvc)
}

// clusterNames are the clusters the routes name.
func clusterNames(res []*anypb.Any) ([]string, error) {
	var out []string
	for _, a := range res {
		var rc route.RouteConfiguration
		if err := a.UnmarshalTo(&rc); err != nil {
			return nil, err
		}
		named := map[string]bool{}
		xds.ClusterRefs(&rc, named)
		for name := range named {
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("routes name no cluster")
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// assignmentNames are the EDS names of the clusters.
func assignmentNames(res []*anypb.Any) ([]string, error) {
	var out []string
	for _, a := range res {
		var cl cluster.Cluster
		if err := a.UnmarshalTo(&cl); err != nil {
			return nil, err
		}
		if name := xds.EDSName(&cl); name != "" {
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no cluster")
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// checkAssignments checks that the response holds every subscribed ClusterLoadAssignment,
// each with calleePods endpoints.
func checkAssignments(res []*anypb.Any, names []string) error {
	if len(res) != len(names) {
		return fmt.Errorf("%d assignments for %d names", len(res), len(names))
	}
	for _, a := range res {
		var cla endpoint.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			return err
		}
		if !slices.Contains(names, cla.GetClusterName()) {
			return fmt.Errorf("assignment %s not subscribed", cla.GetClusterName())
		}
		eps := 0
		for _, l := range cla.GetEndpoints() {
			eps += len(l.GetLbEndpoints())
		}
		if eps != calleePods {
			return fmt.Errorf("assignment %s: %d endpoints, want %d", cla.GetClusterName(), eps, calleePods)
		}
	}
	return nil
}
