//go:build !linux

package cuda

import "errors"

var errNoMap = errors.New("pinned host buffers are only made on Linux")

func mapHost(n uint64) ([]byte, error) { return nil, errNoMap }

func unmapHost(mem []byte) error { return errNoMap }
