package install

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/internal/testkit"
)

// TestMain runs the tests, removes the edgeflow binary testkit.Binary built, and fails the run
// if a process or goroutine a test started is still running (testbed.VerifyMain's checks: it
// exits before RemoveBuilt could run).
func TestMain(m *testing.M) {
	code := m.Run()
	testkit.RemoveBuilt()
	if kids := testbed.Children(); code == 0 && len(kids) > 0 {
		fmt.Fprintf(os.Stderr, "install: processes left running: %s\n", strings.Join(kids, ", "))
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "install: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
