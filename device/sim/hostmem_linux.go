//go:build linux

package sim

import "syscall"

// hugePage is the size of a transparent huge page on the hosts the
// simulator runs on.
const hugePage = 2 << 20

// hostBufMap maps n > 0 bytes of anonymous host memory for a pinned host
// buffer: off the Go heap, so that HostFree gives the RAM back at once
// (hostBufUnmap) rather than when the collector next runs, and a
// buffer's pages count in the process's RSS exactly while it is live. A
// buffer of a huge page or more asks for transparent huge pages: pinning
// it then takes one page fault per 2 MiB rather than per 4 KiB, which on
// a virtual machine is most of what pinning costs. mem is the whole
// mapping, for hostBufUnmap.
func hostBufMap(n uint64) (mem []byte, err error) {
	mem, err = syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, err
	}
	if n >= hugePage {
		_ = syscall.Madvise(mem, syscall.MADV_HUGEPAGE) // advice: refused, the pages are small
	}
	return mem, nil
}

// hostBufUnmap gives back a mapping from hostBufMap; nothing may use it
// afterwards.
func hostBufUnmap(mem []byte) { _ = syscall.Munmap(mem) }
