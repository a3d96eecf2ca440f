package kubernetes

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// arg is the value after flag in args ("" and false if absent).
func arg(args []string, flag string) (string, bool) {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1], true
	}
	return "", false
}

// checkBroker checks the broker's DaemonSet: the socket on a hostPath the
// node's pods can mount, the host's pid namespace, no GPU taken from the
// scheduler but every GPU visible.
func checkBroker(d *appsv1.DaemonSet) []error {
	var errs []error
	if d.APIVersion != "apps/v1" || d.Kind != "DaemonSet" {
		errs = append(errs, fmt.Errorf("%s %s, want apps/v1 DaemonSet", d.APIVersion, d.Kind))
	}
	spec := d.Spec.Template.Spec
	if !spec.HostPID {
		errs = append(errs, fmt.Errorf("hostPID is false: the broker cannot see other pods' pids (SO_PEERCRED gives 0)"))
	}
	if d.Spec.Selector == nil || !matches(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		errs = append(errs, fmt.Errorf("the selector does not match the pod template's labels"))
	}
	if len(spec.Containers) != 1 {
		return append(errs, fmt.Errorf("%d containers, want 1", len(spec.Containers)))
	}
	c := spec.Containers[0]
	cmd := append(slices.Clone(c.Command), c.Args...)
	if len(cmd) < 2 || path.Base(cmd[0]) != "vram" || cmd[1] != "broker" {
		return append(errs, fmt.Errorf("command %q, want vram broker", cmd))
	}
	socket, ok := arg(cmd, "--socket")
	if !ok || !path.IsAbs(socket) {
		errs = append(errs, fmt.Errorf("command %q gives no absolute --socket", cmd))
	}
	if mode, ok := arg(cmd, "--socket-mode"); ok && mode != "0600" && mode != "0660" {
		errs = append(errs, fmt.Errorf("--socket-mode %s, want 0600 or 0660", mode))
	}
	shared := false
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil && v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathDirectoryOrCreate &&
				!m.ReadOnly && path.Dir(socket) == path.Clean(m.MountPath) {
				shared = true
			}
		}
	}
	if !shared {
		errs = append(errs, fmt.Errorf("the socket %q is not in a writable hostPath directory (DirectoryOrCreate) the node's pods can mount", socket))
	}
	if _, ok := c.Resources.Limits[corev1.ResourceName("nvidia.com/gpu")]; ok {
		errs = append(errs, fmt.Errorf("the broker asks for nvidia.com/gpu: it would take a GPU from the pods it serves"))
	}
	if v, _ := env(c, "NVIDIA_VISIBLE_DEVICES"); v != "all" {
		errs = append(errs, fmt.Errorf("NVIDIA_VISIBLE_DEVICES %q, want all: the broker divides every GPU of the node", v))
	}
	return append(errs, checkKey(spec, c, socket)...)
}

// checkKey checks that the broker's key lives in a hostPath directory of
// its own (it survives restarts), not the socket's, which leaseholders
// mount: root in any pod reads what it can reach, and the key makes every
// lease's token.
func checkKey(spec corev1.PodSpec, c corev1.Container, socket string) []error {
	cmd := append(slices.Clone(c.Command), c.Args...)
	key, ok := arg(cmd, "--key-file")
	switch {
	case !ok || !path.IsAbs(key):
		return []error{fmt.Errorf("command %q gives no absolute --key-file: the key would lie beside the socket, where leaseholders mount", cmd)}
	case path.Dir(key) == path.Dir(socket):
		return []error{fmt.Errorf("--key-file %s is in the socket's directory, which leaseholders mount", key)}
	}
	if v := hostPathOf(spec, c, path.Dir(key)); v == nil {
		return []error{fmt.Errorf("--key-file %s is not in a hostPath directory of the broker's: a restarted broker would take no lease back", key)}
	}
	return nil
}

// hostPathOf is the hostPath volume c mounts at dir, or nil.
func hostPathOf(spec corev1.PodSpec, c corev1.Container, dir string) *corev1.HostPathVolumeSource {
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil && path.Clean(m.MountPath) == path.Clean(dir) {
				return v.HostPath
			}
		}
	}
	return nil
}

// checkLeaseholder checks a leaseholder's Job against the broker's
// DaemonSet: it mounts the socket's directory read-only, points
// VRAM_BROKER at the socket, and mounts nothing of the broker's key.
func checkLeaseholder(j *batchv1.Job, d *appsv1.DaemonSet) []error {
	bc := d.Spec.Template.Spec.Containers[0]
	bcmd := append(slices.Clone(bc.Command), bc.Args...)
	socket, _ := arg(bcmd, "--socket")
	key, _ := arg(bcmd, "--key-file")
	hostOf := func(spec corev1.PodSpec, c corev1.Container, dir string) string {
		if v := hostPathOf(spec, c, dir); v != nil {
			return path.Clean(v.Path)
		}
		return ""
	}
	sockHost, keyHost := hostOf(d.Spec.Template.Spec, bc, path.Dir(socket)), hostOf(d.Spec.Template.Spec, bc, path.Dir(key))
	spec := j.Spec.Template.Spec
	var errs []error
	for _, c := range spec.Containers {
		if v, _ := env(c, "VRAM_BROKER"); v != socket {
			errs = append(errs, fmt.Errorf("container %s: VRAM_BROKER %q, want the broker's socket %s", c.Name, v, socket))
		}
		mounted := false
		for _, m := range c.VolumeMounts {
			for _, v := range spec.Volumes {
				if v.Name != m.Name || v.HostPath == nil {
					continue
				}
				switch host := path.Clean(v.HostPath.Path); {
				case host == keyHost || strings.HasPrefix(keyHost, host+"/"):
					errs = append(errs, fmt.Errorf("container %s mounts %s, where the broker keeps its key", c.Name, host))
				case host == sockHost && !m.ReadOnly:
					errs = append(errs, fmt.Errorf("container %s mounts the broker's socket directory %s writable: it could swap the socket", c.Name, host))
				case host == sockHost && path.Clean(m.MountPath) == path.Dir(socket):
					mounted = true
				}
			}
		}
		if !mounted {
			errs = append(errs, fmt.Errorf("container %s does not mount the broker's socket directory %s (read-only) at %s", c.Name, sockHost, path.Dir(socket)))
		}
	}
	return errs
}

// leaseManifests are the broker's DaemonSet and the leaseholder's Job.
func leaseManifests(t *testing.T) (*appsv1.DaemonSet, *batchv1.Job) {
	d, j := &appsv1.DaemonSet{}, &batchv1.Job{}
	decode(t, "broker-daemonset.yaml", d)
	decode(t, "lease-job.yaml", j)
	return d, j
}

func TestLeaseJob(t *testing.T) {
	d, j := leaseManifests(t)
	for _, err := range checkLeaseholder(j, d) {
		t.Error(err)
	}
}

// Each check of the leaseholder fails on a Job broken its way.
func TestLeaseJobChecksCatch(t *testing.T) {
	for name, tc := range map[string]struct {
		breakIt func(j *batchv1.Job)
		want    string
	}{
		"writable socket directory": {func(j *batchv1.Job) { j.Spec.Template.Spec.Containers[0].VolumeMounts[0].ReadOnly = false }, "could swap the socket"},
		"mounts the key": {func(j *batchv1.Job) {
			s := &j.Spec.Template.Spec
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "k", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib"}}})
			s.Containers[0].VolumeMounts = append(s.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "k", MountPath: "/k", ReadOnly: true})
		}, "where the broker keeps its key"},
		"another socket": {func(j *batchv1.Job) { j.Spec.Template.Spec.Containers[0].Env[0].Value = "/tmp/b.sock" }, "VRAM_BROKER"},
		"no socket":      {func(j *batchv1.Job) { j.Spec.Template.Spec.Containers[0].VolumeMounts = nil }, "does not mount"},
	} {
		t.Run(name, func(t *testing.T) {
			d, j := leaseManifests(t)
			tc.breakIt(j)
			for _, err := range checkLeaseholder(j, d) {
				if strings.Contains(err.Error(), tc.want) {
					return
				}
			}
			t.Fatalf("no error says %q", tc.want)
		})
	}
}

func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

func TestBrokerDaemonSet(t *testing.T) {
	var d appsv1.DaemonSet
	decode(t, "broker-daemonset.yaml", &d)
	for _, err := range checkBroker(&d) {
		t.Error(err)
	}
}

// Each check of the DaemonSet fails on a manifest broken its way.
func TestBrokerChecksCatch(t *testing.T) {
	for name, tc := range map[string]struct {
		breakIt func(d *appsv1.DaemonSet)
		want    string
	}{
		"no hostPID": {func(d *appsv1.DaemonSet) { d.Spec.Template.Spec.HostPID = false }, "hostPID"},
		"socket elsewhere": {func(d *appsv1.DaemonSet) {
			c := &d.Spec.Template.Spec.Containers[0]
			c.Args[slices.Index(c.Args, "--socket")+1] = "/tmp/b.sock"
		}, "not in a writable hostPath"},
		"emptyDir": {func(d *appsv1.DaemonSet) {
			d.Spec.Template.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
		}, "not in a writable hostPath"},
		"takes a GPU": {func(d *appsv1.DaemonSet) {
			d.Spec.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceName("nvidia.com/gpu")] = d.Spec.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]
		}, "would take a GPU"},
		"open socket": {func(d *appsv1.DaemonSet) {
			c := &d.Spec.Template.Spec.Containers[0]
			c.Args[slices.Index(c.Args, "--socket-mode")+1] = "0666"
		}, "--socket-mode 0666"},
		"selector": {func(d *appsv1.DaemonSet) { d.Spec.Template.Labels = map[string]string{"x": "y"} }, "selector"},
		"key beside the socket": {func(d *appsv1.DaemonSet) {
			c := &d.Spec.Template.Spec.Containers[0]
			c.Args[slices.Index(c.Args, "--key-file")+1] = "/run/vram/broker.key"
		}, "in the socket's directory"},
		"no key file": {func(d *appsv1.DaemonSet) {
			c := &d.Spec.Template.Spec.Containers[0]
			i := slices.Index(c.Args, "--key-file")
			c.Args = slices.Delete(c.Args, i, i+2)
		}, "no absolute --key-file"},
		"key not kept": {func(d *appsv1.DaemonSet) {
			d.Spec.Template.Spec.Containers[0].VolumeMounts = d.Spec.Template.Spec.Containers[0].VolumeMounts[:1]
		}, "not in a hostPath directory"},
	} {
		t.Run(name, func(t *testing.T) {
			var d appsv1.DaemonSet
			decode(t, "broker-daemonset.yaml", &d)
			tc.breakIt(&d)
			for _, err := range checkBroker(&d) {
				if strings.Contains(err.Error(), tc.want) {
					return
				}
			}
			t.Fatalf("no error says %q", tc.want)
		})
	}
}
