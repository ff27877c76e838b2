package install

import (
	"testing"

	"github.com/edgeflow/edgeflow/e2e/testbed"
)

// TestMain fails the run if a process or goroutine a test started is still running.
func TestMain(m *testing.M) { testbed.VerifyMain(m, "install") }
