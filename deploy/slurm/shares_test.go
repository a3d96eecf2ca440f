// Package slurm holds the Slurm batch scripts of deploy/slurm and their
// tests, which run a script with bash as a task would be run, with
// stand-ins for vram and scontrol.
package slurm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// shareStubVram stands in for vram: its broker serves until killed,
// status answers, run writes its arguments to $STUB_LOG.
const shareStubVram = `#!/bin/sh
case "$1 $2" in
"broker status") exit 0 ;;
broker*) exec sleep 600 ;;
run*) echo "$*" >>"$STUB_LOG"; exit 0 ;;
esac
exit 3
`

// TestSharedArrayShare: each task of vram-shared-array.sbatch leases the
// share of the GPU its shards are (SLURM_SHARDS_ON_NODE over one GPU's
// shards, from VRAM_SHARDS_PER_GPU or scontrol's gres of the node), and a
// task whose GPU's shards cannot be told fails before vram runs.
func TestSharedArrayShare(t *testing.T) {
	for _, tool := range []string{"bash", "flock", "awk", "sed", "tr", "grep"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: the script needs it", tool)
		}
	}
	script, err := filepath.Abs("vram-shared-array.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		shards  string // SLURM_SHARDS_ON_NODE ("": unset)
		perGPU  string // VRAM_SHARDS_PER_GPU ("": unset)
		gres    string // the node's Gres= as scontrol shows it ("": no scontrol)
		want    string // vram run's --proportion ("": none); with fail, in stderr
		fail    bool
		printed string // on the task's output
	}{
		// 2 of one GPU's 8 shards: a quarter of its memory.
		"a quarter":         {shards: "2", gres: "gpu:1,shard:8", want: "--proportion 0.250000", printed: "2 of the GPU's 8 shards"},
		"two GPUs' shards":  {shards: "4", gres: "gpu:2,shard:16", want: "--proportion 0.500000"},                         // 16 / 2 = 8 a GPU
		"typed, by socket":  {shards: "3", gres: "gpu:a100:2(S:0-1),shard:a100:12(S:0-1)", want: "--proportion 0.500000"}, // 12 / 2 = 6 a GPU
		"all of it":         {shards: "8", gres: "gpu:1,shard:8", want: "--proportion 1.000000"},
		"the variable wins": {shards: "3", perGPU: "4", gres: "gpu:1,shard:8", want: "--proportion 0.750000"},
		"no scontrol":       {shards: "1", perGPU: "3", want: "--proportion 0.333333"},
		"no shards":         {gres: "gpu:1,shard:8", printed: "auto pool"},
		"shards unknown":    {shards: "2", gres: "gpu:1", fail: true, want: "set VRAM_SHARDS_PER_GPU"},
		"a bad variable":    {shards: "2", perGPU: "lots", fail: true, want: "a GPU of 'lots' shards"},
		"zero a GPU":        {shards: "2", perGPU: "0", fail: true, want: "set VRAM_SHARDS_PER_GPU"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			bin := filepath.Join(dir, "bin")
			need(t, os.Mkdir(bin, 0o755))
			need(t, os.WriteFile(filepath.Join(bin, "vram"), []byte(shareStubVram), 0o755))
			if tc.gres != "" {
				scontrol := "#!/bin/sh\necho 'NodeName=node1 Arch=x86_64 CoresPerSocket=8 Gres=" + tc.gres + " NodeAddr=node1 State=MIXED'\n"
				need(t, os.WriteFile(filepath.Join(bin, "scontrol"), []byte(scontrol), 0o755))
			}
			log := filepath.Join(dir, "stub.log")
			env := []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH"), "VRAM=" + filepath.Join(bin, "vram"),
				"VRAM_OUT=" + filepath.Join(dir, "r.npy"), "VRAM_BROKER_DIR=" + dir, "STUB_LOG=" + log,
				"SLURM_ARRAY_JOB_ID=s" + strconv.Itoa(os.Getpid()), "SLURMD_NODENAME=node1", "HOME=" + dir}
			if tc.shards != "" {
				env = append(env, "SLURM_SHARDS_ON_NODE="+tc.shards)
			}
			if tc.perGPU != "" {
				env = append(env, "VRAM_SHARDS_PER_GPU="+tc.perGPU)
			}
			cmd := exec.Command("bash", script)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			ran, _ := os.ReadFile(log)
			if tc.fail {
				if err == nil || !strings.Contains(string(out), tc.want) || len(ran) != 0 {
					t.Errorf("the script: %v, vram ran %q; want it to fail saying %q before vram runs:\n%s", err, ran, tc.want, out)
				}
				return
			}
			if err != nil || len(ran) == 0 {
				t.Fatalf("the script: %v, vram ran %q:\n%s", err, ran, out)
			}
			if got := string(ran); (tc.want == "") == strings.Contains(got, "--proportion") || !strings.Contains(got, tc.want) {
				t.Errorf("vram %s; want %q", strings.TrimSpace(got), tc.want)
			}
			if !strings.Contains(string(out), tc.printed) {
				t.Errorf("the task's output lacks %q:\n%s", tc.printed, out)
			}
		})
	}
}

func need(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
