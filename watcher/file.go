package watcher

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/internal/latest"
	"github.com/edgeflow/edgeflow/optimizer"
)

// DefaultPollInterval is how often File re-reads its file when FileConfig.Interval is zero.
const DefaultPollInterval = time.Second

// FileConfig configures a File source.
type FileConfig struct {
	// Options are how the topology is compiled for validation (as the consumer will compile it).
	Options optimizer.Options
	// Check is validation beyond optimizer.Compile, e.g. the xDS server's "complete topology"
	// rule (xds.CheckTopology). nil means none.
	Check func(*optimizer.Topology) error
	// Interval is the poll interval (zero means DefaultPollInterval).
	Interval time.Duration
	// Logger receives reload errors (nil means slog.Default()).
	Logger *slog.Logger
	// Registerer receives the source's metrics (nil means they are not registered).
	Registerer prometheus.Registerer
}

// File is a topology source that follows a YAML or JSON topology file.
//
// Rules: the file is read, parsed and validated (optimizer.Compile with FileConfig.Options,
// then FileConfig.Check) before a topology is delivered. Run fails if the first read fails.
// After that, the file is polled by content hash every Interval, and re-read on Reload;
// a changed file that does not validate (or cannot be read) is logged with the error naming
// the offending item, counted in edgeflow_watcher_topology_errors_total, and the last good
// topology stays delivered: nothing is sent to the Listener until a good version appears.
// The same bad content is reported once, not on every poll. Editors that write in place may
// expose a half-written file to one poll; that is a rejected reload, fixed by the next poll.
type File struct {
	path   string
	cfg    FileConfig
	log    *slog.Logger
	reload latest.Signal // Reload's request to Run

	updates  prometheus.Counter
	errors   prometheus.Counter
	lastGood prometheus.Gauge

	mu      sync.Mutex // guards current
	current *optimizer.Topology
}

// NewFile returns a source for the topology file at path. It reads nothing yet.
func NewFile(path string, cfg FileConfig) (*File, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultPollInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	f := &File{
		path: path,
		cfg:  cfg,
		log:  cfg.Logger,
	}
	if err := f.newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	return f, nil
}

// Load reads and validates the file once, without delivering it.
func (f *File) Load() (*optimizer.Topology, error) {
	data, err := f.read()
	if err != nil {
		return nil, fmt.Errorf("watcher: reading topology: %w", err)
	}
	return f.parse(data)
}

// read reads the file, at most optimizer.MaxTopologyBytes of it: a larger file is an error
// naming it, found without reading (or holding) more than the cap, at every poll.
func (f *File) read() ([]byte, error) {
	fd, err := os.Open(f.path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	tooLarge := func() error {
		return fmt.Errorf("%w: %s: larger than %d bytes", optimizer.ErrInvalidTopology, f.path, optimizer.MaxTopologyBytes)
	}
	if st, err := fd.Stat(); err == nil && st.Mode().IsRegular() && st.Size() > optimizer.MaxTopologyBytes {
		return nil, tooLarge() // refused unread
	}
	data, err := io.ReadAll(io.LimitReader(fd, optimizer.MaxTopologyBytes+1)) // a file growing as it is read
	if err != nil {
		return nil, err
	}
	if len(data) > optimizer.MaxTopologyBytes {
		return nil, tooLarge()
	}
	return data, nil
}

func (f *File) parse(data []byte) (*optimizer.Topology, error) {
	t, _, err := f.compile(data, &optimizer.Compiler{Options: f.cfg.Options})
	return t, err
}

// compile parses and validates data, compiling it with c (Run's compiler: compiled once, the
// model published for the Planners downstream when it is delivered).
func (f *File) compile(data []byte, c *optimizer.Compiler) (*optimizer.Topology, *optimizer.Compiled, error) {
	t, err := optimizer.ParseTopology(bytes.NewReader(data), f.path)
	if err != nil {
		return nil, nil, err
	}
	cm, err := c.Compile(t)
	if err != nil {
		return nil, nil, err
	}
	if f.cfg.Check != nil {
		if err := f.cfg.Check(t); err != nil {
			return nil, nil, err
		}
	}
	return t, cm, nil
}

// Current returns the last topology delivered (nil before the first).
func (f *File) Current() *optimizer.Topology {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.current
}

// Reload asks Run to re-read the file now, even if its content hash is unchanged (the serve
// command calls it on SIGHUP). It never blocks; reloads requested while one is pending merge.
func (f *File) Reload() { f.reload.Notify() }

// Run reads the file, delivers it to l, and follows it until ctx is done (then it returns
// nil). If the first read fails, Run returns that error at once (wrapping
// optimizer.ErrInvalidTopology when the content is invalid). Run may be called once.
func (f *File) Run(ctx context.Context, l Listener) error {
	data, err := f.read()
	if err != nil {
		return fmt.Errorf("watcher: reading topology: %w", err)
	}
	compiler := &optimizer.Compiler{Options: f.cfg.Options}
	t, cm, err := f.compile(data, compiler)
	if err != nil {
		return err
	}
	f.deliver(l, t, cm)
	good := sha256.Sum256(data)
	var bad [sha256.Size]byte // last rejected content, reported once
	var readErr string        // last read error, reported once
	ticker := time.NewTicker(f.cfg.Interval)
	defer ticker.Stop()
	for {
		force := false
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-f.reload.C():
			force = true
		}
		data, err := f.read()
		if err != nil {
			if msg := err.Error(); msg != readErr || force {
				readErr = msg
				f.errors.Inc()
				f.log.Error("watcher: cannot read the topology file; keeping the last good topology", "file", f.path, "error", err)
			}
			continue
		}
		readErr = ""
		sum := sha256.Sum256(data)
		if !force && (sum == good || sum == bad) {
			continue
		}
		t, cm, err := f.compile(data, compiler)
		if err != nil {
			bad = sum
			f.errors.Inc()
			f.log.Error("watcher: topology file rejected; keeping the last good topology", "file", f.path, "error", err)
			continue
		}
		good, bad = sum, [sha256.Size]byte{}
		f.deliver(l, t, cm)
		f.log.Info("watcher: topology file reloaded", "file", f.path, "forced", force)
	}
}

func (f *File) deliver(l Listener, t *optimizer.Topology, cm *optimizer.Compiled) {
	f.mu.Lock()
	f.current = t
	f.mu.Unlock()
	f.updates.Inc()
	f.lastGood.SetToCurrentTime()
	Deliver(l, t, cm)
}
