//go:build !unix

package userfile

import (
	"errors"
	"os"
)

// noFollow: no flag for it here.
const noFollow = 0

// tryLock: no flock here, so partials are not locked, and not removed by
// another Create.
func tryLock(f *os.File) (locked bool, err error) {
	return false, errors.New("no file locks on this system")
}
