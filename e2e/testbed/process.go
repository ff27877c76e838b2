package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// pollInterval is how often the testbed looks again at something it waits for.
const pollInterval = 20 * time.Millisecond

// process is a child process of the testbed, with stdout and stderr in a log file.
type process struct {
	name    string // e.g. "nqdelay", "blackbox edge-1"
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when Wait has returned
	waitErr error         // Wait's result, set before done is closed
}

// startLocked starts argv as process name, logging to a file in tb.dir (appending, so a
// restarted process keeps its earlier log). Called with tb.mu held.
func (tb *Testbed) startLocked(name string, argv []string) (*process, error) {
	logPath := filepath.Join(tb.dir, strings.ReplaceAll(name, " ", "-")+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testbed: start %s: %w", name, err)
	}
	defer f.Close() // the child has its own descriptor
	fmt.Fprintf(f, "### testbed %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	// If the test binary dies without its cleanups, the kernel kills the child (`ip netns exec`
	// and chrt exec the program, so the setting reaches it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testbed: start %s (%s): %w", name, strings.Join(argv, " "), err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	tb.procs = append(tb.procs, p)
	return p, nil
}

// exited reports whether the process has exited (and been waited for).
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits for the process to exit; after grace it sends SIGKILL and waits
// again. It returns an error if the process had to be killed or exited with an error status
// (terminated by the SIGTERM is fine). A process that had already exited is not an error.
func (p *process) stop(grace time.Duration) error {
	if p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("testbed: %s (pid %d) ignored SIGTERM for %v and was killed", p.name, p.cmd.Process.Pid, grace)
	}
	var exit *exec.ExitError
	if errors.As(p.waitErr, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	if p.waitErr != nil {
		return fmt.Errorf("testbed: %s (pid %d) after SIGTERM: %w", p.name, p.cmd.Process.Pid, p.waitErr)
	}
	return nil
}

// usage describes the process's exit status and CPU time, once it has exited.
func (p *process) usage() string {
	if !p.exited() {
		return "running"
	}
	st := p.cmd.ProcessState
	return fmt.Sprintf("%v, CPU user %v system %v", st, st.UserTime().Round(time.Millisecond), st.SystemTime().Round(time.Millisecond))
}

// logSize returns the current size of the log, an offset for waitLog.
func (p *process) logSize() int64 {
	fi, err := os.Stat(p.logPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// waitLog waits until a complete line of the log written at or after offset satisfies match.
// It fails when ctx ends or the process exits first, with the log's last lines.
func (p *process) waitLog(ctx context.Context, offset int64, match func(line string) bool) error {
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		exited := p.exited() // before reading, so a line written just before exiting is seen
		if b, err := readFrom(p.logPath, offset); err == nil && lines(b, match) {
			return nil
		}
		if exited {
			return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.name, p.waitErr, p.logPath, p.tail(15))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w; last lines of %s:\n%s", p.name, ctx.Err(), p.logPath, p.tail(15))
		case <-ticker.C:
		}
	}
}

// checkRunning returns an error with the log's tail if the process has exited, nil otherwise.
func (p *process) checkRunning() error {
	if p.exited() {
		return fmt.Errorf("testbed: %s exited (%v); last lines of %s:\n%s", p.name, p.waitErr, p.logPath, p.tail(15))
	}
	return nil
}

func readFrom(path string, offset int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

// tail returns the last n lines of the log.
func (p *process) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}
