package meminfo_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vramkit/vram/internal/meminfo"
)

const gib = 1 << 30

// Mount lines of /proc/self/mountinfo, as the kernel writes them.
const (
	mountV2     = "30 22 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
	mountV1     = "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
	mountV1CPU  = "31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
	mountUnif   = "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
	mountTmpfs  = "29 22 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
	mountRootFS = "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
)

// fakeTree writes files (path under root → content) into a new root.
func fakeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, text := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestReadCgroup: the limit of the process's memory cgroup, from its
// /proc/self/cgroup and mountinfo, in fake trees of either version: the
// lowest limit on the way up to the mount is the one in force, and what
// is left is the least any level's limit leaves.
func TestReadCgroup(t *testing.T) {
	tests := map[string]struct {
		files map[string]string
		want  meminfo.CgroupLimit // File relative to the root
		ok    bool
	}{
		"v2 in its own namespace": {files: map[string]string{
			"proc/self/cgroup":              "0::/\n",
			"proc/self/mountinfo":           mountRootFS + mountV2,
			"sys/fs/cgroup/memory.max":      "2147483648\n",
			"sys/fs/cgroup/memory.current":  "1073741824\n",
			"sys/fs/cgroup/memory.stat":     "anon 805306368\nfile 268435456\ninactive_file 268435456\nactive_file 0\n",
			"sys/fs/cgroup/cgroup.max.deep": "max\n",
		}, want: meminfo.CgroupLimit{Bytes: 2 * gib, Left: 1*gib + gib/4, File: "sys/fs/cgroup/memory.max"}, ok: true},
		"v2 max is no limit": {files: map[string]string{
			"proc/self/cgroup":             "0::/\n",
			"proc/self/mountinfo":          mountV2,
			"sys/fs/cgroup/memory.max":     "max\n",
			"sys/fs/cgroup/memory.current": "1073741824\n",
		}},
		// A pod's limit (4 GiB, 3 GiB in use) above a container with
		// none, below a node's slice (8 GiB, 7.5 GiB in use): the pod's
		// limit is in force, the slice's leaves least.
		"v2 nested": {files: map[string]string{
			"proc/self/cgroup":                               "0::/kubepods/pod1/ctr\n",
			"proc/self/mountinfo":                            mountV2,
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max":     "max\n",
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.current": "1073741824\n",
			"sys/fs/cgroup/kubepods/pod1/memory.max":         "4294967296\n",
			"sys/fs/cgroup/kubepods/pod1/memory.current":     "3221225472\n",
			"sys/fs/cgroup/kubepods/memory.max":              "8589934592\n",
			"sys/fs/cgroup/kubepods/memory.current":          "8053063680\n",
		}, want: meminfo.CgroupLimit{Bytes: 4 * gib, Left: gib / 2, File: "sys/fs/cgroup/kubepods/memory.max"}, ok: true},
		// Without a cgroup namespace the mount shows the container's
		// cgroup as its root: the levels above it are not there to read.
		"v2 mount of the container's own cgroup": {files: map[string]string{
			"proc/self/cgroup":             "0::/kubepods/pod1/ctr\n",
			"proc/self/mountinfo":          "30 22 0:27 /kubepods/pod1/ctr /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n",
			"sys/fs/cgroup/memory.max":     "1073741824\n",
			"sys/fs/cgroup/memory.current": "536870912\n",
		}, want: meminfo.CgroupLimit{Bytes: gib, Left: gib / 2, File: "sys/fs/cgroup/memory.max"}, ok: true},
		"v2 over its limit": {files: map[string]string{
			"proc/self/cgroup":             "0::/\n",
			"proc/self/mountinfo":          mountV2,
			"sys/fs/cgroup/memory.max":     "1073741824\n",
			"sys/fs/cgroup/memory.current": "2147483648\n",
		}, want: meminfo.CgroupLimit{Bytes: gib, Left: 0, File: "sys/fs/cgroup/memory.max"}, ok: true},
		"v1": {files: map[string]string{
			"proc/self/cgroup":    "5:cpu,cpuacct:/\n4:memory:/slurm/job_7\n0::/\n",
			"proc/self/mountinfo": mountRootFS + mountTmpfs + mountV1CPU + mountV1,
			"sys/fs/cgroup/memory/slurm/job_7/memory.limit_in_bytes": "3221225472\n",
			"sys/fs/cgroup/memory/slurm/job_7/memory.usage_in_bytes": "1073741824\n",
			"sys/fs/cgroup/memory/slurm/job_7/memory.stat":           "cache 0\ninactive_file 7\ntotal_inactive_file 0\n",
			"sys/fs/cgroup/memory/slurm/memory.limit_in_bytes":       "9223372036854771712\n",
			"sys/fs/cgroup/memory/slurm/memory.usage_in_bytes":       "1073741824\n",
		}, want: meminfo.CgroupLimit{Bytes: 3 * gib, Left: 2 * gib, File: "sys/fs/cgroup/memory/slurm/job_7/memory.limit_in_bytes"}, ok: true},
		"v1 largest is no limit": {files: map[string]string{
			"proc/self/cgroup":                           "4:memory:/\n",
			"proc/self/mountinfo":                        mountV1,
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
			"sys/fs/cgroup/memory/memory.usage_in_bytes": "1073741824\n",
		}},
		// Hybrid: the memory controller is v1's; the unified hierarchy
		// has none, and its files are not read.
		"hybrid reads v1": {files: map[string]string{
			"proc/self/cgroup":                               "4:memory:/job\n0::/job\n",
			"proc/self/mountinfo":                            mountTmpfs + mountUnif + mountV1,
			"sys/fs/cgroup/unified/job/memory.max":           "1\n",
			"sys/fs/cgroup/unified/job/memory.current":       "0\n",
			"sys/fs/cgroup/memory/job/memory.limit_in_bytes": "2147483648\n",
			"sys/fs/cgroup/memory/job/memory.usage_in_bytes": "0\n",
		}, want: meminfo.CgroupLimit{Bytes: 2 * gib, Left: 2 * gib, File: "sys/fs/cgroup/memory/job/memory.limit_in_bytes"}, ok: true},
		"escaped mount point": {files: map[string]string{
			"proc/self/cgroup":             "0::/\n",
			"proc/self/mountinfo":          "30 22 0:27 / /run/my\\040cgroup rw - cgroup2 none rw\n",
			"run/my cgroup/memory.max":     "1073741824\n",
			"run/my cgroup/memory.current": "0\n",
		}, want: meminfo.CgroupLimit{Bytes: gib, Left: gib, File: "run/my cgroup/memory.max"}, ok: true},
		"no memory mount": {files: map[string]string{
			"proc/self/cgroup":    "4:memory:/job\n",
			"proc/self/mountinfo": mountRootFS + mountV1CPU,
		}},
		"no mountinfo":         {files: map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "1\n", "sys/fs/cgroup/memory.current": "0\n"}},
		"no cgroup file":       {files: map[string]string{"proc/self/mountinfo": mountV2, "sys/fs/cgroup/memory.max": "1\n", "sys/fs/cgroup/memory.current": "0\n"}},
		"limit but no usage":   {files: map[string]string{"proc/self/cgroup": "0::/\n", "proc/self/mountinfo": mountV2, "sys/fs/cgroup/memory.max": "1073741824\n"}},
		"garbage in the files": {files: map[string]string{"proc/self/cgroup": "nonsense\n0:x\n", "proc/self/mountinfo": "1 2 3\n- - -\n"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			root := fakeTree(t, tc.files)
			got, ok := meminfo.ReadCgroup(root)
			if tc.ok {
				tc.want.File = filepath.Join(root, tc.want.File)
			}
			if ok != tc.ok || got != tc.want {
				t.Errorf("ReadCgroup = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// FuzzReadCgroup: whatever /proc/self/cgroup and mountinfo say, reading
// them neither panics nor reads outside the root, and a limit found
// leaves no more than itself.
func FuzzReadCgroup(f *testing.F) {
	f.Add("0::/a/b\n", mountV2)
	f.Add("4:memory:/x\n0::/\n", mountTmpfs+mountUnif+mountV1)
	f.Add("0::/../../..\n", "30 22 0:27 /.. /sys/fs/cgroup/../.. rw - cgroup2 cgroup2 rw\n")
	f.Fuzz(func(t *testing.T, cgroups, mounts string) {
		root := fakeTree(t, map[string]string{
			"proc/self/cgroup":             cgroups,
			"proc/self/mountinfo":          mounts,
			"sys/fs/cgroup/memory.max":     "1073741824\n",
			"sys/fs/cgroup/memory.current": "0\n",
		})
		l, ok := meminfo.ReadCgroup(root)
		if ok && (l.Left > l.Bytes || l.File == "") {
			t.Errorf("ReadCgroup = %+v: want what is left at most the limit, and its file", l)
		}
		if ok {
			if rel, err := filepath.Rel(root, l.File); err != nil || !filepath.IsLocal(rel) {
				t.Errorf("ReadCgroup read %s, outside the root %s", l.File, root)
			}
		}
	})
}
