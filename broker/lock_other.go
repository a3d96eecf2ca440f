//go:build !unix

package broker

import (
	"errors"
	"os"
)

var errLocked = errors.New("locked by another process")

// tryLock: the broker locks devices on Unix systems only.
func tryLock(*os.File) error {
	return errors.New("broker: device locks need a Unix system (flock)")
}
