package alloc_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine (a simulated
// device's stream worker, say) outlives them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
