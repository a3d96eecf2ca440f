//go:build unix

package broker

import "syscall"

// umask sets the process's file mode creation mask, returning the old one.
func umask(m int) int { return syscall.Umask(m) }
