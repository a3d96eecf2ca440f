package userfile

// The temporary files: ".NAME.RANDOM.partial" beside the user's file,
// each locked (flock) by its writer from just after it is made until it
// is renamed into place or removed. A writer that dies (kill -9, a
// crash, a node's job killed by its scheduler) leaves its partial
// unlocked, and the next Create of the same NAME removes it: a lock that
// can be taken marks a partial that nobody writes.
//
// The one window, a partial made but not yet locked, is closed from the
// writer's side: after taking its lock it checks that the name still
// names its file, and starts again under a new name if a cleaner removed
// it meanwhile. Where the file system has no locks, partials are neither
// locked nor ever removed by another Create.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// partialSuffix ends every temporary file's name.
const partialSuffix = ".partial"

// createPartial makes and locks a new temporary file for dir/base, of
// mode perm less the umask.
func createPartial(dir, base string, perm fs.FileMode) (*os.File, error) {
	for range 100 {
		var r [6]byte
		_, _ = rand.Read(r[:])
		name := filepath.Join(dir, "."+base+"."+hex.EncodeToString(r[:])+partialSuffix)
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
		switch {
		case errors.Is(err, fs.ErrExist):
			continue
		case err != nil:
			return nil, err
		}
		locked, err := tryLock(f)
		if err != nil { // no locks here: an unlocked partial
			return f, nil
		}
		if locked && sameFile(name, f) {
			return f, nil
		}
		// A cleaner took it between its making and the lock: it is gone,
		// or going.
		_ = f.Close()
	}
	return nil, fmt.Errorf("no free temporary name in %s after 100 tries", dir)
}

// removeStale removes the partials of dir/base that no live writer holds.
// It is best effort: what cannot be checked or removed stays.
func removeStale(dir, base string) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	prefix := "." + base + "."
	for _, e := range es {
		if n := e.Name(); e.Type().IsRegular() && strings.HasPrefix(n, prefix) && strings.HasSuffix(n, partialSuffix) &&
			len(n) > len(prefix)+len(partialSuffix) {
			removeIfUnlocked(filepath.Join(dir, n))
		}
	}
}

// removeIfUnlocked removes the partial at name if its lock can be taken:
// its writer is gone. It opens the file for writing, as NFS's emulation of
// flock needs for an exclusive lock; one it may not write is left alone.
func removeIfUnlocked(name string) {
	f, err := Open(name, os.O_RDWR|noFollow)
	if err != nil {
		return
	}
	defer f.Close() // after the removal: the lock is held until then
	if locked, err := tryLock(f); err == nil && locked && sameFile(name, f) {
		_ = os.Remove(name)
	}
}

// sameFile reports whether name still names the file f has open.
func sameFile(name string, f *os.File) bool {
	a, err := os.Lstat(name)
	if err != nil {
		return false
	}
	b, err := f.Stat()
	return err == nil && os.SameFile(a, b)
}
