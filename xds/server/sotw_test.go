package server

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"strconv"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// sotwDriver plays go-control-plane's SOTW stream loop (sotw/v3 process and send) for one
// stream over a cache: the stale-nonce rule, one watch per type replaced on every accepted
// request, the returned resources kept in the subscription, a nonce per response.
type sotwDriver struct {
	c       cache.ConfigWatcher
	node    *core.Node
	watches map[string]*driverWatch
	nonce   int64
	// onRequest and onResponse are the server's callbacks (nil for the reference).
	onRequest  func(*discovery.DiscoveryRequest)
	onResponse func(*discovery.DiscoveryResponse)
}

type driverWatch struct {
	cancel func()
	ch     chan cache.Response
	sub    stream.Subscription
	nonce  string
}

func (d *sotwDriver) request(t *testing.T, typ, version, nonce string, names []string, nack bool) {
	t.Helper()
	req := &discovery.DiscoveryRequest{Node: d.node, TypeUrl: typ, VersionInfo: version, ResponseNonce: nonce, ResourceNames: slices.Clone(names)}
	if nack {
		req.ErrorDetail = &statuspb.Status{Message: "rejected by the test"}
	}
	if d.onRequest != nil {
		d.onRequest(req)
	}
	var sub stream.Subscription
	if w, ok := d.watches[typ]; ok {
		if w.nonce != "" && nonce != w.nonce {
			return // stale
		}
		w.cancel()
		sub = w.sub
		sub.SetResourceSubscription(req.GetResourceNames())
	} else {
		sub = stream.NewSotwSubscription(req.GetResourceNames(), true)
	}
	ch := make(chan cache.Response, 1)
	cancel, err := d.c.CreateWatch(req, sub, ch)
	if err != nil {
		t.Fatal(err)
	}
	d.watches[typ] = &driverWatch{cancel: cancel, ch: ch, sub: sub}
}

// send sends what is queued on the open watches, by type, as "version [names]".
func (d *sotwDriver) send(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, typ := range typeURLs {
		w, ok := d.watches[typ]
		if !ok {
			continue
		}
		select {
		case resp := <-w.ch:
			r, err := resp.GetDiscoveryResponse()
			if err != nil {
				t.Fatal(err)
			}
			d.nonce++
			msg := proto.Clone(r).(*discovery.DiscoveryResponse)
			msg.Nonce = strconv.FormatInt(d.nonce, 10)
			w.sub.SetReturnedResources(resp.GetReturnedResources())
			w.nonce = msg.Nonce
			if d.onResponse != nil {
				d.onResponse(msg)
			}
			var names []string
			for _, a := range msg.GetResources() {
				res, err := a.UnmarshalNew()
				if err != nil {
					t.Fatal(err)
				}
				names = append(names, cache.GetResourceName(res))
			}
			slices.Sort(names)
			out[typ] = fmt.Sprintf("%s %v", msg.GetVersionInfo(), names)
		default:
		}
	}
	return out
}

// TestSOTWWatchesMirrorSnapshotCache: the server's SOTW watches answer exactly as
// go-control-plane's snapshot cache (ads=false) holding the same snapshot does, over random
// request sequences (ACKs, changed subscriptions, stale nonces, old and unknown versions)
// interleaved with publications that change the node's endpoints. Both run under the same
// driver of go-control-plane's stream loop. The explicit wildcard is left out: the snapshot
// cache filters a response by the request's names, "*" included, and so answers it with no
// resources; the server sends every resource (TestSOTWExplicitWildcard).
func TestSOTWWatchesMirrorSnapshotCache(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	s := h.srv
	ours := sotwCache{s: s, Cache: nil}
	pool := []string{"y", "v", "u"}
	for run := range 400 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r := rand.New(rand.NewSource(int64(run)))
		id := fmt.Sprintf("x-%d", run%2)
		node := &core.Node{Id: id}
		key := streamKey{id: int64(1_000_000 + run)}
		if err := s.streamOpened(ctx, key); err != nil {
			t.Fatal(err)
		}
		ref := cache.NewSnapshotCache(false, nodeIDHash{}, nil)
		a := &sotwDriver{c: ours, node: node, watches: map[string]*driverWatch{},
			onRequest: func(req *discovery.DiscoveryRequest) {
				if err := s.onRequest(key, req); err != nil {
					t.Fatal(err)
				}
			},
			onResponse: func(resp *discovery.DiscoveryResponse) { s.onResponse(key, resp) }}
		b := &sotwDriver{c: ref, node: node, watches: map[string]*driverWatch{}}
		mirror := func() { // a snapshot that did not change answers no watch
			if snap, err := s.cached(id); err == nil {
				if err := ref.SetSnapshot(ctx, id, snap); err != nil {
					t.Fatal(err)
				}
			}
		}
		seen := map[string][]string{} // versions sent, by type
		last := map[string]string{}   // last response, by type: "version nonce"
		for step := range 60 {
			var what string
			if r.Intn(8) == 0 && step > 0 {
				l := []float64{5, 15}[r.Intn(2)]
				what = fmt.Sprintf("publish two(%v)", l)
				want := s.Published() + 1
				s.Update(two(l))
				if err := s.WaitPublished(ctx, want); err != nil {
					t.Fatal(err)
				}
			} else {
				typ := typeURLs[r.Intn(xds.NumSets)]
				var names []string
				for _, n := range pool {
					if r.Intn(2) == 0 {
						names = append(names, n)
					}
				}
				version, nonce, nack := "", "", false
				if l, ok := last[typ]; ok {
					version, nonce, _ = cutSpace(l)
				}
				switch r.Intn(6) {
				case 0:
					version = ""
				case 1:
					if v := seen[typ]; len(v) > 0 {
						version = v[r.Intn(len(v))]
					}
				case 2:
					version = "unknown"
				case 3:
					nonce = strconv.Itoa(r.Intn(5))
				case 4:
					nack = true
					if v := seen[typ]; len(v) > 1 {
						version = v[len(v)-2]
					}
				}
				what = fmt.Sprintf("%s version %q nonce %q names %v nack %v", xds.SetNames[setIndex(typ)], version, nonce, names, nack)
				a.request(t, typ, version, nonce, names, nack)
				mirror() // what the server's callback set before its watch opened
				b.request(t, typ, version, nonce, names, nack)
			}
			if step == 0 {
				want := s.Published() + 1
				s.Update(two(5))
				if err := s.WaitPublished(ctx, want); err != nil {
					t.Fatal(err)
				}
			}
			mirror()
			got, want := a.send(t), b.send(t)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("run %d step %d (%s): server sent %v, snapshot cache %v", run, step, what, got, want)
			}
			for typ, v := range got {
				version, _, _ := cutSpace(v)
				seen[typ] = append(seen[typ], version)
				last[typ] = version + " " + a.watches[typ].nonce
			}
		}
		for _, w := range a.watches {
			w.cancel()
		}
		s.closeStream(key)
	}
}

func cutSpace(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// TestSOTWExplicitWildcard: a SOTW request naming "*" (with or without other names) is sent
// every resource of the node's set, over a real ADS stream.
func TestSOTWExplicitWildcard(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	h.srv.Update(two(5))
	for _, names := range [][]string{{"*"}, {"*", "y"}} {
		c := dialADS(t, h.addr, "x-0")
		c.subscribe(resource.ClusterType, names...)
		r := c.next()
		var got []string
		for _, a := range r.GetResources() {
			res, err := a.UnmarshalNew()
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, cache.GetResourceName(res))
		}
		slices.Sort(got)
		if fmt.Sprint(got) != "[v y]" {
			t.Errorf("names %v: got clusters %v, want [v y]", names, got)
		}
	}
}

// TestFetch: the per-type services' Fetch answers, over gRPC, what a node is served, also for
// a node with no stream; a request naming that version is told there is nothing new.
func TestFetch(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eds := endpointservice.NewEndpointDiscoveryServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := eds.FetchEndpoints(ctx, &discovery.DiscoveryRequest{Node: &core.Node{Id: "x-0"}}); err == nil {
		t.Error("a fetch before the first publication succeeded")
	}
	h.srv.Update(two(5))
	if err := h.srv.WaitPublished(ctx, 1); err != nil {
		t.Fatal(err)
	}
	streamed := dialADS(t, h.addr, "x-1")
	streamed.subscribe(resource.EndpointType, "y")
	pushed := streamed.next()
	for _, tc := range []struct {
		node  string
		names []string
		want  string
	}{
		// x-0 (on n1) calls y: y-0 on n2 is nearest; it does not call v: round robin.
		{"x-0", nil, "v: v-0@0:5000 v-1@0:5000;y: y-0@0:10000 edgeflow/failover@1:1;"},
		{"x-0", []string{"y"}, "y: y-0@0:10000 edgeflow/failover@1:1;"}, {"x-1", []string{"y"}, weights(t, pushed)}} {
		r, err := eds.FetchEndpoints(ctx, &discovery.DiscoveryRequest{Node: &core.Node{Id: tc.node}, ResourceNames: tc.names})
		if err != nil {
			t.Fatal(err)
		}
		if got := weights(t, r); got != tc.want {
			t.Errorf("fetch by %s of %v = %q, want %q", tc.node, tc.names, got, tc.want)
		}
		_, err = eds.FetchEndpoints(ctx, &discovery.DiscoveryRequest{Node: &core.Node{Id: tc.node}, VersionInfo: r.GetVersionInfo()})
		if err == nil {
			t.Errorf("fetch by %s naming the current version %s succeeded", tc.node, r.GetVersionInfo())
		}
	}
}

// TestSOTWAndDeltaStreamsOfOneNode: a node with a SOTW and a delta stream gets every change on
// both, converges once both ACKed, and keeps getting changes on the SOTW stream after its delta
// stream (and with it the node's snapshot in the snapshot cache) is gone.
func TestSOTWAndDeltaStreamsOfOneNode(t *testing.T) {
	t.Parallel()
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sotw, delta := dialADS(t, h.addr, "x-0"), dialDelta(t, h.addr, "x-0")
	h.srv.Update(two(5))
	sotw.subscribe(resource.EndpointType, "y")
	delta.subscribe(resource.EndpointType, "y")
	s1, d1 := sotw.next(), delta.next()
	sotw.ack(s1)
	delta.ack(d1)
	if err := h.srv.WaitConverged(ctx, 1); err != nil {
		t.Fatal(err)
	}
	h.srv.Update(two(15)) // x-0 moves from y-0 to y-1
	s2, d2 := sotw.next(), delta.next()
	if s2.GetVersionInfo() == s1.GetVersionInfo() || len(d2.GetResources()) != 1 {
		t.Fatalf("after the change: SOTW version %s (was %s), delta resources %d", s2.GetVersionInfo(), s1.GetVersionInfo(), len(d2.GetResources()))
	}
	sotw.ack(s2)
	delta.ack(d2)
	if err := h.srv.WaitConverged(ctx, 2); err != nil {
		t.Fatal(err)
	}
	delta.close()
	testkit.Eventually(t, 5*time.Second, "the delta stream closed", func() bool {
		h.srv.nodesMu.Lock()
		n := h.srv.nodeByIDLocked("x-0")
		h.srv.nodesMu.Unlock()
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.deltas == 0 && n.snap == nil
	})
	if _, err := h.srv.cacheFor("x-0").GetSnapshot("x-0"); err == nil {
		t.Error("the snapshot cache still holds x-0's snapshot with no delta stream left")
	}
	h.srv.Update(two(5))
	s3 := sotw.next()
	if s3.GetVersionInfo() != s1.GetVersionInfo() {
		t.Errorf("back to two(5): SOTW version %s, want %s", s3.GetVersionInfo(), s1.GetVersionInfo())
	}
	sotw.ack(s3)
	if err := h.srv.WaitConverged(ctx, 3); err != nil {
		t.Fatal(err)
	}
}
