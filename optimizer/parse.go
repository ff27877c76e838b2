package optimizer

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"gopkg.in/yaml.v3"
)

// MaxTopologyBytes bounds a topology file (64 MiB): larger input is refused, not half-read.
const MaxTopologyBytes = 64 << 20

// ParseTopology reads a topology in YAML or JSON (JSON is read as YAML, which it is). Unknown
// fields are errors. It checks syntax and field types only; Compile validates the content.
// name labels errors (a file name, or "-" for standard input).
func ParseTopology(r io.Reader, name string) (*Topology, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxTopologyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("optimizer: reading %s: %w", name, err)
	}
	if len(data) > MaxTopologyBytes {
		return nil, invalidf("%s: larger than %d bytes", name, MaxTopologyBytes)
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

// The topology file's keys are snake_case, as is everything edgeflow prints. Two keys of the
// first releases were camelCase; a file written with them still loads:
//
//	services[].ports[].targetPort     → target_port
//	services[].pods[].serviceAccount  → service_account
//
// A mapping giving both the former and the new key is an error naming the item and the line.
//
// Port and Pod take them with yaml.v3's func form of UnmarshalYAML, not yaml.Unmarshaler: the
// func decodes with the caller's decoder, so ParseTopology's KnownFields still holds inside
// them (Node.Decode, all yaml.Unmarshaler has, decodes without it and would drop unknown keys).

// UnmarshalYAML reads a Port, taking targetPort for target_port.
func (p *Port) UnmarshalYAML(unmarshal func(any) error) error {
	type port = Port // the package's Port, which the local one below hides
	type fields Port // Port's fields, without this method
	// Port is named so that yaml's errors say "not found in type optimizer.Port", as before.
	type Port struct {
		fields     `yaml:",inline"`
		TargetPort *int32 `yaml:"targetPort"` // the former key
	}
	var f Port
	if err := unmarshal(&f); err != nil {
		return err
	}
	*p = port(f.fields)
	if f.TargetPort == nil {
		return nil
	}
	p.TargetPort = *f.TargetPort
	return onlyOne(unmarshal, "targetPort", "target_port", func(m map[string]yaml.Node) string {
		if n := m["name"]; n.Value != "" {
			return fmt.Sprintf("port %q", n.Value)
		}
		return "port " + m["port"].Value
	})
}

// UnmarshalYAML reads a Pod, taking serviceAccount for service_account.
func (p *Pod) UnmarshalYAML(unmarshal func(any) error) error {
	type pod = Pod  // the package's Pod, which the local one below hides
	type fields Pod // Pod's fields, without this method
	// Pod is named so that yaml's errors say "not found in type optimizer.Pod", as before.
	type Pod struct {
		fields         `yaml:",inline"`
		ServiceAccount *string `yaml:"serviceAccount"` // the former key
	}
	var f Pod
	if err := unmarshal(&f); err != nil {
		return err
	}
	*p = pod(f.fields)
	if f.ServiceAccount == nil {
		return nil
	}
	p.ServiceAccount = *f.ServiceAccount
	return onlyOne(unmarshal, "serviceAccount", "service_account", func(m map[string]yaml.Node) string {
		return fmt.Sprintf("pod %q", m["name"].Value)
	})
}

// onlyOne is an error when the mapping unmarshal decodes gives both the key former and key,
// naming the item (what item returns for the mapping's values by key) and the line.
func onlyOne(unmarshal func(any) error, former, key string, item func(map[string]yaml.Node) string) error {
	var m map[string]yaml.Node
	if err := unmarshal(&m); err != nil {
		return err
	}
	if _, ok := m[key]; !ok {
		return nil
	}
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %s: both %s and %s, its former name: give only %s",
		m[former].Line, item(m), key, former, key)}}
}
