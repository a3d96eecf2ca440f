// Package userfile writes and opens the files a user names, without
// damaging them.
//
// Writing: Create makes a temporary file beside the user's (in the same
// directory, so that the final rename is atomic), named
// ".NAME.RANDOM.partial" so that nothing left by a killed process looks
// like the finished file, and holds its lock (flock) while it writes;
// Commit syncs it, renames it over the user's path and closes it, and
// Abort removes it. A partial whose lock nobody holds is a dead writer's:
// the next Create of the same NAME removes it (partial.go). A new file's
// mode is Perm less the process's umask; a replaced one keeps its own. Until Commit the user's file is
// untouched, whatever happens to the process; after it, the path holds
// the whole new content. A path that is a symbolic link is followed: the
// link stays, and the file it names is replaced. A path that exists and is
// not a regular file (a directory, a device, a FIFO) is refused with
// ErrNotRegular, and one that is the same file as one of the inputs the
// caller names (os.SameFile: a hard or symbolic link counts) with
// ErrIsInput, before anything is made.
//
// Reading: Open opens a file that must be regular, without blocking on a
// FIFO (which would wait for a writer for ever), and ReadBounded reads a
// small file whole, refusing one larger than a bound.
//
// It owns the rules of STYLE.md's "Files a user owns" and nothing else:
// what goes in a file is its caller's.
package userfile
