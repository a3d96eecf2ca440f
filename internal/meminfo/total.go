package meminfo

// The memory this process may use: the host's, lowered to what the
// process's cgroup allows (cgroup.go), so that a program in a container
// sizes itself by its container and not by the node.

import "path/filepath"

// RAM is the memory this process may use in all: the host's physical
// memory, or its cgroup's limit where that is lower; 0 when unknown.
func RAM() uint64 {
	ram, _, _ := sysinfo()
	if cg, ok := selfCgroup(); ok {
		if l, ok := cg.read(); ok && (ram == 0 || l.Bytes < ram) {
			return l.Bytes
		}
	}
	return ram
}

// RAMAndSwap is the host's memory and swap in bytes, or 0 when unknown.
// Linux refuses (by default) to commit a single mapping larger than this,
// which the Go runtime reports as a fatal error. It is the host's figure:
// the kernel's commit check knows no cgroup.
func RAMAndSwap() uint64 {
	ram, swap, _ := sysinfo()
	return ram + swap
}

// Free is what this process may still take, and where the figure came
// from.
type Free struct {
	Bytes uint64
	// From names the figure's source, for messages: "MemAvailable in
	// /proc/meminfo", or "the cgroup limit FILE less what is in use".
	From string
	// Known is false where neither the host nor a cgroup says.
	Known bool
}

// Available is what this process may still take without swapping or
// meeting its cgroup's limit: the host's MemAvailable, or what the
// cgroup's limit leaves where that is less.
func Available() Free {
	cg, _ := selfCgroup()
	return available(Path, cg)
}

// HostAvailable is Available's bytes, and whether they are known.
func HostAvailable() (uint64, bool) {
	f := Available()
	return f.Bytes, f.Known
}

// AvailableAt is Available for the process whose /proc and cgroup mounts
// are under root (a copy of them, in a test).
func AvailableAt(root string) Free {
	cg, _ := findCgroup(root)
	return available(filepath.Join(root, Path), cg)
}

// available is the meminfo file's MemAvailable, lowered to what cg's
// limits leave.
func available(meminfoPath string, cg cgroup) Free {
	var f Free
	if n, ok := ReadAvailable(meminfoPath); ok {
		f = Free{Bytes: n, From: "MemAvailable in " + Path, Known: true}
	}
	if l, ok := cg.read(); ok && (!f.Known || l.Left < f.Bytes) {
		f = Free{Bytes: l.Left, From: "the cgroup limit " + l.File + " less what is in use", Known: true}
	}
	return f
}
