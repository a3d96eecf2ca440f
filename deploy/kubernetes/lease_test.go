package kubernetes

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// memoryAnnotation is the pod annotation lease-job.yaml sizes its lease
// by (cmd/vram's podMemoryAnnotation).
const memoryAnnotation = "vramkit.github.io/gpu-memory"

// podEnv is the container's environment as the kubelet makes it for pod
// meta: plain values, and the Downward API's metadata fields (an
// annotation the pod lacks is "").
func podEnv(meta map[string]string, annotations map[string]string, c corev1.Container) (map[string]string, error) {
	vars := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			vars[e.Name] = expand(e.Value, vars)
		case e.ValueFrom.FieldRef != nil:
			p := e.ValueFrom.FieldRef.FieldPath
			if m := regexp.MustCompile(`^metadata\.annotations\['([^']+)'\]$`).FindStringSubmatch(p); m != nil {
				vars[e.Name] = annotations[m[1]]
			} else if v, ok := meta[p]; ok {
				vars[e.Name] = v
			} else {
				return nil, fmt.Errorf("env %s: a field path this test does not resolve: %s", e.Name, p)
			}
		default:
			return nil, fmt.Errorf("env %s: a source this test does not resolve", e.Name)
		}
	}
	return vars, nil
}

// expand is the kubelet's expansion of $(VAR) in a command's words: a
// variable of vars is replaced, any other reference kept as written, and
// $$ is a $.
func expand(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case strings.HasPrefix(s[i:], "$$"):
			b.WriteByte('$')
			i++
		case strings.HasPrefix(s[i:], "$("):
			if end := strings.IndexByte(s[i:], ')'); end > 0 {
				if v, ok := vars[s[i+2:i+end]]; ok {
					b.WriteString(v)
					i += end
					continue
				}
			}
			b.WriteByte(s[i])
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// checkLeaseSize checks that the leaseholder's lease is sized by its own
// annotation through the Downward API, that it is in the socket's group,
// and that it asks the scheduler for a GPU (checkLeaseholder checks the
// socket and the key).
func checkLeaseSize(j *batchv1.Job, d *appsv1.DaemonSet) []error {
	var errs []error
	spec := j.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		return []error{fmt.Errorf("%d containers, want 1", len(spec.Containers))}
	}
	c := spec.Containers[0]
	size := j.Spec.Template.Annotations[memoryAnnotation]
	if !regexp.MustCompile(`^[0-9]+(\.[0-9]+)?\s*[KMGT]i?B$`).MatchString(size) {
		errs = append(errs, fmt.Errorf("the pod's %s annotation is %q, want a size such as 8GiB", memoryAnnotation, size))
	}
	vars, err := podEnv(map[string]string{"metadata.name": j.Name}, j.Spec.Template.Annotations, c)
	if err != nil {
		return append(errs, err)
	}
	cmd := append(slices.Clone(c.Command), c.Args...)
	for i := range cmd {
		cmd[i] = expand(cmd[i], vars)
	}
	if len(cmd) < 2 || path.Base(cmd[0]) != "vram" || cmd[1] != "lease" || !slices.Contains(cmd, "--") {
		return append(errs, fmt.Errorf("command %q, want vram lease … -- PROGRAM", cmd))
	}
	if got, _ := arg(cmd, "--bytes"); got != size {
		errs = append(errs, fmt.Errorf("vram lease --bytes %q once expanded, want the pod's annotation %q (a Downward API variable)", got, size))
	}
	bc := d.Spec.Template.Spec.Containers[0]
	group, _ := arg(append(slices.Clone(bc.Command), bc.Args...), "--socket-group")
	sc := spec.SecurityContext
	if group != "" && (sc == nil || !slices.ContainsFunc(sc.SupplementalGroups, func(g int64) bool { return fmt.Sprint(g) == group })) {
		errs = append(errs, fmt.Errorf("the pod is not in the socket's group %s (securityContext.supplementalGroups)", group))
	}
	if q, ok := c.Resources.Limits[corev1.ResourceName("nvidia.com/gpu")]; !ok || q.Value() != 1 {
		errs = append(errs, fmt.Errorf("nvidia.com/gpu %v, want 1: the pod must be given a (time-sliced) GPU", q.String()))
	}
	return errs
}

func TestLeaseJobSize(t *testing.T) {
	d, j := leaseManifests(t)
	for _, err := range checkLeaseSize(j, d) {
		t.Error(err)
	}
}

// TestLeaseJobSizeChecksCatch: each check of the lease's size fails on a
// manifest broken the way it guards against.
func TestLeaseJobSizeChecksCatch(t *testing.T) {
	for name, tc := range map[string]struct {
		breakIt func(j *batchv1.Job)
		want    string
	}{
		"no annotation": {func(j *batchv1.Job) { delete(j.Spec.Template.Annotations, memoryAnnotation) }, "want a size"},
		"a fixed size":  {func(j *batchv1.Job) { j.Spec.Template.Spec.Containers[0].Args[2] = "4GiB" }, "want the pod's annotation"},
		"another annotation": {func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].Env[1].ValueFrom.FieldRef.FieldPath = "metadata.annotations['gpu']"
		}, "want the pod's annotation"},
		"no group": {func(j *batchv1.Job) { j.Spec.Template.Spec.SecurityContext = nil }, "socket's group"},
		"no gpu": {func(j *batchv1.Job) {
			delete(j.Spec.Template.Spec.Containers[0].Resources.Limits, "nvidia.com/gpu")
		}, "nvidia.com/gpu"},
		"not under vram lease": {func(j *batchv1.Job) {
			c := &j.Spec.Template.Spec.Containers[0]
			c.Command, c.Args = []string{"python"}, []string{"train.py"}
		}, "want vram lease"},
	} {
		t.Run(name, func(t *testing.T) {
			d, j := leaseManifests(t)
			tc.breakIt(j)
			for _, err := range checkLeaseSize(j, d) {
				if strings.Contains(err.Error(), tc.want) {
					return
				}
			}
			t.Fatalf("no error says %q; got %v", tc.want, checkLeaseSize(j, d))
		})
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "8GiB", "E": ""}
	for in, want := range map[string]string{
		"$(A)":       "8GiB",
		"x$(A)y$(A)": "x8GiBy8GiB",
		"$(E)":       "",
		"$(B)":       "$(B)", // unresolved: kept
		"$$(A)":      "$(A)", // escaped
		"$A":         "$A",
		"$(A":        "$(A",
	} {
		if got := expand(in, vars); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestLeaseJobRuns runs lease-job.yaml's command as the kubelet would:
// its environment from the pod (the annotation through the Downward API),
// $(VAR) expanded, against a real vram broker on a simulated 16 GiB GPU
// (a process's context 256 MiB), the program replaced by one that prints
// its lease. The pod is given 8 GiB less its context; without the
// annotation, vram lease refuses before asking the broker.
func TestLeaseJobRuns(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the broker's peers are checked on Linux")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to build vram")
	}
	dir := t.TempDir()
	vram := filepath.Join(dir, "vram")
	if b, err := exec.Command(goTool, "build", "-o", vram, "github.com/vramkit/vram/cmd/vram").CombinedOutput(); err != nil {
		t.Fatalf("go build vram: %v\n%s", err, b)
	}
	socket := startVramBroker(t, vram, filepath.Join(dir, "broker.sock"), "sim:vram=16GiB")
	for name, tc := range map[string]struct {
		annotate bool
		want     string // stdout
		stderr   string
		code     int
	}{
		"annotated":       {annotate: true, want: fmt.Sprint(8<<30-256<<20) + "\n", stderr: "vram lease: "},
		"annotation lost": {stderr: "--bytes is empty: want a size such as 8GiB (from Kubernetes: is the pod's " + memoryAnnotation + " annotation set?", code: 2},
	} {
		t.Run(name, func(t *testing.T) {
			_, j := leaseManifests(t)
			if !tc.annotate {
				delete(j.Spec.Template.Annotations, memoryAnnotation)
			}
			c := j.Spec.Template.Spec.Containers[0]
			vars, err := podEnv(map[string]string{"metadata.name": j.Name}, j.Spec.Template.Annotations, c)
			if err != nil {
				t.Fatal(err)
			}
			vars["VRAM_BROKER"] = socket // the node's socket, here
			args := append(slices.Clone(c.Command[1:]), c.Args...)
			for i := range args {
				args[i] = expand(args[i], vars)
			}
			args = append(args[:slices.Index(args, "--")+1], "sh", "-c", `echo "$VRAM_LEASE_BYTES"`)
			cmd := exec.Command(vram, args...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
			for k, v := range vars {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err = cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code || out.String() != tc.want || !strings.Contains(errb.String(), tc.stderr) {
				t.Errorf("vram %q: exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr saying %q",
					args, code, out.String(), errb.String(), tc.code, tc.want, tc.stderr)
			}
		})
	}
}

// startVramBroker runs `vram broker` on socket over devices until the
// test ends, and waits until it answers.
func startVramBroker(t *testing.T, vram, socket, devices string) string {
	t.Helper()
	cmd := exec.Command(vram, "broker", "--devices", devices, "--socket", socket)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for exec.Command(vram, "broker", "status", "--socket", socket).Run() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("vram broker does not answer on %s:\n%s", socket, errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return socket
}
