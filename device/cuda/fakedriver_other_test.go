//go:build !linux

package cuda

import "testing"

func fakeRegressions(t *testing.T) { t.Skip("the fake driver is a Linux shared library") }

func fakeRules(t *testing.T) { t.Skip("the fake driver is a Linux shared library") }

func noCallOutsideTheContext(t *testing.T) { t.Skip("the fake driver is a Linux shared library") }
