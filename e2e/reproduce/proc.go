package reproduce

import (
	"bufio"
	"fmt"
	"io"
	"iter"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pickLoopbacks returns n distinct loopback addresses free when picked, for a child process
// to bind (a process cannot be handed a listener): all n are held open until the last is
// picked, so that two picks in a row cannot return one port. Another socket can take a port
// between the pick and the child's bind; the caller starts the child again on new picks when
// its bind fails (bindFailed).
func pickLoopbacks(t testing.TB, n int) []string {
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		out = append(out, l.Addr().String())
	}
	return out
}

// bindFailed says whether a child process's error is its failure to bind a picked port.
func bindFailed(err error) bool {
	return err != nil && strings.Contains(err.Error(), "address already in use")
}

// bindTries is how many times a child is started on new picks before its bind failure fails
// the test.
const bindTries = 3

// proc is a child process of the harness (serve, rebalance) with its log.
type proc struct {
	name, log string
	from      int64 // where this process's lines start in log (earlier ones append to it too)
	cmd       *exec.Cmd
	done      chan struct{}
	ui        string // serve's web view (HOST:PORT), if it has one
	metrics   string // serve's metrics listener (HOST:PORT), if it has one
	stopped   func() // called once the process has stopped, if set
}

func (h *Harness) start(name string, args ...string) *proc {
	logPath := filepath.Join(h.dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		h.t.Fatal(err)
	}
	defer f.Close()
	from, _ := f.Seek(0, io.SeekEnd)
	fmt.Fprintf(f, "### %s %s\n", time.Now().Format(time.RFC3339), strings.Join(args, " "))
	cmd := exec.Command(h.efBin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	p := &proc{name: name, log: logPath, from: from, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	h.t.Cleanup(p.stop)
	return p
}

func (p *proc) stop() {
	stopProcess(p.cmd, p.done, 10*time.Second)
	if p.stopped != nil {
		p.stopped()
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// text is what p wrote to its log.
func (p *proc) text() string {
	b, _ := os.ReadFile(p.log)
	return string(b[min(p.from, int64(len(b))):])
}

// lines returns the lines p wrote to its log that contain any of subs.
func (p *proc) lines(subs ...string) []string {
	var out []string
	for _, line := range strings.Split(p.text(), "\n") {
		for _, sub := range subs {
			if strings.Contains(line, sub) {
				out = append(out, line)
				break
			}
		}
	}
	return out
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	return lastLines(string(b), 15)
}

// goroutines ends p with SIGQUIT, on which a Go program prints every goroutine's stack and
// exits, and returns the stacks that run edgeflow's own code (the rest are the runtime's and
// the libraries' idle ones): what a process that stopped making progress was waiting on.
func (p *proc) goroutines() string {
	if p.exited() {
		return "(it had exited)"
	}
	before := int64(len(p.text())) + p.from
	_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		return "(no stacks within 10 s of SIGQUIT)"
	}
	b, _ := os.ReadFile(p.log)
	var out []string
	for _, g := range strings.Split(string(b[min(before, int64(len(b))):]), "\n\n") {
		if strings.HasPrefix(g, "goroutine ") && strings.Contains(g, "github.com/edgeflow/edgeflow/") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// metricsClient keeps no idle connections: serve and rebalance come and go.
var metricsClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// metrics reads a Prometheus text endpoint: each series by its name and labels as exposed
// (NAME{L="V"}), and each metric name with the sum of its series.
func metrics(addr string) (map[string]float64, error) {
	resp, err := metricsClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		name := line[:i]
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		if j := strings.IndexByte(name, '{'); j >= 0 {
			out[name] = v // one series, by its name and labels
			name = name[:j]
		}
		out[name] += v
	}
	return out, sc.Err()
}

// publications is serve's edgeflow_xds_publications_total read from its metrics at addr, -1 if
// they cannot be read.
func publications(addr string) int {
	m, err := metrics(addr)
	if err != nil {
		return -1
	}
	return int(m["edgeflow_xds_publications_total"])
}

// podCapacities reads serve's capacity estimates from its metrics (as metrics returns them):
// edgeflow_closed_loop_pod_capacity_rps by pod, bound "estimate" and "lower".
func podCapacities(m map[string]float64) (estimate, lower map[string]float64) {
	estimate, lower = map[string]float64{}, map[string]float64{}
	for labels, v := range series(m, "edgeflow_closed_loop_pod_capacity_rps") {
		switch labels["bound"] {
		case "estimate":
			estimate[labels["pod"]] = v
		case "lower":
			lower[labels["pod"]] = v
		}
	}
	return estimate, lower
}

// queueScales reads serve's wait scales in force from its metrics (as metrics returns them):
// edgeflow_closed_loop_queue_scale by service.
func queueScales(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for labels, v := range series(m, "edgeflow_closed_loop_queue_scale") {
		out[labels["service"]] = v
	}
	return out
}

// pooledServices reads the services serve's plan in force pools from its metrics (as metrics
// returns them): edgeflow_xds_service_pooled by service, sorted.
func pooledServices(m map[string]float64) []string {
	out := []string{}
	for labels, v := range series(m, "edgeflow_xds_service_pooled") {
		if v == 1 {
			out = append(out, labels["service"])
		}
	}
	slices.Sort(out)
	return out
}

// series yields the labels and value of each series of the metric name in m (as metrics
// returns them: `name{label="value",…}` keys).
func series(m map[string]float64, name string) iter.Seq2[map[string]string, float64] {
	return func(yield func(map[string]string, float64) bool) {
		for k, v := range m {
			rest, ok := strings.CutPrefix(k, name+"{")
			if !ok {
				continue
			}
			labels := map[string]string{}
			for _, kv := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
				label, val, _ := strings.Cut(kv, "=")
				labels[label], _ = strconv.Unquote(val)
			}
			if !yield(labels, v) {
				return
			}
		}
	}
}
