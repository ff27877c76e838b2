// Package ui_test drives edgeflow's web view in a real headless Chromium (chromedp): the real
// `edgeflow serve` binary on the demo topology (examples/bookinfo.yaml), a real grpc-go xDS
// client, and the page as a browser renders it. It is a module of its own so that chromedp
// stays out of the product's go.mod.
package ui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/edgeflow/edgeflow/examples"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/internal/testkit/xdsclient"
	"github.com/edgeflow/edgeflow/optimizer"
)

var screenshot = flag.String("screenshot", filepath.Join("..", "..", "docs", "webview.png"), "where to write the page's screenshot (empty: nowhere)")

// updateWithin is how soon the page must show a changed topology file.
const updateWithin = 2 * time.Second

// chromiumPath finds Debian's chromium; without it the test skips, except under CI=true.
func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH (apt-get install chromium); CI must run this test")
	}
	t.Skip("no chromium on PATH (apt-get install chromium)")
	return ""
}

// demoTopology is the bundled Bookinfo topology with an address for every pod (serve needs one
// for each called pod; nothing dials them here).
func demoTopology(t *testing.T) *optimizer.Topology {
	top, err := optimizer.ParseTopology(bytes.NewReader(examples.Bookinfo()), "bookinfo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	port := 20000
	for i := range top.Services {
		for j := range top.Services[i].Pods {
			port++
			top.Services[i].Pods[j].Address = fmt.Sprintf("127.0.0.1:%d", port)
		}
	}
	return top
}

// writeTopology writes t as JSON (YAML's subset) and renames it over path, as an editor does.
func writeTopology(t *testing.T, path string, top *optimizer.Topology) {
	t.Helper()
	b, err := json.MarshalIndent(top, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".tmp", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// TestMain removes the edgeflow binary testkit.Binary built (when EDGEFLOW_BIN is unset).
func TestMain(m *testing.M) {
	code := m.Run()
	testkit.RemoveBuilt()
	os.Exit(code)
}

// startServe starts `edgeflow serve` (testkit.Binary) on the file; it is stopped when the test
// ends.
func startServe(t *testing.T, file string) (uiURL, xdsAddr string) {
	cmd := exec.Command(testkit.Binary(t), "serve", "-f", file, "--xds-address", "127.0.0.1:0", "--ui-address", "127.0.0.1:0",
		"--poll-interval", "50ms", "--debounce-quiet", "10ms")
	var stderr testkit.LogBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("edgeflow serve did not stop on SIGINT")
		}
		if t.Failed() {
			t.Logf("edgeflow serve's log:\n%s", stderr.String())
		}
	})
	re := regexp.MustCompile(`xDS on (\S+), .*\n(?s:.*)web view on (http://\S+)/\n`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			return m[2], m[1]
		}
		select {
		case err := <-exited:
			t.Fatalf("edgeflow serve exited: %v\n%s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("edgeflow serve printed no web view address:\n%s", stderr.String())
		}
	}
}

// pageState is what the page shows, read from its DOM.
type pageState struct {
	Publication string              `json:"publication"`
	Nodes       []string            `json:"nodes"`       // node boxes in the graph
	PodNode     map[string]string   `json:"pod_node"`    // pod → the node box it is drawn in
	Edges       []string            `json:"edges"`       // call edge rows of the table
	Routes      map[string][]string `json:"routes"`      // call edge → "caller→callee" route paths drawn
	Latency     map[string]string   `json:"latency"`     // "from→to" → the latency cell's text
	Cost        string              `json:"cost"`        // the cost card's text
	Answers     string              `json:"answers"`     // the push card's answer line
	Degraded    string              `json:"degraded"`    // the degraded-inputs card's text
	Status      string              `json:"status"`      // the connection badge
	Width       []float64           `json:"route_width"` // stroke widths of the route paths
}

const readPage = `(() => {
  const s = {publication: document.body.dataset.publication || "", nodes: [], pod_node: {}, edges: [], routes: {}, latency: {}, route_width: []};
  for (const g of document.querySelectorAll("#graph g[data-node]")) s.nodes.push(g.dataset.node);
  for (const g of document.querySelectorAll("#graph g[data-pod]")) s.pod_node[g.dataset.pod] = g.dataset.podNode;
  for (const tr of document.querySelectorAll("#edges tr[data-edge]")) s.edges.push(tr.dataset.edge);
  for (const p of document.querySelectorAll("#graph path[data-edge]")) {
    (s.routes[p.dataset.edge] = s.routes[p.dataset.edge] || []).push(p.dataset.caller + "→" + p.dataset.callee);
    s.route_width.push(parseFloat(p.getAttribute("stroke-width")));
  }
  for (const td of document.querySelectorAll("#latency td[data-from]")) s.latency[td.dataset.from + "→" + td.dataset.to] = td.textContent;
  s.cost = document.getElementById("cost-body").textContent;
  const a = document.getElementById("push-answers"); s.answers = a ? a.textContent : "";
  s.degraded = document.getElementById("degraded-body").textContent;
  s.status = document.getElementById("status").textContent;
  return JSON.stringify(s);
})()`

func read(ctx context.Context) (*pageState, error) {
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](readPage))
	if err != nil {
		return nil, err
	}
	var s pageState
	return &s, json.Unmarshal([]byte(raw), &s)
}

// waitPage polls the DOM until cond holds or within passes; it returns the last state read.
func waitPage(ctx context.Context, within time.Duration, cond func(*pageState) bool) (*pageState, error) {
	deadline := time.Now().Add(within)
	for {
		s, err := read(ctx)
		if err == nil && cond(s) {
			return s, nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("condition not met")
			}
			return s, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWebViewInChromium(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	file := filepath.Join(t.TempDir(), "bookinfo.yaml")
	top := demoTopology(t)
	writeTopology(t, file, top)
	uiURL, xdsAddr := startServe(t, file)

	// A real grpc-go xDS client (node productpage-0), so the page has a stream and answers.
	cc := xdsclient.Dial(t, xdsAddr, xdsclient.Node{ID: "productpage-0"}, "reviews")
	cc.Connect()

	// Chromium runs as root in CI, hence --no-sandbox; the page needs no network but loopback.
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]), chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1400, 1000), chromedp.Flag("hide-scrollbars", true))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel() // closes the browser

	if err := chromedp.Do(bctx, chromedp.Navigate(uiURL+"/")); err != nil {
		t.Fatalf("loading %s: %v", uiURL, err)
	}
	wantEdges := []string{"productpage→details", "productpage→reviews", "reviews→ratings"}
	s, err := waitPage(bctx, 20*time.Second, func(s *pageState) bool {
		return s.Publication == "1" && len(s.Nodes) == 4 && len(s.Edges) == 3 && s.Answers != "" &&
			!strings.Contains(s.Answers, "no xDS client") && !strings.Contains(s.Answers, "waiting")
	})
	if err != nil {
		t.Fatalf("the page never showed publication 1 with the client's stream: %v\n%+v", err, s)
	}
	if s.Status != "live" {
		t.Errorf("connection badge %q, want live", s.Status)
	}
	if !slices.Equal(s.Nodes, []string{"n1", "n2", "n3", "n4"}) {
		t.Errorf("nodes %v, want the demo topology's n1…n4", s.Nodes)
	}
	if !slices.Equal(s.Edges, wantEdges) {
		t.Errorf("call edges %v, want %v", s.Edges, wantEdges)
	}
	for _, sv := range top.Services {
		for _, p := range sv.Pods {
			if s.PodNode[p.Name] != p.Node {
				t.Errorf("pod %s drawn in node %q, want %s", p.Name, s.PodNode[p.Name], p.Node)
			}
		}
	}
	// Every caller pod of every edge has a route drawn, and widths differ with the shares.
	for _, e := range wantEdges {
		from := strings.Split(e, "→")[0]
		callers := map[string]bool{}
		for _, r := range s.Routes[e] {
			callers[strings.Split(r, "→")[0]] = true
		}
		for _, sv := range top.Services {
			if sv.Name != from {
				continue
			}
			for _, p := range sv.Pods {
				if !callers[p.Name] {
					t.Errorf("edge %s: no route drawn from %s (drawn: %v)", e, p.Name, s.Routes[e])
				}
			}
		}
	}
	if w := slices.Clone(s.Width); len(w) == 0 || slices.Min(w) == slices.Max(w) {
		t.Errorf("route widths %v: want them to follow the shares (lata splits some callers)", w)
	}
	if s.Latency["n1→n4"] != "12" || s.Latency["n3→n4"] != "4" {
		t.Errorf("latency cells n1→n4 %q, n3→n4 %q; want the file's 12 and 4", s.Latency["n1→n4"], s.Latency["n3→n4"])
	}
	if !strings.Contains(s.Cost, "round-robin") || !strings.Contains(s.Cost, "less latency than round-robin") {
		t.Errorf("cost card %q: want the plan against round-robin's", s.Cost)
	}
	if !strings.Contains(s.Degraded, "none") {
		t.Errorf("degraded inputs %q, want none", s.Degraded)
	}
	t.Logf("page: publication %s, %d nodes, %d edges, cost card %q, push %q", s.Publication, len(s.Nodes), len(s.Edges), s.Cost, s.Answers)

	if *screenshot != "" {
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		if err := os.WriteFile(*screenshot, png, 0o644); err != nil {
			t.Fatalf("writing the screenshot: %v", err)
		}
		t.Logf("screenshot of the demo topology: %s (%d bytes)", *screenshot, len(png))
	}

	// The topology changes: a fifth node, and details-0 moves there. The page follows within 2 s.
	changed := demoTopology(t)
	changed.Nodes = append(changed.Nodes, optimizer.Node{Name: "n5", CPU: 4000, Memory: 8192, Locality: "edge/zone-3/n5"})
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		changed.Latency = append(changed.Latency, optimizer.Latency{From: n, To: "n5", MS: 20})
	}
	for i := range changed.Services {
		for j := range changed.Services[i].Pods {
			if changed.Services[i].Pods[j].Name == "details-0" {
				changed.Services[i].Pods[j].Node = "n5"
			}
		}
	}
	start := time.Now()
	writeTopology(t, file, changed)
	s, err = waitPage(bctx, updateWithin, func(s *pageState) bool {
		return s.Publication == "2" && slices.Contains(s.Nodes, "n5") && s.PodNode["details-0"] == "n5"
	})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("the page did not show the changed topology within %v: %v\n%+v", updateWithin, err, s)
	}
	if s.Latency["n1→n5"] != "20" {
		t.Errorf("latency n1→n5 %q, want 20", s.Latency["n1→n5"])
	}
	t.Logf("the page showed the changed topology %v after the file was renamed", took.Round(time.Millisecond))
	// The change was pushed to the client (productpage-0 calls details), and it answered.
	s, err = waitPage(bctx, 10*time.Second, func(s *pageState) bool { return strings.HasPrefix(s.Answers, "answered") })
	if err != nil {
		t.Errorf("the page never showed publication 2 answered by the client: %v\n%+v", err, s)
	}
	t.Logf("push of publication 2: %q", s.Answers)

	// Latency per zone (latency_granularity: zone): the table's rows and columns are the zones,
	// not the nodes (at 5,000 nodes a node table would be 25 M cells).
	zoned := changed.Clone()
	zoned.LatencyGranularity = optimizer.LatencyPerZone
	zoned.Latency = nil
	var zones []string
	for _, n := range zoned.Nodes {
		if z := optimizer.ZoneOf(n); !slices.Contains(zones, z) {
			zones = append(zones, z)
		}
	}
	for i, a := range zones {
		for _, b := range zones[i+1:] {
			zoned.Latency = append(zoned.Latency, optimizer.Latency{From: a, To: b, MS: 7})
		}
	}
	writeTopology(t, file, zoned)
	s, err = waitPage(bctx, updateWithin, func(s *pageState) bool { return s.Publication == "3" })
	if err != nil {
		t.Fatalf("the page did not show the per-zone topology within %v: %v\n%+v", updateWithin, err, s)
	}
	if len(zones) < 2 {
		t.Fatalf("the demo topology has %d zones, want several: %v", len(zones), zones)
	}
	if got := s.Latency[zones[0]+"→"+zones[1]]; got != "7" {
		t.Errorf("per zone: latency cell %s→%s %q, want 7; cells %v", zones[0], zones[1], got, s.Latency)
	}
	if len(s.Latency) != len(zones)*len(zones) {
		t.Errorf("per zone: %d latency cells, want %d zones² (%v); cells %v", len(s.Latency), len(zones)*len(zones), zones, s.Latency)
	}
}
