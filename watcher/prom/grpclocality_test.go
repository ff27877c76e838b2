package prom

import (
	"testing"
)

// TestParseGRPCLocality: grpc-go's strings parse back to the locality (quotes and escapes
// included) and print as grpc-go prints them; anything else is an error naming the value.
func TestParseGRPCLocality(t *testing.T) {
	for _, l := range []Locality{{}, {Zone: "n2", SubZone: "edgeflow/band"}, {Region: "eu", Zone: `a "b"`, SubZone: `\`}} {
		s := l.String()
		got, err := ParseGRPCLocality(s)
		if err != nil || got != l {
			t.Errorf("%s: parsed %+v, %v; want %+v", s, got, err, l)
		}
	}
	if s := (Locality{Zone: "n2", SubZone: "edgeflow/band"}).String(); s != `{region="", zone="n2", sub_zone="edgeflow/band"}` {
		t.Errorf("String: %s; want grpc-go's form", s)
	}
	for _, bad := range []string{"", "{}", `{region="", zone="n2"}`, `{region="", zone="n2", sub_zone="x"} `, `{zone="n2", region="", sub_zone=""}`,
		`{region=x, zone="", sub_zone=""}`} {
		if _, err := ParseGRPCLocality(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzParseGRPCLocality(f *testing.F) {
	f.Add(`{region="", zone="n2", sub_zone="edgeflow/band"}`)
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseGRPCLocality(s)
		if err != nil {
			return
		}
		if back, err := ParseGRPCLocality(l.String()); err != nil || back != l {
			t.Fatalf("%q → %+v → %q → %+v, %v", s, l, l.String(), back, err)
		}
	})
}
