package optimizer

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"gopkg.in/yaml.v3"
)

// maxTopologyBytes bounds a topology file (64 MiB): larger input is refused, not half-read.
const maxTopologyBytes = 64 << 20

// ParseTopology reads a topology in YAML or JSON (JSON is read as YAML, which it is). Unknown
// fields are errors. It checks syntax and field types only; Compile validates the content.
// name labels errors (a file name, or "-" for standard input).
func ParseTopology(r io.Reader, name string) (*Topology, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxTopologyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("optimizer: reading %s: %w", name, err)
	}
	if len(data) > maxTopologyBytes {
		return nil, invalidf("%s: larger than %d bytes", name, maxTopologyBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, invalidf("%s: empty topology", name)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var t Topology
	if err := dec.Decode(&t); err != nil {
		return nil, invalidf("%s: %v", name, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, invalidf("%s: more than one YAML document", name)
	}
	return &t, nil
}
