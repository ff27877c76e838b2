package prom

import (
	"fmt"
	"strconv"
	"strings"
)

// Locality is an xDS locality as grpc-go labels its client metrics with it (grpc.lb.locality).
type Locality struct{ Region, Zone, SubZone string }

// ParseGRPCLocality parses the value of grpc-go's grpc.lb.locality label (Prometheus:
// grpc_lb_locality), gRFC A76's string `{region="R", zone="Z", sub_zone="S"}` with Go-quoted
// values (grpc-go internal/xds/xds.go: LocalityString, and LocalityFromString, which reads it
// back the same way). Under edgeflow's bands policy the zone is the callee pods' node. An
// error names the value.
func ParseGRPCLocality(s string) (Locality, error) {
	var l Locality
	rest, ok := strings.CutPrefix(s, "{")
	for i, f := range []struct {
		key string
		v   *string
	}{{"region", &l.Region}, {"zone", &l.Zone}, {"sub_zone", &l.SubZone}} {
		if i > 0 {
			rest, ok = strings.CutPrefix(rest, ", ")
		}
		if ok {
			rest, ok = strings.CutPrefix(rest, f.key+"=")
		}
		if !ok {
			return Locality{}, fmt.Errorf("prom: grpc.lb.locality %q: want {region=\"…\", zone=\"…\", sub_zone=\"…\"}", s)
		}
		q, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return Locality{}, fmt.Errorf("prom: grpc.lb.locality %q: %s is not a quoted string", s, f.key)
		}
		*f.v, _ = strconv.Unquote(q)
		rest = rest[len(q):]
	}
	if rest != "}" {
		return Locality{}, fmt.Errorf("prom: grpc.lb.locality %q: want {region=\"…\", zone=\"…\", sub_zone=\"…\"}", s)
	}
	return l, nil
}

// String is l as grpc-go writes it (ParseGRPCLocality's inverse).
func (l Locality) String() string {
	return fmt.Sprintf("{region=%q, zone=%q, sub_zone=%q}", l.Region, l.Zone, l.SubZone)
}
