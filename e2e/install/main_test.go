package install

import (
	"os"
	"testing"
)

func makeTempDir() (string, error) { return os.MkdirTemp("", "edgeflow-install-") }

// TestMain removes the edgeflow binary built for the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}
