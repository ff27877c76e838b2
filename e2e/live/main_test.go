package live

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts (informers, xDS streams, clients, servers) ends with it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
