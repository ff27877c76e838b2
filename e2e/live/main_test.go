package live

import (
	"testing"

	"github.com/edgeflow/edgeflow/e2e/testbed"
)

// Every goroutine a test starts (informers, xDS streams, clients, servers) ends with it, and
// every process (etcd, kube-apiserver, Prometheus, exporters, nqdelay) is stopped and reaped.
func TestMain(m *testing.M) { testbed.VerifyMain(m, "live") }
