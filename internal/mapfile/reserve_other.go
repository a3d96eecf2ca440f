//go:build !linux

package mapfile

import "os"

// Reserve gives the file f the disk blocks of its first n
// bytes now, by writing them, so that writing them through the mapping
// never finds the disk full: a full disk is an error here, not a SIGBUS
// later.
func Reserve(f *os.File, n int64) error { return writeZeros(f, n) }
