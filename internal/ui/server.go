package ui

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

//go:embed static
var static embed.FS

// Defaults of Config.
const (
	// DefaultMaxStreams bounds the event streams open at once (browsers watching the page).
	DefaultMaxStreams = 64
	// DefaultKeepAlive is how often an idle event stream gets a comment, so proxies keep it.
	DefaultKeepAlive = 15 * time.Second
	// eventWriteTimeout bounds the write of one event to a slow browser.
	eventWriteTimeout = 10 * time.Second
)

// Config configures a View.
type Config struct {
	// MaxStreams bounds the event streams open at once; more get 503 (0: DefaultMaxStreams).
	MaxStreams int
	// KeepAlive is the idle interval between keep-alive comments (0: DefaultKeepAlive).
	KeepAlive time.Duration
}

// View serves the web view and holds the last Snapshot. Its methods are safe for concurrent
// use; it starts no goroutine (each event stream runs in its HTTP request's goroutine and ends
// with the request's context, i.e. when the browser leaves or the HTTP server shuts down).
type View struct {
	cfg     Config
	streams chan struct{} // a token per open event stream

	mu      sync.Mutex
	current []byte        // the last snapshot, as JSON
	changed chan struct{} // closed and replaced at every Publish
}

// New returns a View showing an empty snapshot until the first Publish.
func New(cfg Config) *View {
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	v := &View{cfg: cfg, streams: make(chan struct{}, cfg.MaxStreams), changed: make(chan struct{})}
	v.current, _ = json.Marshal(&Snapshot{RoundRobinCostMS: -1})
	return v
}

// Publish makes s the snapshot shown, and sends it to every open page.
func (v *View) Publish(s *Snapshot) error {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("ui: encoding snapshot: %w", err)
	}
	v.mu.Lock()
	v.current = b
	close(v.changed)
	v.changed = make(chan struct{})
	v.mu.Unlock()
	return nil
}

func (v *View) latest() ([]byte, <-chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.current, v.changed
}

// Handler serves the page (/), its assets, /snapshot.json (the current snapshot) and /events
// (server-sent events: the current snapshot, then each new one). It answers only GET and HEAD.
func (v *View) Handler() http.Handler {
	assets, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded directory exists at compile time
	}
	files := http.FileServerFS(assets)
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", files)
	mux.Handle("GET /app.js", files)
	mux.Handle("GET /style.css", files)
	mux.HandleFunc("GET /snapshot.json", func(w http.ResponseWriter, _ *http.Request) {
		b, _ := v.latest()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(b)
	})
	mux.HandleFunc("GET /events", v.events)
	return securityHeaders(loopbackHost(mux))
}

// loopbackHost answers only requests whose Host names the loopback: "localhost" or a loopback
// IP, with any port — what a browser sends to the view on its loopback listener, directly or
// through kubectl port-forward or an SSH tunnel. Any other Host is refused with 421, so a page
// of another site whose name an attacker rebinds to 127.0.0.1 (DNS rebinding) cannot read the
// view with the browser's help: the browser sends the attacker's name as Host.
func loopbackHost(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !IsLoopbackHost(r.Host) {
			http.Error(w, fmt.Sprintf("ui: Host %q is not the loopback: open the view as localhost or 127.0.0.1", r.Host), http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// IsLoopbackHost says whether an HTTP Host (HOST or HOST:PORT, an IPv6 literal in brackets)
// names the loopback: "localhost" (any case, with or without a final dot) or a loopback IP.
func IsLoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// securityHeaders forbids anything but the page's own assets, framing and type sniffing.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}

// events streams snapshots as server-sent events until the request ends. Each write gets its
// own deadline, so the HTTP server's write timeout does not cut a long-lived stream.
func (v *View) events(w http.ResponseWriter, r *http.Request) {
	select {
	case v.streams <- struct{}{}:
		defer func() { <-v.streams }()
	default:
		http.Error(w, fmt.Sprintf("ui: %d event streams open already", cap(v.streams)), http.StatusServiceUnavailable)
		return
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	write := func(payload []byte) bool {
		if err := rc.SetWriteDeadline(time.Now().Add(eventWriteTimeout)); err != nil {
			return false
		}
		if _, err := w.Write(payload); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	keepAlive := time.NewTicker(v.cfg.KeepAlive)
	defer keepAlive.Stop()
	ctx := r.Context()
	for {
		b, changed := v.latest()
		if !write(event(b)) {
			return
		}
		if !wait(ctx, changed, keepAlive.C, write) {
			return
		}
	}
}

// wait blocks until the snapshot changes (true) or the request ends (false), sending a
// keep-alive comment at every tick.
func wait(ctx context.Context, changed <-chan struct{}, tick <-chan time.Time, write func([]byte) bool) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-changed:
			return true
		case <-tick:
			if !write([]byte(": keep-alive\n\n")) {
				return false
			}
		}
	}
}

// event frames a JSON document as one server-sent event (JSON has no raw newlines).
func event(b []byte) []byte {
	out := make([]byte, 0, len(b)+8)
	out = append(out, "data: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}
