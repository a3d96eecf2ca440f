package userfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// ErrTooLarge: ReadBounded's file is larger than its bound.
var ErrTooLarge = errors.New("file too large")

// Open opens path (flag as for os.OpenFile, without O_CREATE) and
// refuses it unless it is a regular file. It opens without blocking, so
// that a FIFO is refused at once instead of waiting for a writer, and
// checks the file it opened, not the name, so a file swapped in between
// is checked too. Errors wrap ErrNotRegular or the os error.
func Open(path string, flag int) (*os.File, error) {
	f, err := os.OpenFile(path, flag|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	if !st.Mode().IsRegular() {
		return nil, errors.Join(fmt.Errorf("open %s: it is a %s: %w", path, kind(st.Mode()), ErrNotRegular), f.Close())
	}
	// O_NONBLOCK does nothing to a regular file's reads and writes.
	return f, nil
}

// ReadBounded reads the regular file path whole, refusing one of more
// than max bytes with an error wrapping ErrTooLarge: it never holds more
// than max+1 bytes of it.
func ReadBounded(path string, max int64) ([]byte, error) {
	f, err := Open(path, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("read %s: more than %d bytes: %w", path, max, ErrTooLarge)
	}
	return b, nil
}
