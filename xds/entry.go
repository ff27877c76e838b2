package xds

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sort"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/proto"
)

// entry is a validated resource with its content hash.
type entry struct {
	name string
	res  types.Resource
	sum  [sha256.Size]byte
}

// validator is what the generated protos' ValidateAll gives.
type validator interface{ ValidateAll() error }

func newEntry(name string, r types.Resource) (entry, error) {
	if v, ok := r.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			return entry{}, fmt.Errorf("xds: generated %T %q is invalid: %w", r, name, err)
		}
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		return entry{}, fmt.Errorf("xds: marshal %q: %w", name, err)
	}
	return entry{name: name, res: r, sum: sha256.Sum256(data)}, nil
}

// derivedEntry is a per-caller resource of service s: a deterministic function of s's shared
// content and the caller's weights, so its content hash is computed from those instead of
// marshalling it (which dominated translation time at thousands of callers), and callers with
// the same weights share one resource (memory, validation). It is validated like every other
// resource.
func derivedEntry(s *service, kind string, build func() types.Resource, weights []int64) (entry, error) {
	return s.derive(&s.sum, s.name, kind, build, weights, true)
}

// derive is derivedEntry for a resource named name whose shared content hashes to base. It
// validates the resource only when validate is set (see Translation.Resources).
func (s *service) derive(base *[sha256.Size]byte, name, kind string, build func() types.Resource, weights []int64, validate bool) (entry, error) {
	key := make([]byte, 0, len(kind)+8*len(weights))
	key = append(key, kind...)
	for _, w := range weights {
		key = binary.LittleEndian.AppendUint64(key, uint64(w))
	}
	if e, ok := s.derived[string(key)]; ok {
		return e, nil
	}
	r := build()
	if validate {
		if err := r.(validator).ValidateAll(); err != nil {
			return entry{}, fmt.Errorf("xds: generated %s %q is invalid: %w", kind, name, err)
		}
	}
	h := sha256.New()
	h.Write(base[:])
	h.Write(key)
	e := entry{name: name, res: r}
	h.Sum(e.sum[:0])
	if s.derived == nil {
		s.derived = map[string]entry{}
	}
	s.derived[string(key)] = e
	return e, nil
}

// makeSet sorts entries by name and derives the set's version from names and content hashes.
func makeSet(es []entry) Set {
	sort.Slice(es, func(i, j int) bool { return es[i].name < es[j].name })
	h := sha256.New()
	items := make([]types.Resource, len(es))
	for i, e := range es {
		h.Write([]byte(e.name))
		h.Write([]byte{0})
		h.Write(e.sum[:])
		items[i] = e.res
	}
	if len(es) == 0 {
		return Set{}
	}
	return Set{Version: hex.EncodeToString(h.Sum(nil)[:8]), Items: items}
}

// Assignment returns the named ClusterLoadAssignment of the node, or nil.
func (n *NodeResources) Assignment(name string) *endpoint.ClusterLoadAssignment {
	for _, r := range n.Sets[EndpointSet].Items {
		if c := r.(*endpoint.ClusterLoadAssignment); c.GetClusterName() == name {
			return c
		}
	}
	return nil
}

// Route returns the named RouteConfiguration of the node, or nil.
func (n *NodeResources) Route(name string) *route.RouteConfiguration {
	for _, r := range n.Sets[RouteSet].Items {
		if c := r.(*route.RouteConfiguration); c.GetName() == name {
			return c
		}
	}
	return nil
}

// Listener returns the named Listener of the node, or nil.
func (n *NodeResources) Listener(name string) *listener.Listener {
	for _, r := range n.Sets[ListenerSet].Items {
		if c := r.(*listener.Listener); c.GetName() == name {
			return c
		}
	}
	return nil
}

// Cluster returns the named Cluster of the node, or nil.
func (n *NodeResources) Cluster(name string) *cluster.Cluster {
	for _, r := range n.Sets[ClusterSet].Items {
		if c := r.(*cluster.Cluster); c.GetName() == name {
			return c
		}
	}
	return nil
}
