// Package meminfo reads what the host and the process's cgroup say about
// the memory this process may use: on Linux, the bytes available to new
// programs without swapping (/proc/meminfo's MemAvailable), the physical
// memory and swap (sysinfo(2), read in one place, sysinfo_linux.go), and
// the memory limit of the process's cgroup, v1 or v2, nested or not
// (cgroup.go), which lowers both RAM and Available: a program in a
// container sizes itself by its container, not by the node. It owns the
// parsing of those files and the system call, for the manager's host
// ladder, the simulator's pinned default and the command's host-memory
// check alike; it knows nothing of vram. Where neither the host nor a
// cgroup says (other systems), the figures are 0 and ok is false.
package meminfo
