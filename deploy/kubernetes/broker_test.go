package kubernetes

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
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
	return errs
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
