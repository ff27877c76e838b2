package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// Children lists this process's child processes still running (pid and command), so a test's
// TestMain can check that every server it started was stopped and reaped.
func Children() []string {
	var out []string
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	self := strconv.Itoa(os.Getpid())
	for _, f := range stats {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may contain spaces, so split after the last ')'.
		s := string(data)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		if fields := strings.Fields(s[i+1:]); len(fields) > 1 && fields[1] == self {
			out = append(out, strings.TrimSpace(s[:i+1]))
		}
	}
	return out
}

// VerifyMain is a TestMain for packages that start processes and goroutines: it runs the
// tests, then fails the run if a child process is still running or (goleak) a goroutine is
// left, and exits with the result.
func VerifyMain(m *testing.M, pkg string) {
	code := m.Run()
	if code == 0 {
		if kids := Children(); len(kids) > 0 {
			fmt.Fprintf(os.Stderr, "%s: processes left running: %s\n", pkg, strings.Join(kids, ", "))
			code = 1
		}
	}
	if code == 0 {
		goleak.VerifyTestMain(exited(code))
		return
	}
	os.Exit(code)
}

// exited is a goleak.TestingM whose tests already ran.
type exited int

func (e exited) Run() int { return int(e) }
