//go:build unix

package userfile

import (
	"errors"
	"os"
	"syscall"
)

// noFollow makes an open refuse a symbolic link.
const noFollow = syscall.O_NOFOLLOW

// tryLock takes f's exclusive flock without waiting: locked is false when
// another open file holds it; err is set where the file system has no
// locks.
func tryLock(f *os.File) (locked bool, err error) {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			return false, nil
		}
		return false, err
	}
}
