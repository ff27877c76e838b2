package ui

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// readEvent reads one server-sent event's data, skipping keep-alive comments.
func readEvent(t *testing.T, r *bufio.Reader) *Snapshot {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the event stream: %v", err)
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var s Snapshot
			if err := json.Unmarshal([]byte(data), &s); err != nil {
				t.Fatalf("event %q: %v", data, err)
			}
			return &s
		}
	}
}

func TestEventsStreamEachPublication(t *testing.T) {
	t.Parallel()
	v := New(Config{KeepAlive: 20 * time.Millisecond})
	srv := httptest.NewServer(v.Handler())
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q, want text/event-stream", ct)
	}
	r := bufio.NewReader(resp.Body)
	if s := readEvent(t, r); s.Publication != 0 || s.RoundRobinCostMS != -1 {
		t.Fatalf("first event before any Publish: %+v, want the empty snapshot", s)
	}
	for n := uint64(1); n <= 3; n++ {
		want := &Snapshot{Publication: n, Policy: "lata", Nodes: []Node{{Name: "n1", Pods: []Pod{{Name: "a-0", Service: "a"}}}},
			Edges: []Edge{{From: "a", To: "b", Routes: []Route{{Caller: "a-0", Callee: "b-0", Fraction: 1}}}}}
		if err := v.Publish(want); err != nil {
			t.Fatal(err)
		}
		got := readEvent(t, r)
		if got.Publication != n || len(got.Nodes) != 1 || got.Edges[0].Routes[0].Callee != "b-0" {
			t.Fatalf("event after publication %d: %+v", n, got)
		}
	}
}

func TestReadOnlyAndSelfContained(t *testing.T) {
	t.Parallel()
	v := New(Config{})
	srv := httptest.NewServer(v.Handler())
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/", 200}, {"GET", "/app.js", 200}, {"GET", "/style.css", 200}, {"GET", "/snapshot.json", 200},
		{"POST", "/", 405}, {"PUT", "/snapshot.json", 405}, {"DELETE", "/events", 405}, {"GET", "/index.html", 404}, {"GET", "/static/app.js", 404},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code && !(tc.path == "/index.html" && resp.StatusCode == 301) {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.code)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("%s %s: Content-Security-Policy %q", tc.method, tc.path, csp)
		}
	}
	// No asset names another origin: the page must work without internet.
	for _, name := range []string{"static/index.html", "static/app.js", "static/style.css"} {
		b, err := static.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"http://", "https://", "//cdn", "@import"} {
			if strings.Contains(strings.ReplaceAll(string(b), "http://www.w3.org/2000/svg", ""), bad) {
				t.Errorf("%s contains %q: an external asset", name, bad)
			}
		}
	}
}

func TestEventStreamsBounded(t *testing.T) {
	t.Parallel()
	v := New(Config{MaxStreams: 2})
	srv := httptest.NewServer(v.Handler())
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := func() *http.Response {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/events", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	a, b := open(), open()
	defer a.Body.Close()
	defer b.Body.Close()
	readEvent(t, bufio.NewReader(a.Body))
	readEvent(t, bufio.NewReader(b.Body))
	c := open()
	c.Body.Close()
	if c.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("third stream with MaxStreams 2: %d, want 503", c.StatusCode)
	}
}

// TestEventStreamOutlivesWriteTimeout: the HTTP server's write timeout bounds a page, not an
// event stream, which sets a deadline per event.
func TestEventStreamOutlivesWriteTimeout(t *testing.T) {
	t.Parallel()
	v := New(Config{KeepAlive: 50 * time.Millisecond})
	srv := httptest.NewUnstartedServer(v.Handler())
	srv.Config.WriteTimeout = 200 * time.Millisecond
	srv.Start()
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	readEvent(t, r)
	time.Sleep(800 * time.Millisecond) // four write timeouts
	if err := v.Publish(&Snapshot{Publication: 7}); err != nil {
		t.Fatal(err)
	}
	if s := readEvent(t, r); s.Publication != 7 {
		t.Fatalf("after 4 write timeouts: publication %d, want 7", s.Publication)
	}
}

// TestOnlyLoopbackHosts: a page of another site whose name an attacker rebinds to 127.0.0.1
// (DNS rebinding) makes the browser send that name as Host; the view answers only loopback
// names, so such a page reads nothing, while localhost, 127.0.0.1 and [::1] (a browser on the
// machine, kubectl port-forward, an SSH tunnel) still work.
func TestOnlyLoopbackHosts(t *testing.T) {
	t.Parallel()
	v := New(Config{})
	srv := httptest.NewServer(v.Handler())
	defer srv.Close()
	for _, tc := range []struct {
		host string
		code int
	}{
		{"localhost:8080", 200}, {"LOCALHOST", 200}, {"localhost.:8080", 200}, {"127.0.0.1:8080", 200}, {"127.3.4.5", 200},
		{"[::1]:8080", 200}, {"::1", 200}, {"[::ffff:127.0.0.1]:80", 200},
		{"attacker.example:8080", 421}, {"attacker.example", 421}, {"localhost.attacker.example", 421},
		{"10.0.0.1:8080", 421}, {"0.0.0.0:8080", 421},
	} {
		for _, path := range []string{"/", "/snapshot.json", "/events"} {
			req, _ := http.NewRequest("GET", srv.URL+path, nil)
			req.Host = tc.host
			if path == "/events" && tc.code == 200 {
				continue // a stream that stays open; the refused case is what matters here
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.code {
				t.Errorf("GET %s with Host %q: %d, want %d", path, tc.host, resp.StatusCode, tc.code)
			}
		}
	}
}
