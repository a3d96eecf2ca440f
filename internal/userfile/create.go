package userfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrNotRegular: the path exists and is not a regular file.
	ErrNotRegular = errors.New("not a regular file")
	// ErrIsInput: the output path is one of the inputs.
	ErrIsInput = errors.New("the output is one of the inputs")
)

// DefaultPerm is the mode of a file Create makes where none existed,
// before the process's umask takes its bits away.
const DefaultPerm fs.FileMode = 0o644

// Options say how Create checks and makes the file. The zero value is
// DefaultPerm and no inputs.
type Options struct {
	// Perm is the new file's mode where none existed (default
	// DefaultPerm), less the bits the process's umask clears, as for any
	// file the process creates; an existing file keeps its own mode.
	Perm fs.FileMode
	// Inputs are files the output must not be: each that exists is
	// compared with the output (os.SameFile).
	Inputs []string
}

// File is the new content of a user's file, written to a temporary file
// beside it until Commit. Not safe for concurrent Commit and Abort; the
// *os.File from OS is as safe as any.
type File struct {
	f      *os.File
	path   string      // as the caller named it
	target string      // path with symbolic links followed: what Commit replaces
	keep   fs.FileMode // the replaced file's mode, which Commit gives the new one; 0 for a new file (its mode is set at creation)
	done   bool        // committed or aborted
}

// Create checks path and makes the temporary file its new content is
// written to. Errors wrap ErrNotRegular, ErrIsInput, or the os error.
func Create(path string, opt Options) (*File, error) {
	target, perm, exists, err := check(path, opt)
	if err != nil {
		return nil, err
	}
	dir, base := filepath.Dir(target), filepath.Base(target)
	removeStale(dir, base)
	f, err := createPartial(dir, base, perm)
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	uf := &File{f: f, path: path, target: target}
	if exists {
		uf.keep = perm
	}
	return uf, nil
}

// Check is Create's check alone: it returns the file path names once
// symbolic links are followed (path itself when it does not exist yet)
// and the mode a new content should have. Errors wrap ErrNotRegular,
// ErrIsInput or the os error.
func Check(path string, opt Options) (target string, perm fs.FileMode, err error) {
	target, perm, _, err = check(path, opt)
	return target, perm, err
}

// check is Check, saying also whether the file exists.
func check(path string, opt Options) (target string, perm fs.FileMode, exists bool, err error) {
	perm = opt.Perm
	if perm == 0 {
		perm = DefaultPerm
	}
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if lst, lerr := os.Lstat(path); lerr == nil && lst.Mode()&fs.ModeSymlink != 0 {
			dest, _ := os.Readlink(path)
			return "", 0, false, fmt.Errorf("write %s: a symbolic link to %s, which does not exist: %w", path, dest, ErrNotRegular)
		}
		if err := checkDir(path); err != nil {
			return "", 0, false, err
		}
		return path, perm, false, nil
	case err != nil:
		return "", 0, false, fmt.Errorf("write %s: %w", path, err)
	case !st.Mode().IsRegular():
		return "", 0, false, fmt.Errorf("write %s: it is a %s: %w", path, kind(st.Mode()), ErrNotRegular)
	}
	for _, in := range opt.Inputs {
		if ist, err := os.Stat(in); err == nil && os.SameFile(st, ist) {
			return "", 0, false, fmt.Errorf("write %s: it is the input %s; write to another file: %w", path, in, ErrIsInput)
		}
	}
	if target, err = filepath.EvalSymlinks(path); err != nil {
		return "", 0, false, fmt.Errorf("write %s: %w", path, err)
	}
	return target, st.Mode().Perm(), true, nil
}

// checkDir refuses a new file's path whose directory does not exist, fix
// first, before the caller does the work whose result it would hold.
func checkDir(path string) error {
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("write %s: make its directory first (mkdir -p %s): %w", path, dir, err)
	}
	return nil // any other trouble with dir shows at Create, or in path's own Stat
}

// kind names a mode that is not a regular file's.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file (" + m.Type().String() + ")"
}

// OS is the temporary file, to write (or read back) the new content. It
// stays owned by f: do not close it.
func (f *File) OS() *os.File { return f.f }

// Name is the path the caller named.
func (f *File) Name() string { return f.path }

// TempName is the temporary file's path.
func (f *File) TempName() string { return f.f.Name() }

// Commit syncs the temporary file (giving it the mode of the file it
// replaces), renames it over the user's path (the file a symbolic link
// names) and closes it, then syncs the directory. On failure the
// temporary file is removed and the user's file is as it was. Commit
// after Commit or Abort is an error.
func (f *File) Commit() error {
	if f.done {
		return fmt.Errorf("write %s: already committed or aborted: %w", f.path, fs.ErrClosed)
	}
	f.done = true
	tmp := f.f.Name()
	var err error
	if f.keep != 0 {
		err = f.f.Chmod(f.keep)
	}
	if err == nil {
		err = f.f.Sync()
	}
	if err == nil { // renamed while open, so that its lock covers it until it has its final name
		err = os.Rename(tmp, f.target)
	}
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errors.Join(fmt.Errorf("write %s: %w", f.path, err), removeMissingOK(tmp))
	}
	// The rename is in the directory: sync it too, so that it survives a
	// crash. Where directories cannot be synced the file is in place all
	// the same.
	if d, derr := os.Open(filepath.Dir(f.target)); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// Abort closes and removes the temporary file, leaving the user's file as
// it was. After Commit or a first Abort it does nothing.
func (f *File) Abort() error {
	if f.done {
		return nil
	}
	f.done = true
	rerr := removeMissingOK(f.f.Name()) // before the close ends its lock
	err := f.f.Close()
	if errors.Is(err, fs.ErrClosed) {
		err = nil
	}
	return errors.Join(err, rerr)
}

func removeMissingOK(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Write writes path whole or not at all: write fills the temporary file,
// and Commit puts it in place; on any failure the user's file is as it
// was.
func Write(path string, opt Options, write func(io.Writer) error) error {
	f, err := Create(path, opt)
	if err != nil {
		return err
	}
	if err := write(f.f); err != nil {
		return errors.Join(err, f.Abort())
	}
	return f.Commit()
}
