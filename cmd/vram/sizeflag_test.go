package main

import (
	"strings"
	"testing"
)

func TestSizeFlagSet(t *testing.T) {
	tests := map[string]struct {
		text    string
		want    uint64
		wantErr bool
	}{
		"MiB":       {text: "256MiB", want: 256 << 20},
		"GiB":       {text: "40GiB", want: 40 << 30},
		"bytes":     {text: "4096", want: 4096},
		"spaces":    {text: " 1 GiB ", want: 1 << 30},
		"zero":      {text: "0", wantErr: true},
		"zero MiB":  {text: "0MiB", wantErr: true},
		"empty":     {text: "", wantErr: true},
		"no number": {text: "MiB", wantErr: true},
		"bad unit":  {text: "12x", wantErr: true},
		"negative":  {text: "-1GiB", wantErr: true},
		"overflow":  {text: "99999999999EiB", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newSizeFlag("1MiB", "256MiB")
			err := f.Set(tc.text)
			if tc.wantErr {
				// A refused value leaves the default as it was.
				if err == nil || !strings.Contains(err.Error(), "want a positive size such as 256MiB") ||
					f.bytes != 1<<20 || f.text != "1MiB" || f.set {
					t.Errorf("Set(%q) = %v, leaving %+v; want an error and the default", tc.text, err, f)
				}
				return
			}
			if err != nil || f.bytes != tc.want || f.text != tc.text || !f.set {
				t.Errorf("Set(%q) = %v, %+v; want %d bytes", tc.text, err, f, tc.want)
			}
		})
	}
}

// TestTypedFlagErrors runs command lines with a bad size or device spec:
// each is a usage error, before anything is opened, that names the flag
// and the value given.
func TestTypedFlagErrors(t *testing.T) {
	trace := "../../../shared/traces/k_fullstep.csv"
	tests := map[string]struct {
		args []string
		want []string // in stderr
	}{
		"run --vram bad unit":     {[]string{"run", "--vram", "12x"}, []string{`--vram "12x": want a positive size such as 256MiB`}},
		"run --vram zero":         {[]string{"run", "--vram=0"}, []string{`--vram "0": want a positive size`}},
		"run --vram empty":        {[]string{"run", "--vram="}, []string{`--vram "": want a positive size`}},
		"run --vram below a page": {[]string{"run", "--vram", "1KiB"}, []string{"--vram 1KiB: want at least 2 MiB"}},
		"run --vram bytes":        {[]string{"run", "--device", "sim", "--vram", "64"}, []string{"--vram 64 (read as 64 bytes"}},
		"run --host-mem bad":      {[]string{"run", "--host-mem", "lots"}, []string{`--host-mem "lots": want a positive size such as 512MiB`}},
		"run --host-mem zero":     {[]string{"run", "--host-mem", "0B"}, []string{`--host-mem "0B": want a positive size`}},
		"replay --vram bad":       {[]string{"replay", "--vram", "big", trace}, []string{`--vram "big": want a positive size such as 16GiB`}},
		"replay --vram small":     {[]string{"replay", "--vram", "1000", trace}, []string{"--vram 1000 (read as 1000 bytes", "want at least 2 MiB"}},
		"run --device unknown":    {[]string{"run", "--device", "tpu:0"}, []string{`--device "tpu:0": unknown backend "tpu"`}},
		"run --device bad option": {[]string{"run", "--device", "sim:colour=red"}, []string{`--device "sim:colour=red": unknown sim option "colour"`}},
		"run --device bad cuda":   {[]string{"run", "--device", "cuda:first"}, []string{`--device "cuda:first": cuda device "first"`}},
		"run --device sized twice": {[]string{"run", "--device", "sim:vram=1GiB", "--vram", "2GiB"},
			[]string{`--device "sim:vram=1GiB" sizes the device and so does --vram 2GiB`}},
		"run --devices bad option": {[]string{"run", "--devices", "sim;sim:colour=red"},
			[]string{`--devices "sim;sim:colour=red": device 2 of 2 ("sim:colour=red,ordinal=1"): unknown sim option "colour"`}},
		"run --devices sized twice": {[]string{"run", "--devices", "sim:vram=64MiB;sim", "--vram", "64MiB", "--runs", "10", "--steps", "10"},
			[]string{`--devices (the spec "sim:vram=64MiB,ordinal=0") sizes the device and so does --vram 64MiB`}},
		"run --devices bad cuda": {[]string{"run", "--devices", "sim;cuda:-1"}, []string{`--devices "sim;cuda:-1": device 2 of 2 ("cuda:-1"): cuda device "-1"`}},
		"run --devices empty":    {[]string{"run", "--devices", ";"}, []string{`--devices ";": device list ";" names no device`}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			stdout, stderr, code := cli(t, "", tc.args...)
			if code != exitUsage || stdout != "" {
				t.Errorf("exit %d, stdout %q; want %d and nothing on stdout\nstderr: %s", code, stdout, exitUsage, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr)
				}
			}
		})
	}
}
