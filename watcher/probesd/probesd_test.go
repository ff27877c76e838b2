package probesd

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

func node(name, ip string, labels map[string]string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if ip != "" {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}
	}
	return n
}

func zone(z string, more ...string) map[string]string {
	l := map[string]string{corev1.LabelTopologyRegion: "eu", corev1.LabelTopologyZone: z}
	for i := 0; i+1 < len(more); i += 2 {
		l[more[i]] = more[i+1]
	}
	return l
}

// pairs renders groups as "source→target [targets] via exporter".
func pairs(gs []TargetGroup) []string {
	out := []string{}
	for _, g := range gs {
		out = append(out, g.Labels[LabelSourceNode]+"→"+g.Labels[LabelTargetNode]+" "+jsonString(g.Targets)+" via "+g.Labels[LabelExporter])
	}
	return out
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// notControlPlane is the chart's default --probe-node-selector.
func notControlPlane(t *testing.T) labels.Selector {
	t.Helper()
	sel, err := labels.Parse("!node-role.kubernetes.io/control-plane")
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

func TestTargetGroups(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []*corev1.Node
		cfg   Config
		want  []string
	}{
		{"none", nil, Config{Port: 9115}, []string{}},
		{"one node probes nothing", []*corev1.Node{node("a", "10.0.0.1", nil)}, Config{Port: 9115}, []string{}},
		{"every ordered pair, by name, through the source's exporter",
			[]*corev1.Node{node("edge-2", "10.0.0.2", nil), node("edge-1", "10.0.0.1", nil), node("edge-3", "10.0.0.3", nil)}, Config{Port: 9115},
			[]string{
				`edge-1→edge-2 ["10.0.0.2"] via 10.0.0.1:9115`, `edge-1→edge-3 ["10.0.0.3"] via 10.0.0.1:9115`,
				`edge-2→edge-1 ["10.0.0.1"] via 10.0.0.2:9115`, `edge-2→edge-3 ["10.0.0.3"] via 10.0.0.2:9115`,
				`edge-3→edge-1 ["10.0.0.1"] via 10.0.0.3:9115`, `edge-3→edge-2 ["10.0.0.2"] via 10.0.0.3:9115`,
			}},
		{"a node without the address type is left out; IPv6 exporter in brackets",
			[]*corev1.Node{node("a", "fd00::1", nil), node("b", "fd00::2", nil), node("c", "", nil)}, Config{Port: 9100},
			[]string{`a→b ["fd00::2"] via [fd00::1]:9100`, `b→a ["fd00::1"] via [fd00::2]:9100`}},
		{"ExternalIP", []*corev1.Node{
			{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}, {Type: corev1.NodeExternalIP, Address: "192.0.2.1"}}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.2"}, {Type: corev1.NodeExternalIP, Address: "192.0.2.2"}}}},
		}, Config{Port: 9115, AddressType: corev1.NodeExternalIP},
			[]string{`a→b ["192.0.2.2"] via 192.0.2.1:9115`, `b→a ["192.0.2.1"] via 192.0.2.2:9115`}},
		{"zone: the first node by name of each region/zone, a node without a zone its own zone",
			[]*corev1.Node{node("b-2", "10.0.0.4", zone("b")), node("a-2", "10.0.0.2", zone("a")), node("a-1", "10.0.0.1", zone("a")),
				node("b-1", "10.0.0.3", zone("b")), node("lone", "10.0.0.5", nil)}, Config{Port: 9115, Granularity: GranularityZone},
			[]string{
				`a-1→b-1 ["10.0.0.3"] via 10.0.0.1:9115`, `a-1→lone ["10.0.0.5"] via 10.0.0.1:9115`,
				`b-1→a-1 ["10.0.0.1"] via 10.0.0.3:9115`, `b-1→lone ["10.0.0.5"] via 10.0.0.3:9115`,
				`lone→a-1 ["10.0.0.1"] via 10.0.0.5:9115`, `lone→b-1 ["10.0.0.3"] via 10.0.0.5:9115`,
			}},
		{"zone: the labelled representatives when any node is labelled",
			[]*corev1.Node{node("a-1", "10.0.0.1", zone("a")), node("a-2", "10.0.0.2", zone("a", DefaultRepresentativeLabel, "true")),
				node("b-1", "10.0.0.3", zone("b")), node("b-2", "10.0.0.4", zone("b", DefaultRepresentativeLabel, "true")), node("lone", "10.0.0.5", nil)},
			Config{Port: 9115, Granularity: GranularityZone},
			[]string{`a-2→b-2 ["10.0.0.4"] via 10.0.0.2:9115`, `b-2→a-2 ["10.0.0.2"] via 10.0.0.4:9115`}},
		{"auto within MaxNodePairs: every node", []*corev1.Node{node("a-1", "10.0.0.1", zone("a")), node("a-2", "10.0.0.2", zone("a"))},
			Config{Port: 9115, Granularity: GranularityAuto, MaxNodePairs: 2},
			[]string{`a-1→a-2 ["10.0.0.2"] via 10.0.0.1:9115`, `a-2→a-1 ["10.0.0.1"] via 10.0.0.2:9115`}},
		{"auto beyond MaxNodePairs: per zone", []*corev1.Node{node("a-1", "10.0.0.1", zone("a")), node("a-2", "10.0.0.2", zone("a")), node("b-1", "10.0.0.3", zone("b"))},
			Config{Port: 9115, Granularity: GranularityAuto, MaxNodePairs: 2},
			[]string{`a-1→b-1 ["10.0.0.3"] via 10.0.0.1:9115`, `b-1→a-1 ["10.0.0.1"] via 10.0.0.3:9115`}},
		{"a node the selector leaves out (no exporter there) neither probes nor is probed, nor represents its zone",
			[]*corev1.Node{node("cp-1", "10.0.0.9", zone("a", "node-role.kubernetes.io/control-plane", "")), node("a-1", "10.0.0.1", zone("a")),
				node("b-1", "10.0.0.3", zone("b"))},
			Config{Port: 9115, Granularity: GranularityZone, Nodes: notControlPlane(t)},
			[]string{`a-1→b-1 ["10.0.0.3"] via 10.0.0.1:9115`, `b-1→a-1 ["10.0.0.1"] via 10.0.0.3:9115`}},
		{"auto counts only the selected nodes", []*corev1.Node{node("a-1", "10.0.0.1", zone("a")), node("a-2", "10.0.0.2", zone("a")),
			node("cp-1", "10.0.0.9", map[string]string{"node-role.kubernetes.io/control-plane": ""})},
			Config{Port: 9115, Granularity: GranularityAuto, MaxNodePairs: 2, Nodes: notControlPlane(t)},
			[]string{`a-1→a-2 ["10.0.0.2"] via 10.0.0.1:9115`, `a-2→a-1 ["10.0.0.1"] via 10.0.0.2:9115`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, pairs(TargetGroups(tc.nodes, tc.cfg))); diff != "" {
				t.Errorf("probes (-want +got):\n%s", diff)
			}
		})
	}
}

// The handler answers the JSON Prometheus' http_sd reads: a list (never null) of groups with
// targets and labels, as application/json.
func TestHandler(t *testing.T) {
	var nodes []*corev1.Node
	srv := httptest.NewServer(Handler(func() []*corev1.Node { return nodes }, Config{Port: 9115}))
	defer srv.Close()
	get := func() (string, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + Path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET: %s %s", resp.Status, b)
		}
		return resp.Header.Get("Content-Type"), string(b)
	}
	if ct, body := get(); ct != "application/json" || body != "[]" {
		t.Errorf("no nodes: %s %q, want application/json []", ct, body)
	}
	nodes = []*corev1.Node{node("a", "10.0.0.1", nil), node("b", "10.0.0.2", nil)}
	_, body := get()
	want := `[{"targets":["10.0.0.2"],"labels":{"__tmp_exporter":"10.0.0.1:9115","source_node":"a","target_node":"b"}},` +
		`{"targets":["10.0.0.1"],"labels":{"__tmp_exporter":"10.0.0.2:9115","source_node":"b","target_node":"a"}}]`
	if body != want {
		t.Errorf("answer\n%s\nwant\n%s", body, want)
	}
	resp, err := http.Post(srv.URL+Path, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %s", resp.Status)
	}
}

// BenchmarkHandler: one answer for 100 nodes (9,900 pairs), as Prometheus asks for it.
func BenchmarkHandler(b *testing.B) {
	var nodes []*corev1.Node
	for i := range 100 {
		nodes = append(nodes, node(fmt.Sprintf("node-%03d", i), fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), nil))
	}
	h := Handler(func() []*corev1.Node { return nodes }, Config{Port: 9115})
	req := httptest.NewRequest(http.MethodGet, Path, nil)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		b.SetBytes(int64(rec.Body.Len()))
	}
}
