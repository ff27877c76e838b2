package live

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts (informers, xDS streams, clients, servers) ends with it, and
// every process (etcd, kube-apiserver, Prometheus, exporters, nqdelay) is stopped and reaped.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if kids := children(); len(kids) > 0 {
			fmt.Fprintf(os.Stderr, "live: processes left running: %s\n", strings.Join(kids, ", "))
			code = 1
		}
	}
	if code == 0 {
		goleak.VerifyTestMain(exited(code))
		return
	}
	os.Exit(code)
}

type exited int

func (e exited) Run() int { return int(e) }

// children lists this process's child processes (pid and command).
func children() []string {
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
		fields := strings.Fields(s[i+1:])
		if len(fields) > 1 && fields[1] == self {
			out = append(out, strings.TrimSpace(s[:i+1]))
		}
	}
	return out
}
