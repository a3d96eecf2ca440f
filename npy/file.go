package npy

import (
	"errors"
	"fmt"
	"os"

	"github.com/vramkit/vram/internal/userfile"
)

// File is an open .npy file whose data is read and written at offsets
// from its first data byte. Safe for concurrent ReadAt and WriteAt.
type File struct {
	f        *os.File
	h        Header
	off      int64 // the data's offset in the file
	nbytes   int64 // the data's size
	borrowed bool  // f is the caller's (CreateIn): Close leaves it open
}

// Create makes (or truncates) the .npy file path for an array described
// by h, writes its header and sets the file to its full size, so that the
// data can be written in any order with WriteAt (unwritten bytes read as
// zeros). perm is as for os.OpenFile (0o644 is usual).
func Create(path string, h Header, perm os.FileMode) (*File, error) {
	hdr, err := h.Encode()
	if err != nil {
		return nil, fmt.Errorf("npy: create %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return nil, fmt.Errorf("npy: create: %w", err)
	}
	nf, err := initFile(f, h, hdr)
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return nf, nil
}

// CreateIn is Create on a file the caller opened for writing (the
// temporary file a new content is written to before it is renamed into
// place, say): it writes h's header at the start of f and sets f to its
// full size. f stays the caller's: the File's Close does not close it.
func CreateIn(f *os.File, h Header) (*File, error) {
	hdr, err := h.Encode()
	if err != nil {
		return nil, fmt.Errorf("npy: create %s: %w", f.Name(), err)
	}
	nf, err := initFile(f, h, hdr)
	if err != nil {
		return nil, err
	}
	nf.borrowed = true
	return nf, nil
}

// initFile writes hdr, h's encoding, at the start of f and sizes f.
func initFile(f *os.File, h Header, hdr []byte) (*File, error) {
	n, _ := h.DataBytes()
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return nil, fmt.Errorf("npy: write the header of %s: %w", f.Name(), err)
	}
	if err := f.Truncate(int64(len(hdr)) + n); err != nil {
		return nil, fmt.Errorf("npy: size %s to %d bytes: %w", f.Name(), int64(len(hdr))+n, err)
	}
	return &File{f: f, h: h, off: int64(len(hdr)), nbytes: n}, nil
}

// Open opens an existing .npy file for reading. It must be a regular
// file (errors of anything else wrap userfile's ErrNotRegular); a FIFO
// is refused at once rather than waited on.
func Open(path string) (*File, error) { return open(path, os.O_RDONLY) }

// OpenWrite opens an existing .npy file for reading and writing, to
// write parts of a file made by Create (a shard's rows, say).
func OpenWrite(path string) (*File, error) { return open(path, os.O_RDWR) }

// open opens path, which must be a regular file: a FIFO or a device is
// refused at once, never waited on.
func open(path string, flag int) (*File, error) {
	f, err := userfile.Open(path, flag)
	if err != nil {
		return nil, fmt.Errorf("npy: open: %w", err)
	}
	h, off, err := ReadHeader(f)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("npy: %s: %w", path, err), f.Close())
	}
	n, _ := h.DataBytes()
	st, err := f.Stat()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("npy: %s: %w", path, err), f.Close())
	}
	if st.Size() < off+n {
		return nil, errors.Join(fmt.Errorf("npy: %s: %d bytes, but its header (%v) needs %d: %w",
			path, st.Size(), h, off+n, ErrFormat), f.Close())
	}
	return &File{f: f, h: h, off: off, nbytes: n}, nil
}

// Header is the file's header.
func (f *File) Header() Header { return f.h }

// DataOffset is the byte offset of the data in the file.
func (f *File) DataOffset() int64 { return f.off }

// DataBytes is the size of the data.
func (f *File) DataBytes() int64 { return f.nbytes }

// OS is the underlying file (to map it, say). It stays owned by f.
func (f *File) OS() *os.File { return f.f }

// WriteAt writes p at byte off of the data. Writing past the data is an
// error.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	if err := f.check(len(p), off, "write"); err != nil {
		return 0, err
	}
	return f.f.WriteAt(p, f.off+off)
}

// ReadAt reads len(p) bytes at byte off of the data.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check(len(p), off, "read"); err != nil {
		return 0, err
	}
	return f.f.ReadAt(p, f.off+off)
}

func (f *File) check(n int, off int64, what string) error {
	if off < 0 || off > f.nbytes || int64(n) > f.nbytes-off {
		return fmt.Errorf("npy: %s %d bytes at %d: the data is %d bytes: %w", what, n, off, f.nbytes, os.ErrInvalid)
	}
	return nil
}

// Sync commits the file's contents to storage.
func (f *File) Sync() error { return f.f.Sync() }

// Close closes the file (for a File made by CreateIn, it does nothing:
// the *os.File is its caller's).
func (f *File) Close() error {
	if f.borrowed {
		return nil
	}
	return f.f.Close()
}
