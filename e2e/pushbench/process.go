package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// server is a server process the harness started: in its own process group (stopped as a
// group), killed by the kernel if the harness dies, its stdout and stderr kept in a log file
// and in memory (for waitLine).
type server struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited and its output is read

	mu     sync.Mutex
	lines  []string
	signal chan struct{} // closed and replaced when a line arrives
}

// startServer starts argv as a server process, logging to logPath.
func startServer(name, logPath string, argv []string) (*server, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	fmt.Fprintf(logFile, "### pushbench %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		r.Close()
		w.Close()
		return nil, fmt.Errorf("pushbench: start %s (%s): %w", name, strings.Join(argv, " "), err)
	}
	w.Close() // the child holds its own copy
	s := &server{name: name, cmd: cmd, log: logPath, done: make(chan struct{}), signal: make(chan struct{})}
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer r.Close()
		defer logFile.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logFile, line)
			s.mu.Lock()
			s.lines = append(s.lines, line)
			close(s.signal)
			s.signal = make(chan struct{})
			s.mu.Unlock()
		}
	}()
	go func() {
		_ = cmd.Wait()
		<-read
		close(s.done)
	}()
	return s, nil
}

func (s *server) pid() int { return s.cmd.Process.Pid }

func (s *server) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// running returns an error naming the server, its exit status and last output lines if it
// has exited.
func (s *server) running() error {
	if !s.exited() {
		return nil
	}
	return fmt.Errorf("pushbench: %s exited (%v); its output ends:\n%s", s.name, s.cmd.ProcessState, s.tail(15))
}

// lineCount is the number of output lines so far: an offset for waitLine.
func (s *server) lineCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.lines)
}

// waitLine waits for an output line at or after offset from that match accepts, and returns
// it. It fails when ctx ends or the process exits first, quoting the output's last lines.
func (s *server) waitLine(ctx context.Context, from int, what string, match func(string) bool) (string, error) {
	for {
		exited := s.exited() // before looking, so a line written just before exiting is seen
		s.mu.Lock()
		for ; from < len(s.lines); from++ {
			if match(s.lines[from]) {
				line := s.lines[from]
				s.mu.Unlock()
				return line, nil
			}
		}
		ch := s.signal
		s.mu.Unlock()
		if exited {
			return "", fmt.Errorf("before %s: %w", what, s.running())
		}
		select {
		case <-ch:
		case <-s.done:
		case <-ctx.Done():
			return "", fmt.Errorf("pushbench: %s: waiting for %s: %w; its output ends:\n%s", s.name, what, ctx.Err(), s.tail(15))
		}
	}
}

// tail is the last n lines of output.
func (s *server) tail(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "  " + strings.Join(s.lines[max(0, len(s.lines)-n):], "\n  ")
}

// stop sends SIGTERM to the process group, and SIGKILL after grace; it waits for the exit.
func (s *server) stop(grace time.Duration) {
	if s.exited() {
		return
	}
	_ = syscall.Kill(-s.pid(), syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(grace):
		_ = syscall.Kill(-s.pid(), syscall.SIGKILL)
		<-s.done
	}
}

// rssBytes is the process's resident set (VmRSS).
func rssBytes(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("pushbench: no VmRSS in /proc/" + strconv.Itoa(pid) + "/status")
}

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuTime is the process's user plus system CPU time, all threads (/proc/PID/stat).
func cpuTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid …: comm may hold spaces, so split after the last ')'.
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("pushbench: short /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// waitQuiet waits until the processes have used at most one clock tick of CPU each over
// quietWindow (they have finished the previous round's work: ACKs, garbage collection), or
// until limit has passed; it reports whether they went quiet. It is not a sleep: it returns as
// soon as the processes are quiet.
func waitQuiet(ctx context.Context, limit time.Duration, pids ...int) bool {
	const quietWindow = 100 * time.Millisecond
	deadline := time.Now().Add(limit)
	last := make([]time.Duration, len(pids))
	for i, p := range pids {
		last[i], _ = cpuTime(p)
	}
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(quietWindow):
		}
		quiet := true
		for i, p := range pids {
			c, err := cpuTime(p)
			if err != nil {
				return false
			}
			if c-last[i] > clockTick {
				quiet = false
			}
			last[i] = c
		}
		if quiet {
			return true
		}
	}
	return false
}

// logFields parses key=value pairs of a log line (slog's text format; values may be quoted).
func logFields(line string) map[string]string {
	out := map[string]string{}
	for _, m := range fieldRE.FindAllStringSubmatch(line, -1) {
		v := m[2]
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		}
		out[m[1]] = v
	}
	return out
}

var fieldRE = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S+)`)
