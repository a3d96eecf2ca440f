//go:build !unix

package main

import (
	"os"
	"os/exec"
)

// forwardedSignals: only an interrupt, where there are no Unix signals.
func forwardedSignals(terminal bool) []os.Signal {
	if terminal {
		return nil
	}
	return []os.Signal{os.Interrupt}
}

func exitStatus(ee *exec.ExitError) int { return ee.ExitCode() }
