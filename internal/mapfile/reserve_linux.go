package mapfile

import (
	"errors"
	"os"
	"syscall"
)

// Reserve gives the file f the disk blocks of its first n
// bytes now (fallocate), so that writing them through the mapping never
// finds the disk full: a full disk is an error here, not a SIGBUS later.
// A file system without fallocate gets the blocks written instead.
func Reserve(f *os.File, n int64) error {
	for {
		err := syscall.Fallocate(int(f.Fd()), 0, 0, n)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.ENOSYS):
			return writeZeros(f, n)
		}
		return err
	}
}
