//go:build unix

package broker

import (
	"io/fs"
	"syscall"
)

// maxSocketPath is the longest path a Unix socket's address holds (107
// bytes on Linux, 103 on the BSDs and macOS): sun_path less its NUL.
var maxSocketPath = len(syscall.RawSockaddrUnix{}.Path) - 1

// oNoFollow refuses to open a symbolic link.
const oNoFollow = syscall.O_NOFOLLOW

// umask sets the process's file mode creation mask, returning the old one.
func umask(m int) int { return syscall.Umask(m) }

// fileUID is the owner of the file fi describes.
func fileUID(fi fs.FileInfo) (uint32, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Uid, true
}

// fileGID is the group of the file fi describes.
func fileGID(fi fs.FileInfo) (uint32, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Gid, true
}
