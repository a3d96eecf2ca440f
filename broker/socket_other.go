//go:build !unix

package broker

// umask does nothing where there is no file mode creation mask.
func umask(int) int { return 0 }
