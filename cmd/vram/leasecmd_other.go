//go:build !unix

package main

import (
	"os"
	"os/exec"
)

// sigTerm: no SIGTERM here; the command is killed.
var sigTerm = os.Kill

// forwardedSignals: only an interrupt, where there are no Unix signals.
func forwardedSignals(terminal bool) []os.Signal {
	if terminal {
		return nil
	}
	return []os.Signal{os.Interrupt}
}

// prepareCommand: no death signal and no process groups here.
func prepareCommand(*exec.Cmd, bool) {}

func signalCommand(p *os.Process, sig os.Signal, _ bool) error { return p.Signal(sig) }

func exitStatus(ee *exec.ExitError) int { return ee.ExitCode() }
