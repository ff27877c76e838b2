package live

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/edgeflow/edgeflow/e2e/testbed"
	"go.uber.org/goleak"
)

// Every goroutine a test starts (informers, xDS streams, clients, servers) ends with it, and
// every process (etcd, kube-apiserver, Prometheus, exporters, nqdelay) is stopped and reaped.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if kids := testbed.Children(); len(kids) > 0 {
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
