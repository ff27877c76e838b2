// Package examples bundles the example topologies, so the edgeflow binary carries its default
// demo input: the paper's Bookinfo and DAG applications on 4 nodes, latency scenario A.
package examples

import "embed"

// Files holds bookinfo.yaml and dag.yaml.
//
//go:embed bookinfo.yaml dag.yaml
var Files embed.FS

// Bookinfo returns the bundled Bookinfo-like topology file.
func Bookinfo() []byte { return mustRead("bookinfo.yaml") }

// DAG returns the bundled A→E chain topology file.
func DAG() []byte { return mustRead("dag.yaml") }

func mustRead(name string) []byte {
	b, err := Files.ReadFile(name)
	if err != nil {
		panic("examples: " + name + " is not embedded: " + err.Error())
	}
	return b
}
