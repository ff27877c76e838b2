package server

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
)

// fuzzReader hands out the fuzzer's bytes; past the end, zeros.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) next() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) pick(options []string) string { return options[int(r.next())%len(options)] }

func (r *fuzzReader) names(pool []string) []string {
	var out []string
	for range int(r.next()) % 4 {
		out = append(out, r.pick(pool))
	}
	return out
}

// FuzzStreamRequests sends random sequences of xDS requests (SOTW and delta, on up to three
// streams of one connection: any node ids, switches included, any types, names, versions,
// nonces, NACKs, initial versions) to a running server over a real gRPC connection, while a
// well-behaved client as pod x-0 holds its weights on its own connection. After each sequence,
// its connection closed: the server did not panic, holds no state of the fuzzed streams (no
// node, stream or snapshot cache entry: memory is bounded), kept at most one node per stream
// while they were open, and the well-behaved client was sent nothing and still holds its
// weights — even when the fuzzed streams claimed x-0 and NACKed.
func FuzzStreamRequests(f *testing.F) {
	// An op: stream, kind (even: SOTW), node, type, NACK (0 mod 3), then SOTW: names (count,
	// each), version, nonce; delta: initial versions (count, each name and version),
	// subscribe and unsubscribe names, nonce. Node 0 is x-0, the control client's id.
	sub := []byte{0, 0, 0, 3, 1, 1, 0, 0, 0}               // SOTW: EDS y as x-0
	nack := []byte{0, 0, 0, 3, 0, 1, 0, 1, 1}              // SOTW: NACK of nonce 1 as x-0
	switchID := []byte{0, 0, 1, 3, 1, 1, 0, 0, 0}          // SOTW: now as x-1
	deltaSub := []byte{1, 1, 0, 3, 1, 1, 0, 1, 1, 0, 0, 0} // delta: EDS y as x-0, holding y
	deltaNACK := []byte{1, 1, 0, 3, 0, 0, 0, 0, 1}         // delta: NACK of nonce 1
	f.Add(sub)
	f.Add(append(slices.Clone(sub), nack...))
	f.Add(append(slices.Clone(sub), switchID...))
	f.Add(append(slices.Clone(deltaSub), deltaNACK...))
	f.Add(append(append(slices.Clone(sub), deltaSub...), append(nack, deltaNACK...)...))
	f.Add([]byte{2, 4, 9, 5, 3, 3, 7, 7, 7, 1, 0, 255, 255}) // garbage types and names
	h := startServer(f, Config{Policy: optimizer.Localization, DebounceQuiet: -1})
	h.srv.Update(two(5))
	control := dialADS(f, h.addr, "x-0")
	control.subscribe(resource.EndpointType, "y")
	first := control.next()
	control.ack(first)
	// A second publication with other weights: the control client's node has an earlier set
	// to be rolled back to.
	ctx := context.Background()
	h.srv.Update(two(15))
	held := control.next()
	control.ack(held)
	if held.GetVersionInfo() == first.GetVersionInfo() {
		f.Fatal("the second publication did not change x-0's weights")
	}
	testkit.Eventually(f, 10*time.Second, "the control client's ACK", func() bool {
		snap, err := h.srv.cached("x-0")
		return err == nil && snap.GetVersion(resource.EndpointType) == held.GetVersionInfo()
	})

	nodeIDs := []string{"x-0", "x-1", "u-0", "", "sidecar~127.0.0.1~x-0~default.svc.cluster.local", "x-0\x00c1"}
	types := []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType, "", "type.googleapis.com/garbage"}
	pool := []string{"y", "v", "*", "zz", "x", ""}
	versions := []string{"", held.GetVersionInfo(), "garbage", first.GetVersionInfo()}
	nonces := []string{"", "1", "2", "3", "x", "-1"}

	f.Fuzz(func(t *testing.T, data []byte) {
		conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		type fuzzStream struct {
			sotw  discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
			delta discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
			ended chan struct{} // closed when the stream ended (the server saw every request)
		}
		var streams [3]*fuzzStream
		drain := func(s *fuzzStream, recv func() error) {
			go func() {
				defer close(s.ended)
				for recv() == nil {
				}
			}()
		}
		r := &fuzzReader{b: data}
		for op := 0; op < 64 && len(r.b) > 0; op++ {
			k := int(r.next()) % len(streams)
			kind := r.next()
			if streams[k] == nil {
				s := &fuzzStream{ended: make(chan struct{})}
				if kind%2 == 0 {
					if s.sotw, err = ads.StreamAggregatedResources(sctx); err != nil {
						t.Fatal(err)
					}
					drain(s, func() error { _, err := s.sotw.Recv(); return err })
				} else {
					if s.delta, err = ads.DeltaAggregatedResources(sctx); err != nil {
						t.Fatal(err)
					}
					drain(s, func() error { _, err := s.delta.Recv(); return err })
				}
				streams[k] = s
			}
			s := streams[k]
			var node *core.Node
			if id := int(r.next()); id%(len(nodeIDs)+1) < len(nodeIDs) {
				node = &core.Node{Id: nodeIDs[id%(len(nodeIDs)+1)]}
			}
			typ := r.pick(types)
			var detail *statuspb.Status
			if r.next()%3 == 0 {
				detail = &statuspb.Status{Code: 3, Message: fmt.Sprintf("fuzz rejects it %x", r.b)}
			}
			if s.sotw != nil {
				_ = s.sotw.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: typ, ResourceNames: r.names(pool),
					VersionInfo: r.pick(versions), ResponseNonce: r.pick(nonces), ErrorDetail: detail})
			} else {
				var initial map[string]string
				for _, name := range r.names(pool) {
					if initial == nil {
						initial = map[string]string{}
					}
					initial[name] = r.pick(versions)
				}
				_ = s.delta.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: typ,
					ResourceNamesSubscribe: r.names(pool), ResourceNamesUnsubscribe: r.names(pool),
					InitialResourceVersions: initial, ResponseNonce: r.pick(nonces), ErrorDetail: detail})
			}
			h.srv.nodesMu.Lock()
			nodes := len(h.srv.nodes)
			h.srv.nodesMu.Unlock()
			if nodes > 1+len(streams) {
				t.Fatalf("%d nodes for the control client and %d streams", nodes, len(streams))
			}
		}
		// Half-closed, a stream ends once the server has handled every request sent before.
		for _, s := range streams {
			if s == nil {
				continue
			}
			if s.sotw != nil {
				_ = s.sotw.CloseSend()
			} else {
				_ = s.delta.CloseSend()
			}
			select {
			case <-s.ended:
			case <-time.After(10 * time.Second):
				t.Fatal("a half-closed stream did not end within 10 s")
			}
		}
		cancel()
		conn.Close()
		testkit.Eventually(t, 10*time.Second, "the fuzzed streams' state gone", func() bool {
			h.srv.nodesMu.Lock()
			nodes := len(h.srv.nodes)
			h.srv.nodesMu.Unlock()
			return nodes == 1 && h.srv.openStreams.Load() == 1 && cacheEntries(h.srv) == 0
		})
		snap, err := h.srv.cached("x-0")
		if err != nil {
			t.Fatal(err)
		}
		if v := snap.GetVersion(resource.EndpointType); v != held.GetVersionInfo() {
			t.Fatalf("the control client's node now holds EDS version %s, want %s", v, held.GetVersionInfo())
		}
		if got := control.pending(); len(got) > 0 {
			t.Fatalf("the control client was sent %d responses (first: version %s)", len(got), got[0].GetVersionInfo())
		}
	})
}
