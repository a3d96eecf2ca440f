// Package kubernetes holds the Kubernetes manifests of deploy/kubernetes
// and their test: each is decoded strictly (an unknown or misspelt field
// is an error) into the Kubernetes API's own types (k8s.io/api), and the
// fields a sharded vram batch depends on are checked.
package kubernetes

import (
	"fmt"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

// decode reads file into v strictly.
func decode(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

func manifests(t *testing.T) (run, merge *batchv1.Job, pvc *corev1.PersistentVolumeClaim) {
	run, merge, pvc = &batchv1.Job{}, &batchv1.Job{}, &corev1.PersistentVolumeClaim{}
	decode(t, "job.yaml", run)
	decode(t, "merge-job.yaml", merge)
	decode(t, "pvc.yaml", pvc)
	return run, merge, pvc
}

// env is the value of the container's variable name ("" and false if
// absent).
func env(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// checkShared checks that the pod mounts the claim and that VRAM_OUT lies
// in it; it returns VRAM_OUT.
func checkShared(spec corev1.PodSpec, c corev1.Container, pvc *corev1.PersistentVolumeClaim) (string, []error) {
	var errs []error
	out, ok := env(c, "VRAM_OUT")
	if !ok || !strings.HasSuffix(out, ".npy") {
		errs = append(errs, fmt.Errorf("VRAM_OUT is %q, want a .npy path on the shared volume", out))
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pvc.Name &&
				!m.ReadOnly && strings.HasPrefix(out, strings.TrimSuffix(m.MountPath, "/")+"/") {
				mounted = true
			}
		}
	}
	if !mounted {
		errs = append(errs, fmt.Errorf("VRAM_OUT %q is not on a writable mount of the claim %q", out, pvc.Name))
	}
	if spec.RestartPolicy != corev1.RestartPolicyNever {
		errs = append(errs, fmt.Errorf("restartPolicy %q, want Never (a retried pod reruns its shard whole)", spec.RestartPolicy))
	}
	return out, errs
}

// checkRunJob checks the Indexed Job of the shards.
func checkRunJob(j *batchv1.Job, pvc *corev1.PersistentVolumeClaim) []error {
	var errs []error
	s := j.Spec
	if j.APIVersion != "batch/v1" || j.Kind != "Job" {
		errs = append(errs, fmt.Errorf("%s %s, want batch/v1 Job", j.APIVersion, j.Kind))
	}
	if s.CompletionMode == nil || *s.CompletionMode != batchv1.IndexedCompletion {
		errs = append(errs, fmt.Errorf("completionMode is not Indexed: the pods get no JOB_COMPLETION_INDEX"))
	}
	if s.Completions == nil || *s.Completions < 1 {
		return append(errs, fmt.Errorf("completions not set"))
	}
	if s.Parallelism != nil && *s.Parallelism > *s.Completions {
		errs = append(errs, fmt.Errorf("parallelism %d > completions %d", *s.Parallelism, *s.Completions))
	}
	if len(s.Template.Spec.Containers) != 1 {
		return append(errs, fmt.Errorf("%d containers, want 1", len(s.Template.Spec.Containers)))
	}
	c := s.Template.Spec.Containers[0]
	if n, _ := env(c, "VRAM_SHARD_COUNT"); n != strconv.Itoa(int(*s.Completions)) {
		errs = append(errs, fmt.Errorf("VRAM_SHARD_COUNT %q, want spec.completions %d", n, *s.Completions))
	}
	if _, ok := env(c, "JOB_COMPLETION_INDEX"); ok {
		errs = append(errs, fmt.Errorf("JOB_COMPLETION_INDEX is set by hand; Kubernetes sets it in each pod"))
	}
	if gpu := c.Resources.Limits[corev1.ResourceName("nvidia.com/gpu")]; gpu.Cmp(resource.MustParse("1")) != 0 {
		errs = append(errs, fmt.Errorf("limits nvidia.com/gpu is %q, want 1", gpu.String()))
	}
	out, serr := checkShared(s.Template.Spec, c, pvc)
	errs = append(errs, serr...)
	cmd := append(slices.Clone(c.Command), c.Args...)
	if len(cmd) < 2 || path.Base(cmd[0]) != "vram" || cmd[1] != "run" {
		errs = append(errs, fmt.Errorf("command %q, want vram run", cmd))
	}
	if i := slices.Index(cmd, "--out"); i < 0 || i+1 >= len(cmd) || (cmd[i+1] != "$(VRAM_OUT)" && cmd[i+1] != out) {
		errs = append(errs, fmt.Errorf("command %q does not write --out $(VRAM_OUT)", cmd))
	}
	if slices.ContainsFunc(cmd, func(a string) bool { return strings.HasPrefix(a, "--shard") }) {
		errs = append(errs, fmt.Errorf("command %q gives --shard: every pod would run the same shard", cmd))
	}
	return errs
}

// checkMergeJob checks the Job that gathers the parts.
func checkMergeJob(j *batchv1.Job, runOut string, pvc *corev1.PersistentVolumeClaim) []error {
	var errs []error
	if j.APIVersion != "batch/v1" || j.Kind != "Job" {
		errs = append(errs, fmt.Errorf("%s %s, want batch/v1 Job", j.APIVersion, j.Kind))
	}
	if c := j.Spec.Completions; c != nil && *c != 1 || j.Spec.CompletionMode != nil && *j.Spec.CompletionMode == batchv1.IndexedCompletion {
		errs = append(errs, fmt.Errorf("the merge is one pod, not indexed"))
	}
	if len(j.Spec.Template.Spec.Containers) != 1 {
		return append(errs, fmt.Errorf("%d containers, want 1", len(j.Spec.Template.Spec.Containers)))
	}
	c := j.Spec.Template.Spec.Containers[0]
	if _, ok := c.Resources.Limits[corev1.ResourceName("nvidia.com/gpu")]; ok {
		errs = append(errs, fmt.Errorf("the merge asks for a GPU; it needs none"))
	}
	out, serr := checkShared(j.Spec.Template.Spec, c, pvc)
	errs = append(errs, serr...)
	if out != runOut {
		errs = append(errs, fmt.Errorf("VRAM_OUT %q, but the run Job writes %q", out, runOut))
	}
	cmd := append(slices.Clone(c.Command), c.Args...)
	if len(cmd) < 3 || path.Base(cmd[0]) != "vram" || cmd[1] != "merge" || (cmd[len(cmd)-1] != "$(VRAM_OUT)" && cmd[len(cmd)-1] != out) {
		errs = append(errs, fmt.Errorf("command %q, want vram merge $(VRAM_OUT)", cmd))
	}
	return errs
}

func checkPVC(p *corev1.PersistentVolumeClaim) []error {
	if p.APIVersion != "v1" || p.Kind != "PersistentVolumeClaim" {
		return []error{fmt.Errorf("%s %s, want v1 PersistentVolumeClaim", p.APIVersion, p.Kind)}
	}
	if !slices.Contains(p.Spec.AccessModes, corev1.ReadWriteMany) {
		return []error{fmt.Errorf("access modes %v: the pods of several nodes write to it at once, want ReadWriteMany", p.Spec.AccessModes)}
	}
	return nil
}

func TestManifests(t *testing.T) {
	run, merge, pvc := manifests(t)
	errs := append(checkPVC(pvc), checkRunJob(run, pvc)...)
	out, _ := env(run.Spec.Template.Spec.Containers[0], "VRAM_OUT")
	errs = append(errs, checkMergeJob(merge, out, pvc)...)
	for _, err := range errs {
		t.Error(err)
	}
}

// TestChecksCatch: each check fails on a manifest broken the way it
// guards against, so TestManifests cannot pass by checking nothing.
func TestChecksCatch(t *testing.T) {
	for name, tc := range map[string]struct {
		breakIt func(run, merge *batchv1.Job, pvc *corev1.PersistentVolumeClaim)
		want    string
	}{
		"not indexed":   {func(r, _ *batchv1.Job, _ *corev1.PersistentVolumeClaim) { r.Spec.CompletionMode = nil }, "not Indexed"},
		"count differs": {func(r, _ *batchv1.Job, _ *corev1.PersistentVolumeClaim) { *r.Spec.Completions = 8 }, "VRAM_SHARD_COUNT"},
		"no gpu": {func(r, _ *batchv1.Job, _ *corev1.PersistentVolumeClaim) {
			delete(r.Spec.Template.Spec.Containers[0].Resources.Limits, "nvidia.com/gpu")
		}, "nvidia.com/gpu"},
		"two gpus": {func(r, _ *batchv1.Job, _ *corev1.PersistentVolumeClaim) {
			r.Spec.Template.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"] = resource.MustParse("2")
		}, "nvidia.com/gpu"},
		"out not shared": {func(r, _ *batchv1.Job, _ *corev1.PersistentVolumeClaim) {
			r.Spec.Template.Spec.Containers[0].Env[1].Value = "/tmp/r.npy"
		}, "not on a writable mount"},
		"other claim": {func(_, m *batchv1.Job, _ *corev1.PersistentVolumeClaim) {
			m.Spec.Template.Spec.Volumes[0].PersistentVolumeClaim.ClaimName = "elsewhere"
		}, "not on a writable mount"},
		"fixed shard": {func(r, _ *batchv1.Job, _ *corev1.PersistentVolumeClaim) {
			c := &r.Spec.Template.Spec.Containers[0]
			c.Args = append(c.Args, "--shard", "0/4")
		}, "every pod would run the same shard"},
		"read once": {func(_, _ *batchv1.Job, p *corev1.PersistentVolumeClaim) {
			p.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
		}, "ReadWriteMany"},
		"merge elsewhere": {func(_, m *batchv1.Job, _ *corev1.PersistentVolumeClaim) {
			m.Spec.Template.Spec.Containers[0].Env[0].Value = "/results/other.npy"
		}, "but the run Job writes"},
	} {
		t.Run(name, func(t *testing.T) {
			run, merge, pvc := manifests(t)
			tc.breakIt(run, merge, pvc)
			errs := append(checkPVC(pvc), checkRunJob(run, pvc)...)
			errs = append(errs, checkMergeJob(merge, "/results/r.npy", pvc)...)
			for _, err := range errs {
				if strings.Contains(err.Error(), tc.want) {
					return
				}
			}
			t.Fatalf("no error says %q; got %v", tc.want, errs)
		})
	}
}

// TestStrictDecode: a misspelt field is an error, not silently dropped.
func TestStrictDecode(t *testing.T) {
	b, err := os.ReadFile("job.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(b), "completionMode:", "completionMod:", 1)
	if err := yaml.UnmarshalStrict([]byte(bad), &batchv1.Job{}); err == nil || !strings.Contains(err.Error(), "completionMod") {
		t.Fatalf("a misspelt field decoded: %v", err)
	}
}
