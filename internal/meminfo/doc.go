// Package meminfo reads what the host says about its memory: on Linux,
// the bytes available to new programs without swapping (/proc/meminfo's
// MemAvailable) and the physical memory and swap (sysinfo(2), read in one
// place, sysinfo_linux.go). It owns the parsing of that file and the
// system call, for the manager's host ladder, the simulator's pinned
// default and the command's host-memory check alike; it knows nothing of
// vram. Where the host does not say (other systems), the figures are 0
// and ok is false.
package meminfo
