package vram

import (
	"testing"

	"go.uber.org/goleak"
)

// closingM runs the tests and then closes the process-wide manager and
// its device, which the library never closes, so that goleak sees only
// real leaks.
type closingM struct{ m *testing.M }

func (c closingM) Run() int {
	code := c.m.Run()
	if defaultMgr != nil {
		dev := defaultMgr.Device()
		_ = defaultMgr.Close()
		_ = dev.Close()
	}
	return code
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(closingM{m}) }
