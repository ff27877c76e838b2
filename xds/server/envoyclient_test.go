package server

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// envoyClient is a raw ADS stream that subscribes as an Envoy with an ADS bootstrap does:
// node with user_agent_name "envoy"; CDS wildcard first, then EDS for every EDS cluster it
// accepted; LDS wildcard once CDS has answered, then RDS for every route configuration its
// listeners' HTTP connection managers name. Every response is checked with the rules Envoy
// applies (checkListeners, checkRouteConfigs, checkClusters, checkAssignments) and ACKed
// (version_info and response_nonce of the response) or NACKed (version_info of the last
// accepted response, error_detail); a NACKed response changes nothing. Like Envoy, it does not
// reject a route naming a cluster it does not have: that is a state consistentState reports.
type envoyClient struct {
	t      testing.TB
	node   *core.Node
	stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient

	mu        sync.Mutex
	types     [xds.NumSets]envoyType
	responses [xds.NumSets]int // responses received, per type
	nacks     []string         // the reasons of every NACK sent
	err       error            // the stream's end, if it ended
	changed   chan struct{}
}

// envoyType is the client's state of one resource type.
type envoyType struct {
	subscribed bool
	names      []string // nil: wildcard (LDS, CDS)
	version    string   // last accepted
	nonce      string   // of the last response
	res        map[string]proto.Message
}

var setTypes = [xds.NumSets]func() proto.Message{
	func() proto.Message { return &listener.Listener{} },
	func() proto.Message { return &route.RouteConfiguration{} },
	func() proto.Message { return &cluster.Cluster{} },
	func() proto.Message { return &endpoint.ClusterLoadAssignment{} },
}

func dialEnvoy(t testing.TB, addr, nodeID string) *envoyClient {
	t.Helper()
	return dialEnvoyAs(t, addr, &core.Node{Id: nodeID, Cluster: "edgeflow-test", UserAgentName: xds.EnvoyUserAgent})
}

// dialEnvoyAs is dialEnvoy with the given node.
func dialEnvoyAs(t testing.TB, addr string, node *core.Node) *envoyClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &envoyClient{t: t, stream: st, changed: make(chan struct{}, 1), node: node}
	for i := range c.types {
		c.types[i].res = map[string]proto.Message{}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run()
	}()
	t.Cleanup(func() {
		cancel()
		conn.Close()
		<-done
	})
	return c
}

// run subscribes and answers responses until the stream ends; only it sends on the stream.
func (c *envoyClient) run() {
	end := func(err error) {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		c.signal()
	}
	if err := c.subscribe(xds.ClusterSet, nil); err != nil {
		end(err)
		return
	}
	for {
		r, err := c.stream.Recv()
		if err != nil {
			end(err)
			return
		}
		if err := c.handle(r); err != nil {
			end(err)
			return
		}
		c.signal()
	}
}

func (c *envoyClient) signal() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// subscribe (re)sends the subscription of set i with names (nil: wildcard).
func (c *envoyClient) subscribe(i int, names []string) error {
	c.mu.Lock()
	ty := &c.types[i]
	ty.subscribed, ty.names = true, names
	for name := range ty.res {
		if names != nil && !slices.Contains(names, name) {
			delete(ty.res, name) // no longer wanted: Envoy drops it
		}
	}
	req := &discovery.DiscoveryRequest{Node: c.node, TypeUrl: typeURLs[i], ResourceNames: names,
		VersionInfo: ty.version, ResponseNonce: ty.nonce}
	c.mu.Unlock()
	return c.stream.Send(req)
}

// handle checks one response, ACKs or NACKs it, and follows the dependencies it accepted.
func (c *envoyClient) handle(r *discovery.DiscoveryResponse) error {
	i := setIndex(r.GetTypeUrl())
	if i < 0 {
		return fmt.Errorf("response of unknown type %q", r.GetTypeUrl())
	}
	msgs := make([]proto.Message, 0, len(r.GetResources()))
	var bad error
	for _, a := range r.GetResources() {
		m := setTypes[i]()
		if err := a.UnmarshalTo(m); err != nil {
			bad = fmt.Errorf("resource of type %s: %v", a.GetTypeUrl(), err)
			break
		}
		msgs = append(msgs, m)
	}
	if bad == nil {
		bad = xds.CheckResponse(i, msgs)
	}
	c.mu.Lock()
	c.responses[i]++
	ty := &c.types[i]
	ty.nonce = r.GetNonce()
	req := &discovery.DiscoveryRequest{Node: c.node, TypeUrl: r.GetTypeUrl(), ResourceNames: ty.names, ResponseNonce: r.GetNonce()}
	if bad != nil {
		c.nacks = append(c.nacks, fmt.Sprintf("%s version %s: %v", xds.SetNames[i], r.GetVersionInfo(), bad))
		req.VersionInfo = ty.version
		req.ErrorDetail = &statuspb.Status{Code: 3, Message: bad.Error()}
		c.mu.Unlock()
		return c.stream.Send(req)
	}
	ty.version = r.GetVersionInfo()
	req.VersionInfo = ty.version
	if ty.names == nil { // state of the world: what is not in the response is gone
		ty.res = map[string]proto.Message{}
	}
	for _, m := range msgs {
		ty.res[resourceName(m)] = m
	}
	var follow func() error
	switch i {
	case xds.ClusterSet:
		var cs []*cluster.Cluster
		for _, m := range ty.res {
			cs = append(cs, m.(*cluster.Cluster))
		}
		eds := sortedUnique(xds.EDSNames(cs))
		first := !c.types[xds.ListenerSet].subscribed
		follow = func() error {
			if !slices.Equal(eds, c.subscribedNames(xds.EndpointSet)) {
				if err := c.subscribe(xds.EndpointSet, eds); err != nil {
					return err
				}
			}
			if first {
				return c.subscribe(xds.ListenerSet, nil)
			}
			return nil
		}
	case xds.ListenerSet:
		var ls []*listener.Listener
		for _, m := range ty.res {
			ls = append(ls, m.(*listener.Listener))
		}
		rds := sortedUnique(xds.RDSNames(ls))
		follow = func() error {
			if !slices.Equal(rds, c.subscribedNames(xds.RouteSet)) {
				return c.subscribe(xds.RouteSet, rds)
			}
			return nil
		}
	}
	c.mu.Unlock()
	if err := c.stream.Send(req); err != nil {
		return err
	}
	if follow != nil {
		return follow()
	}
	return nil
}

func (c *envoyClient) subscribedNames(i int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.types[i].subscribed {
		return []string{} // never equal to a list: a first subscription is always sent
	}
	return c.types[i].names
}

// checkResponse applies Envoy's rules to one response of set i.
func resourceName(m proto.Message) string {
	switch r := m.(type) {
	case *listener.Listener:
		return r.GetName()
	case *route.RouteConfiguration:
		return r.GetName()
	case *cluster.Cluster:
		return r.GetName()
	case *endpoint.ClusterLoadAssignment:
		return r.GetClusterName()
	}
	return ""
}

func sortedUnique(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return slices.Compact(out)
}

// envoyState is what an envoyClient holds, by type.
type envoyState struct {
	listeners []*listener.Listener
	routes    []*route.RouteConfiguration
	clusters  []*cluster.Cluster
	clas      []*endpoint.ClusterLoadAssignment
	versions  [xds.NumSets]string
	responses [xds.NumSets]int
}

func (c *envoyClient) state() (envoyState, []string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s envoyState
	collect := func(i int) []proto.Message {
		var out []proto.Message
		for _, m := range c.types[i].res {
			out = append(out, m)
		}
		sort.Slice(out, func(a, b int) bool { return resourceName(out[a]) < resourceName(out[b]) })
		return out
	}
	s.listeners = as[*listener.Listener](collect(xds.ListenerSet))
	s.routes = as[*route.RouteConfiguration](collect(xds.RouteSet))
	s.clusters = as[*cluster.Cluster](collect(xds.ClusterSet))
	s.clas = as[*endpoint.ClusterLoadAssignment](collect(xds.EndpointSet))
	for i := range c.types {
		s.versions[i] = c.types[i].version
	}
	s.responses = c.responses
	return s, slices.Clone(c.nacks), c.err
}

// consistent reports whether the state is complete: every listener's route configuration,
// every route's cluster and every EDS cluster's assignment is held.
func (s envoyState) consistent() error {
	if len(s.listeners) == 0 {
		return fmt.Errorf("no listeners")
	}
	return xds.CheckRefs(s.listeners, s.routes, s.clusters, s.clas)
}

// waitFor waits until the client's state is consistent and cond holds; it fails the test on
// a NACK, the stream's end, or after 10 s.
func (c *envoyClient) waitFor(t testing.TB, what string, cond func(envoyState) error) envoyState {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s, nacks, err := c.state()
		if len(nacks) > 0 {
			t.Fatalf("%s: client NACKed: %v", c.node.GetId(), nacks)
		}
		if err != nil {
			t.Fatalf("%s: stream ended: %v", c.node.GetId(), err)
		}
		last := s.consistent()
		if last == nil {
			if last = cond(s); last == nil {
				return s
			}
		}
		select {
		case <-c.changed:
		case <-deadline:
			t.Fatalf("%s: timed out waiting for %s: %v", c.node.GetId(), what, last)
		}
	}
}

// renderAssignments renders the held assignments as "CLUSTER: POD@PRIORITY:WEIGHT[ADDR] …;"
// (the failover locality lists its endpoints' addresses).
func renderAssignments(clas []*endpoint.ClusterLoadAssignment) map[string]string {
	out := map[string]string{}
	for _, cla := range clas {
		var parts []string
		for _, l := range cla.GetEndpoints() {
			var addrs []string
			for _, e := range l.GetLbEndpoints() {
				sa := e.GetEndpoint().GetAddress().GetSocketAddress()
				addrs = append(addrs, fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()))
			}
			parts = append(parts, fmt.Sprintf("%s@%d:%d%v", l.GetLocality().GetSubZone(), l.GetPriority(), l.GetLoadBalancingWeight().GetValue(), addrs))
		}
		out[cla.GetClusterName()] = strings.Join(parts, " ")
	}
	return out
}

// expectedAssignments derives, independently of the translator, what pod's Envoy node must
// hold for every service port: the plan's integer weights (largest remainder over WeightTotal)
// of every service pod calls, priority 0, in pod order; the pods without weight in the
// failover locality; services it does not call round-robin by capacity. Endpoints are the
// pod's address on the first port and its host with the target port on the others.
func expectedAssignments(t testing.TB, top *optimizer.Topology, a *optimizer.Allocation, pod string) map[string]string {
	t.Helper()
	caller := ""
	for i := range top.Services {
		for j := range top.Services[i].Pods {
			if top.Services[i].PodKey(&top.Services[i].Pods[j]) == pod {
				caller = top.Services[i].Key()
			}
		}
	}
	out := map[string]string{}
	for i := range top.Services {
		s := &top.Services[i]
		w := make([]float64, len(s.Pods))
		var fractions map[string]float64
		if call := a.Call(caller, s.Key()); call != nil {
			fractions = call.Fractions()[pod]
		}
		for j := range s.Pods {
			if fractions != nil {
				w[j] = fractions[s.PodKey(&s.Pods[j])]
			} else {
				w[j] = s.Pods[j].CapacityWeight()
			}
		}
		weights := optimizer.LargestRemainder(w, xds.WeightTotal)
		for k, p := range s.Ports {
			var parts, failover []string
			for j := range s.Pods {
				host, port, err := xds.ParseAddress(s.Endpoint(&s.Pods[j]))
				if err != nil {
					t.Fatal(err)
				}
				if k > 0 {
					port = uint32(p.TargetPort)
				}
				addr := fmt.Sprintf("%s:%d", host, port)
				if weights[j] > 0 {
					parts = append(parts, fmt.Sprintf("%s@0:%d[%s]", s.PodKey(&s.Pods[j]), weights[j], addr))
				} else {
					failover = append(failover, addr)
				}
			}
			if len(failover) > 0 {
				parts = append(parts, fmt.Sprintf("%s@1:1%v", xds.FailoverSubZone, failover))
			}
			out[s.IstioClusterName(p.Port, "")] = strings.Join(parts, " ")
		}
	}
	return out
}

func assignmentsEqual(want map[string]string) func(envoyState) error {
	return func(s envoyState) error {
		got := renderAssignments(s.clas)
		for name, w := range want {
			if got[name] != w {
				return fmt.Errorf("assignment %s: got %q, want %q", name, got[name], w)
			}
		}
		if len(got) != len(want) {
			return fmt.Errorf("%d assignments, want %d", len(got), len(want))
		}
		return nil
	}
}

func TestEnvoyClientFollowsThePlan(t *testing.T) {
	t.Parallel()
	top := loadTopology(t, bookinfoPath)
	h := startServer(t, Config{DebounceQuiet: -1})
	h.srv.Update(top)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.srv.WaitPublished(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// productpage-0 calls details and reviews; reviews-1 calls ratings, which has two ports.
	pods := []string{"productpage-0", "reviews-1"}
	clients := map[string]*envoyClient{}
	for _, p := range pods {
		clients[p] = dialEnvoy(t, h.addr, p)
	}
	follow := func(n uint64, top *optimizer.Topology, what string) map[string]envoyState {
		t.Helper()
		if err := h.srv.WaitPublished(ctx, n); err != nil {
			t.Fatal(err)
		}
		alloc := h.srv.Allocation()
		states := map[string]envoyState{}
		for _, p := range pods {
			states[p] = clients[p].waitFor(t, what, assignmentsEqual(expectedAssignments(t, top, alloc, p)))
		}
		if err := h.srv.WaitConverged(ctx, n); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods { // every answer is in: the counts below are final
			states[p], _, _ = clients[p].state()
		}
		return states
	}
	first := follow(1, top, "the first plan")

	// What Envoy holds: one listener and route configuration per port number, a virtual host
	// per service on the shared port 9080, a cluster per service port.
	s := first["productpage-0"]
	var names []string
	for _, l := range s.listeners {
		names = append(names, l.GetName())
	}
	if got := strings.Join(names, " "); got != "127.0.0.1_9080 127.0.0.1_9090" {
		t.Errorf("listeners %s", got)
	}
	if n := len(s.routes[0].GetVirtualHosts()); s.routes[0].GetName() != "9080" || n != 4 {
		t.Errorf("route configuration %s has %d virtual hosts, want 9080 with 4", s.routes[0].GetName(), n)
	}
	if len(s.clusters) != 5 {
		t.Errorf("%d clusters, want 5 (4 services on 9080, ratings on 9090 too)", len(s.clusters))
	}

	// Weights change (n1–n3 at 1 ms moves both callers): only EDS is sent.
	moved := top.Clone()
	for i, l := range moved.Latency {
		if l.From == "n1" && l.To == "n3" {
			moved.Latency[i].MS = 1
		}
	}
	h.srv.Update(moved)
	second := follow(2, moved, "the weights after a latency change")
	onlyEDS := func(before, after map[string]envoyState, what string) {
		t.Helper()
		for _, p := range pods {
			b, a := before[p], after[p]
			for i := range a.responses {
				if i != xds.EndpointSet && a.responses[i] != b.responses[i] {
					t.Errorf("%s: %s: %d %s responses, want none", what, p, a.responses[i]-b.responses[i], xds.SetNames[i])
				}
			}
			if a.responses[xds.EndpointSet] == b.responses[xds.EndpointSet] || a.versions[xds.EndpointSet] == b.versions[xds.EndpointSet] {
				t.Errorf("%s: %s: no new EDS version", what, p)
			}
		}
	}
	onlyEDS(first, second, "latency change")

	// A pod goes away: again only EDS, and it is gone from every assignment.
	removed := moved.Clone()
	for i := range removed.Services {
		s := &removed.Services[i]
		if s.Name == "reviews" {
			s.Pods = slices.DeleteFunc(s.Pods, func(p optimizer.Pod) bool { return p.Name == "reviews-3" })
		}
	}
	h.srv.Update(removed)
	third := follow(3, removed, "the weights after reviews-3 left")
	onlyEDS(second, third, "pod removal")
	for _, p := range pods {
		for name, a := range renderAssignments(third[p].clas) {
			if strings.Contains(a, "reviews-3") || strings.Contains(a, "10.0.0.10:") {
				t.Errorf("%s: %s still has reviews-3: %s", p, name, a)
			}
		}
	}
	if n := counter(t, h.srv.m.nacks.WithLabelValues("eds")) + counter(t, h.srv.m.nacks.WithLabelValues("lds")) +
		counter(t, h.srv.m.nacks.WithLabelValues("rds")) + counter(t, h.srv.m.nacks.WithLabelValues("cds")); n != 0 {
		t.Errorf("server counted %v NACKs", n)
	}
}

// TestEnvoyClientRejectsProxylessListeners shows the client NACKing what Envoy cannot use:
// a node that does not say it is Envoy gets the proxyless gRPC resources, whose api_listeners
// Envoy takes only from its bootstrap. The client keeps nothing of the rejected response.
func TestEnvoyClientRejectsProxylessListeners(t *testing.T) {
	t.Parallel()
	top := loadTopology(t, bookinfoPath)
	h := startServer(t, Config{DebounceQuiet: -1})
	h.srv.Update(top)
	c := dialEnvoyAs(t, h.addr, &core.Node{Id: "productpage-0", UserAgentName: "gRPC Go"})
	testkit.Eventually(t, 10*time.Second, "a NACK of the api_listeners", func() bool {
		_, nacks, _ := c.state()
		return slices.ContainsFunc(nacks, func(n string) bool { return strings.Contains(n, "api_listener") })
	})
	testkit.Eventually(t, 10*time.Second, "the server counting the LDS NACK", func() bool {
		return counter(t, h.srv.m.nacks.WithLabelValues("lds")) > 0
	})
	s, _, _ := c.state()
	if len(s.listeners) != 0 {
		t.Errorf("the client kept %d rejected listeners", len(s.listeners))
	}
}

// TestIstioSidecarGetsEDS is an Istio sidecar as the EnvoyFilter sets it up: its outbound
// clusters' EDS config is an api_config_source (GRPC) pointing at edgeflow, so it opens an EDS
// stream (not ADS) and names Istio's cluster names. It gets the caller's weights with Istio's
// mTLS endpoint metadata.
func TestIstioSidecarGetsEDS(t *testing.T) {
	t.Parallel()
	top := loadTopology(t, bookinfoPath)
	h := startServer(t, Config{DebounceQuiet: -1})
	h.srv.Update(top)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.srv.WaitPublished(ctx, 1); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := endpointservice.NewEndpointDiscoveryServiceClient(conn).StreamEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"outbound|9080||details.default.svc.cluster.local", "outbound|9080||reviews.default.svc.cluster.local"}
	node := &core.Node{Id: "sidecar~10.0.0.1~productpage-0.default~default.svc.cluster.local", UserAgentName: xds.EnvoyUserAgent}
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var clas []*endpoint.ClusterLoadAssignment
	for _, a := range r.GetResources() {
		cla := &endpoint.ClusterLoadAssignment{}
		if err := a.UnmarshalTo(cla); err != nil {
			t.Fatal(err)
		}
		clas = append(clas, cla)
		for _, l := range cla.GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				if e.GetMetadata().GetFilterMetadata()["envoy.transport_socket_match"].GetFields()["tlsMode"].GetStringValue() != "istio" {
					t.Errorf("%s: endpoint without Istio's mTLS metadata", cla.GetClusterName())
				}
			}
		}
	}
	if err := xds.CheckAssignments(clas); err != nil {
		t.Fatal(err)
	}
	want := expectedAssignments(t, top, h.srv.Allocation(), "productpage-0")
	got := renderAssignments(clas)
	if len(got) != len(names) {
		t.Errorf("got %d assignments, want %d", len(got), len(names))
	}
	for _, name := range names {
		if got[name] != want[name] {
			t.Errorf("%s: got %q, want %q", name, got[name], want[name])
		}
	}
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: names,
		VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	if err := h.srv.WaitConverged(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

func as[T proto.Message](msgs []proto.Message) []T {
	out := make([]T, len(msgs))
	for i, m := range msgs {
		out[i] = m.(T)
	}
	return out
}
