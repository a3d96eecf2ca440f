// Package slurm holds the Slurm batch scripts of deploy/slurm and their
// tests: vram-shared-array.sbatch run by bash as a task would be, with a
// stand-in vram, in directories set up as another user of the node could
// leave them.
package slurm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// stubVram stands in for vram: its broker serves until killed, status
// answers once one serves, run waits for one to serve (the keeper's
// broker, however slowly it starts) and records that it ran.
const stubVram = `#!/bin/sh
served() { grep -q served "$STUB_LOG" 2>/dev/null; }
case "$1 $2" in
"broker status") served; exit ;;
broker*) echo served >>"$STUB_LOG"; exec sleep 600 ;;
run*) until served; do sleep 0.05; done; echo ran >>"$STUB_LOG"; exit 0 ;;
esac
exit 3
`

// otherUID is a user that is not this one, for what another user of the
// node would make.
const otherUID = 65534

// TestSharedArrayBrokerDir: vram-shared-array.sbatch's directory of the
// socket and the lock in a directory anyone may write (as /dev/shm): made
// closed to others, or taken only as the job's user's own closed one;
// whatever another user planted (a directory of theirs, a link to one, a
// link in it to a file of the job's user) is refused, and no file of the
// job's user is touched.
func TestSharedArrayBrokerDir(t *testing.T) {
	for _, tool := range []string{"bash", "flock", "stat", "id"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: the script needs it", tool)
		}
	}
	tests := map[string]struct {
		plant   func(t *testing.T, dir, victim string) // dir: the job's directory, not yet made
		refused string                                 // in the error; "" for a run that works
		other   bool                                   // needs another uid (root)
	}{
		"fresh": {plant: func(*testing.T, string, string) {}},
		"made by another task of the job": {plant: func(t *testing.T, dir, _ string) {
			must(t, os.Mkdir(dir, 0o700))
		}},
		"another user's directory with a link to the job's file": {other: true, refused: "of uid " + strconv.Itoa(otherUID),
			plant: func(t *testing.T, dir, victim string) {
				must(t, os.Mkdir(dir, 0o777))
				must(t, os.Chmod(dir, 0o777))
				must(t, os.Symlink(victim, filepath.Join(dir, "broker.lock")))
				must(t, os.Lchown(filepath.Join(dir, "broker.lock"), otherUID, otherUID))
				must(t, os.Chown(dir, otherUID, otherUID))
			}},
		"another user's link to a directory": {other: true, refused: "symbolic link",
			plant: func(t *testing.T, dir, victim string) {
				target := filepath.Join(filepath.Dir(victim), "elsewhere")
				must(t, os.Mkdir(target, 0o700))
				must(t, os.Symlink(target, dir))
				must(t, os.Lchown(dir, otherUID, otherUID))
			}},
		"the job's user's directory open to others": {refused: "mode 777",
			plant: func(t *testing.T, dir, _ string) {
				must(t, os.Mkdir(dir, 0o700))
				must(t, os.Chmod(dir, 0o777))
			}},
		"a file": {refused: "regular",
			plant: func(t *testing.T, dir, _ string) { must(t, os.WriteFile(dir, nil, 0o600)) }},
	}
	script, err := filepath.Abs("vram-shared-array.sbatch")
	must(t, err)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if tc.other && os.Geteuid() != 0 {
				t.Skip("making files of another user needs root")
			}
			home := t.TempDir()
			shm := filepath.Join(home, "shm") // as /dev/shm: anyone may write, sticky
			must(t, os.Mkdir(shm, 0o777))
			must(t, os.Chmod(shm, 0o1777))
			victim := filepath.Join(home, "precious")
			must(t, os.WriteFile(victim, []byte("the job's user's data"), 0o600))
			vram := filepath.Join(home, "vram")
			must(t, os.WriteFile(vram, []byte(stubVram), 0o755))
			jobID := "t" + strconv.Itoa(os.Getpid())
			dir := filepath.Join(shm, "vram-"+jobID)
			tc.plant(t, dir, victim)
			log := filepath.Join(home, "stub.log")
			cmd := exec.Command("bash", script)
			cmd.Env = append(os.Environ(), "VRAM="+vram, "VRAM_OUT="+filepath.Join(home, "r.npy"), "VRAM_BROKER_DIR="+shm,
				"SLURM_ARRAY_JOB_ID="+jobID, "STUB_LOG="+log)
			out, err := cmd.CombinedOutput()
			if b, _ := os.ReadFile(victim); string(b) != "the job's user's data" {
				t.Errorf("the job's user's file holds %q", b)
			}
			ran, _ := os.ReadFile(log)
			if tc.refused != "" {
				if err == nil || !strings.Contains(string(out), tc.refused) || !strings.Contains(string(out), "VRAM_BROKER_DIR") ||
					strings.Contains(string(ran), "ran") {
					t.Errorf("the script: %v, ran %q; want it refused (%q) before vram ran:\n%s", err, ran, tc.refused, out)
				}
				return
			}
			if err != nil || !strings.Contains(string(ran), "served") || !strings.Contains(string(ran), "ran") {
				t.Fatalf("the script: %v, ran %q; want its broker served and its run done:\n%s", err, ran, out)
			}
			var st syscall.Stat_t
			must(t, syscall.Lstat(dir, &st))
			if st.Mode&syscall.S_IFMT != syscall.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
				t.Errorf("%s: mode %o, uid %d; want a directory of uid %d closed to others", dir, st.Mode, st.Uid, os.Geteuid())
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
