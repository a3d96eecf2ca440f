package meminfo

// The memory limit of the process's cgroup, on Linux: what a container
// (a Kubernetes pod, a Slurm job's cgroup, a systemd slice) lets the
// process use, which the host's figures do not show.
//
//  1. /proc/self/cgroup names the process's cgroup: the v1 line whose
//     controllers include memory ("4:memory:/a/b"), else the v2 line
//     ("0::/a/b").
//  2. /proc/self/mountinfo says where that hierarchy is mounted (a
//     cgroup mount with the memory option, or the cgroup2 mount) and
//     which of its cgroups the mount shows as its root (a container's
//     own, in a cgroup namespace).
//  3. From the process's cgroup up to the mount, every level's limit
//     applies to what that level holds: the limit in force is the lowest,
//     and what is left is the least that any level's limit leaves (its
//     limit less its usage, page cache the kernel can drop not counted).
//
// Limits of "max" (v2) or at least 2⁶² (v1 writes the largest page-aligned
// int64) are none. Nothing found, or files unreadable, is no limit known.

import (
	"bufio"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// noLimit: cgroup figures at or above this are no limit.
const noLimit = 1 << 62

// CgroupLimit is what the process's cgroup allows it, read at one moment.
type CgroupLimit struct {
	// Bytes is the limit in force: the lowest of every level's.
	Bytes uint64
	// Left is what the limits leave: the least, over the levels, of a
	// level's limit less what the level uses (its usage less the
	// inactive page cache the kernel reclaims before it fails an
	// allocation); 0 at or over a limit.
	Left uint64
	// File is the limit file of the level that leaves least, for
	// messages.
	File string
}

// cgroupFiles are the files of one cgroup version's memory controller.
type cgroupFiles struct {
	limit, usage string // byte counts
	stat         string // memory.stat, whose inactive key is reclaimable cache
	inactive     []string
}

var (
	cgroupV2 = cgroupFiles{limit: "memory.max", usage: "memory.current", stat: "memory.stat", inactive: []string{"inactive_file"}}
	cgroupV1 = cgroupFiles{limit: "memory.limit_in_bytes", usage: "memory.usage_in_bytes", stat: "memory.stat",
		inactive: []string{"total_inactive_file", "inactive_file"}}
)

// cgroup is the process's memory cgroup as found under a root: its
// directories, the process's own first and the mount's last.
type cgroup struct {
	dirs  []string
	files cgroupFiles
}

// ReadCgroup reads the limit of the memory cgroup of the process whose
// /proc and cgroup mounts are under root ("/" for this process; a copy of
// them in a test); ok is false where no limit is set or none can be
// read.
func ReadCgroup(root string) (CgroupLimit, bool) {
	cg, ok := findCgroup(root)
	if !ok {
		return CgroupLimit{}, false
	}
	return cg.read()
}

var (
	selfOnce sync.Once
	self     cgroup
	selfOK   bool
)

// selfCgroup is this process's memory cgroup, found once: a process
// does not move between cgroups on its own.
func selfCgroup() (cgroup, bool) {
	selfOnce.Do(func() { self, selfOK = findCgroup("/") })
	return self, selfOK
}

// findCgroup finds the memory cgroup of the process under root.
func findCgroup(root string) (cgroup, bool) {
	v1, v2, ok := cgroupPaths(filepath.Join(root, "proc/self/cgroup"))
	if !ok {
		return cgroup{}, false
	}
	mounts, err := os.Open(filepath.Join(root, "proc/self/mountinfo"))
	if err != nil {
		return cgroup{}, false
	}
	defer mounts.Close()
	sc := bufio.NewScanner(mounts)
	for sc.Scan() {
		m, ok := parseMount(sc.Text())
		if !ok {
			continue
		}
		var cgPath string
		var files cgroupFiles
		switch {
		case v1 != "" && m.fsType == "cgroup" && hasOption(m.superOptions, "memory"):
			cgPath, files = v1, cgroupV1
		case v1 == "" && v2 != "" && m.fsType == "cgroup2":
			cgPath, files = v2, cgroupV2
		default:
			continue
		}
		rel, ok := under(cgPath, m.root)
		if !ok {
			continue
		}
		top := filepath.Join(root, filepath.FromSlash(path.Clean("/"+m.point)))
		return cgroup{dirs: levels(top, rel), files: files}, true
	}
	return cgroup{}, false
}

// cgroupPaths reads /proc/self/cgroup: the path of the v1 hierarchy
// holding the memory controller, and of the v2 hierarchy.
func cgroupPaths(file string) (v1, v2 string, ok bool) {
	f, err := os.Open(file)
	if err != nil {
		return "", "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path; the path may hold
		// colons.
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case hasOption(parts[1], "memory"):
			v1 = parts[2]
		}
	}
	return v1, v2, v1 != "" || v2 != ""
}

// mount is what findCgroup needs of a line of mountinfo.
type mount struct {
	root, point, fsType, superOptions string
}

// parseMount reads a line of /proc/self/mountinfo:
//
//	36 35 98:0 /root /point rw,noatime master:1 - cgroup cgroup rw,memory
//
// (ID, parent, device, root, mount point, options, optional fields up to
// "-", then the file system type, source and super options).
func parseMount(line string) (mount, bool) {
	f := strings.Fields(line)
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 6 || sep < 0 || sep+3 >= len(f) {
		return mount{}, false
	}
	return mount{root: unescape(f[3]), point: unescape(f[4]), fsType: f[sep+1], superOptions: f[sep+3]}, true
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash ("\040").
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// hasOption reports whether a comma-separated list holds opt.
func hasOption(list, opt string) bool {
	for _, o := range strings.Split(list, ",") {
		if o == opt {
			return true
		}
	}
	return false
}

// under is p relative to root, when p is root or below it.
func under(p, root string) (string, bool) {
	p, root = path.Clean("/"+p), path.Clean("/"+root)
	if root == "/" {
		return p, true
	}
	if p == root {
		return "/", true
	}
	rest, ok := strings.CutPrefix(p, root+"/")
	return "/" + rest, ok
}

// levels are the directories of cgroup rel under the mount top, rel's
// own first and top's last.
func levels(top, rel string) []string {
	var dirs []string
	for p := path.Clean(rel); ; p = path.Dir(p) {
		dirs = append(dirs, filepath.Join(top, filepath.FromSlash(p)))
		if p == "/" {
			return dirs
		}
	}
}

// read reads every level's limit, usage and reclaimable cache.
func (c cgroup) read() (CgroupLimit, bool) {
	var l CgroupLimit
	found := false
	for _, dir := range c.dirs {
		limit, ok := readBytes(filepath.Join(dir, c.files.limit))
		if !ok {
			continue
		}
		usage, ok := readBytes(filepath.Join(dir, c.files.usage))
		if !ok {
			continue
		}
		used := usage - min(usage, c.inactive(dir))
		left := limit - min(limit, used)
		if !found || left < l.Left {
			l.Left, l.File = left, filepath.Join(dir, c.files.limit)
		}
		if !found || limit < l.Bytes {
			l.Bytes = limit
		}
		found = true
	}
	return l, found
}

// inactive is the inactive page cache memory.stat in dir counts (0 when
// it says none, or cannot be read).
func (c cgroup) inactive(dir string) uint64 {
	f, err := os.Open(filepath.Join(dir, c.files.stat))
	if err != nil {
		return 0
	}
	defer f.Close()
	found := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			found[k] = n
		}
	}
	for _, k := range c.files.inactive {
		if n, ok := found[k]; ok {
			return n
		}
	}
	return 0
}

// readBytes reads a cgroup file holding a byte count; ok is false when it
// is missing, unreadable, or says there is no limit ("max", or 2⁶² and
// above).
func readBytes(file string) (uint64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n >= noLimit {
		return 0, false
	}
	return n, true
}
