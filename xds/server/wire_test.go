package server

import (
	"bytes"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// TestWireForm checks that every resource of every node kind and encoding marshals, in wire
// form, to exactly its own bytes, keeps its name, and gives delta streams the same version.
func TestWireForm(t *testing.T) {
	t.Parallel()
	top := loadTopology(t, bookinfoPath)
	alloc := plan(t, top, optimizer.LATA)
	det := proto.MarshalOptions{Deterministic: true}
	for _, enc := range []xds.Encoding{xds.EncodingLocality, xds.EncodingWeightedClusters} {
		t.Run(string(enc), func(t *testing.T) {
			tr, err := xds.Translate(top, alloc, enc)
			if err != nil {
				t.Fatal(err)
			}
			wrapped := 0
			for pod := range tr.Pods {
				for kind := xds.NodeKind(0); kind < xds.NumKinds; kind++ {
					for i, set := range tr.Resources(pod, kind).Sets {
						for _, r := range set.Items {
							w := wireForm(r)
							if w != r {
								wrapped++
							}
							want, err := det.Marshal(r)
							if err != nil {
								t.Fatal(err)
							}
							got, err := det.Marshal(w)
							if err != nil {
								t.Fatal(err)
							}
							name := cache.GetResourceName(r)
							if !bytes.Equal(got, want) {
								t.Errorf("%s %s %q: wire form marshals to other bytes", pod, xds.SetNames[i], name)
							}
							if n := cache.GetResourceName(w); n != name {
								t.Errorf("%s %s: wire form is named %q, want %q", pod, xds.SetNames[i], n, name)
							}
						}
					}
				}
			}
			if wrapped == 0 {
				t.Error("no resource was put in wire form")
			}
		})
	}
}
