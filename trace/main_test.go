package trace_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a replay device's stream workers
// outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
