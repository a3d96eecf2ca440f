//go:build unix && !linux

package main

import "syscall"

// setDeathSignal: no death signal here; a COMMAND whose vram is killed
// with SIGKILL outlives it.
func setDeathSignal(*syscall.SysProcAttr) {}
