//go:build unix

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// sigTerm asks a command to end.
var sigTerm os.Signal = syscall.SIGTERM

// forwardedSignals are the signals vram lease passes on to its command.
// On a terminal, Ctrl-C and Ctrl-\ reach the command from the terminal
// itself (it is in the same process group), so passing them on too would
// deliver them twice.
func forwardedSignals(terminal bool) []os.Signal {
	sigs := []os.Signal{syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2}
	if !terminal {
		sigs = append(sigs, os.Interrupt, syscall.SIGQUIT)
	}
	return sigs
}

// prepareCommand makes cmd die with vram where the system can (the
// death signal), and, with group, lead a process group of its own.
func prepareCommand(cmd *exec.Cmd, group bool) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: group}
	setDeathSignal(cmd.SysProcAttr)
}

// signalCommand sends sig to p, or with group to p's process group
// (which p leads).
func signalCommand(p *os.Process, sig os.Signal, group bool) error {
	s, ok := sig.(syscall.Signal)
	if !group || !ok {
		return p.Signal(sig)
	}
	return syscall.Kill(-p.Pid, s)
}

// exitStatus is the command's exit status, 128 + the signal that ended
// it as a shell says.
func exitStatus(ee *exec.ExitError) int {
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}
