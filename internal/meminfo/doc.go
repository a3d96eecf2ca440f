// Package meminfo reads what Linux says about the host's memory
// (/proc/meminfo): the bytes available to new programs without swapping.
// It owns the parsing of that file, for the manager's host ladder and the
// command's host-memory check alike; it knows nothing of vram.
package meminfo
