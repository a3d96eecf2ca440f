package main

import "syscall"

// setDeathSignal has the kernel kill the command when vram's thread that
// started it ends (with vram: leaselife.go keeps the thread).
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
