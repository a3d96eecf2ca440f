//go:build !unix

package broker

import "io/fs"

// maxSocketPath is Windows' sun_path less its NUL.
const maxSocketPath = 107

// oNoFollow: no such flag here.
const oNoFollow = 0

// umask does nothing where there is no file mode creation mask.
func umask(int) int { return 0 }

// fileUID: no owners by uid here.
func fileUID(fs.FileInfo) (uint32, bool) { return 0, false }

// fileGID: no groups by gid here.
func fileGID(fs.FileInfo) (uint32, bool) { return 0, false }
