// Package mapfile maps files into memory and reserves their disk blocks:
// the host ladder's file rung (memory-mapped .npy files) and its spill
// files. Map and Unmap are mmap(2) and munmap(2) where the system has
// them (Supported); Reserve gives a file its blocks before it is written
// through a mapping, so that a full disk is an error and not a SIGBUS. It
// knows nothing of vram.
package mapfile
