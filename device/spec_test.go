package device_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vramkit/vram/device"
)

func TestParseSpec(t *testing.T) {
	tests := map[string]struct {
		spec    string
		backend string
		info    device.SpecInfo
		sizable bool
		wantErr string // "": a good spec
	}{
		"sim":              {spec: "sim", backend: "sim", info: device.SpecInfo{Granularity: 2 << 20}, sizable: true},
		"sim sized":        {spec: "sim:vram=1GiB", backend: "sim", info: device.SpecInfo{TotalBytes: 1 << 30, Granularity: 2 << 20}},
		"sim small page":   {spec: " SIM : granularity=64KiB ", backend: "sim", info: device.SpecInfo{Granularity: 64 << 10}, sizable: true},
		"auto reads sim's": {spec: "auto:vram=64MiB", backend: "auto", info: device.SpecInfo{TotalBytes: 64 << 20, Granularity: 2 << 20}},
		"auto":             {spec: "auto", backend: "auto", info: device.SpecInfo{Granularity: 2 << 20}, sizable: true},
		"no backend":       {spec: ":1", wantErr: "no backend name"},
		"unknown":          {spec: "tpu:0", wantErr: `unknown backend "tpu"`},
		"not linked":       {spec: "cuda:0", wantErr: `backend "cuda" is not linked`},
		"bad sim option":   {spec: "sim:colour=red", wantErr: `unknown sim option "colour"`},
		"bad auto option":  {spec: "auto:vram=lots", wantErr: `sim option vram="lots"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s, err := device.ParseSpec(tc.spec)
			if tc.wantErr != "" {
				if !errors.Is(err, device.ErrBadSpec) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseSpec(%q) = %v, want an error wrapping ErrBadSpec saying %q", tc.spec, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Backend() != tc.backend || s.Info() != tc.info || s.Sizable() != tc.sizable || s.String() != strings.TrimSpace(tc.spec) {
				t.Errorf("ParseSpec(%q) = %q: backend %q, %+v, sizable %v; want %q, %+v, %v",
					tc.spec, s, s.Backend(), s.Info(), s.Sizable(), tc.backend, tc.info, tc.sizable)
			}
		})
	}
}

func TestSpecWithTotal(t *testing.T) {
	tests := map[string]struct {
		spec    string
		total   uint64
		wantErr string // "": it opens a device of total bytes
	}{
		"sim":            {spec: "sim", total: 64 << 20},
		"sim, options":   {spec: "sim:granularity=64KiB,backed=false", total: 1 << 20},
		"auto, fallback": {spec: "auto", total: 32 << 20},
		"sized already":  {spec: "sim:vram=1GiB", total: 64 << 20, wantErr: "gives the device's size already"},
		"zero":           {spec: "sim", total: 0, wantErr: "a size of 0 bytes"},
		"too large":      {spec: "sim", total: 1 << 60, wantErr: "TotalBytes"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv(device.EnvDevice, "")
			s, err := device.ParseSpec(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			sized, err := s.WithTotal(tc.total)
			var dev device.Device
			if err == nil {
				dev, _, err = device.OpenSpec(sized)
			}
			if tc.wantErr != "" {
				if !errors.Is(err, device.ErrBadSpec) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("%q at %d bytes: %v, want an error wrapping ErrBadSpec saying %q", tc.spec, tc.total, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			info := dev.Info()
			if info.TotalBytes != tc.total || sized.Info().TotalBytes != tc.total || !sized.SizedBy(info) {
				t.Errorf("%q at %d bytes opened %d bytes (spec says %d, sized by it: %v)",
					tc.spec, tc.total, info.TotalBytes, sized.Info().TotalBytes, sized.SizedBy(info))
			}
			if sized.String() != s.String() {
				t.Errorf("WithTotal changed the spec's text: %q, was %q", sized, s)
			}
		})
	}
}

func TestSpecSizedBy(t *testing.T) {
	tests := map[string]struct {
		spec    string
		backend string // of the device opened
		want    bool
	}{
		"sim on sim":  {"sim", "sim", true},
		"auto on sim": {"auto", "sim", true},
		"auto on gpu": {"auto", "cuda", false},
		"sim on gpu":  {"sim", "cuda", false}, // not the device it opened
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s, err := device.ParseSpec(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.SizedBy(device.Info{Backend: tc.backend}); got != tc.want {
				t.Errorf("%q SizedBy(%s) = %v, want %v", tc.spec, tc.backend, got, tc.want)
			}
		})
	}
}

func TestOpenZeroSpec(t *testing.T) {
	if _, _, err := device.OpenSpec(device.Spec{}); !errors.Is(err, device.ErrBadSpec) {
		t.Errorf("OpenSpec(Spec{}) = %v, want ErrBadSpec", err)
	}
}

// FuzzParseSpec checks that ParseSpec refuses only with ErrBadSpec, and
// that a spec it reads reads the same again from its text.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{"sim", "auto:vram=1GiB", "sim:granularity=64KiB,backed=false", ":", "cuda:1", "sim:vram="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		t.Setenv(device.EnvDevice, "sim")
		s, err := device.ParseSpec(text)
		if err != nil {
			if !errors.Is(err, device.ErrBadSpec) {
				t.Fatalf("ParseSpec(%q) = %v, not ErrBadSpec", text, err)
			}
			return
		}
		again, err := device.ParseSpec(s.String())
		if err != nil || again.Backend() != s.Backend() || again.Info() != s.Info() {
			t.Fatalf("ParseSpec(%q) = %+v, but its text reads %+v, %v", text, s, again, err)
		}
	})
}

func TestReadSpecs(t *testing.T) {
	tests := map[string]struct {
		list    string
		want    []string // the specs' texts
		wantErr string   // "": a good list
	}{
		"two sims":        {list: "sim:vram=64MiB;sim", want: []string{"sim:vram=64MiB,ordinal=0", "sim:ordinal=1"}},
		"count":           {list: "sim:count=2", want: []string{"sim:ordinal=0", "sim:ordinal=1"}},
		"bad option":      {list: "sim;sim:colour=red", wantErr: `device 2 of 2 ("sim:colour=red,ordinal=1"): unknown sim option "colour"`},
		"bad list":        {list: ";", wantErr: "names no device"},
		"unlinked in one": {list: "sim;cuda:0", wantErr: `device 2 of 2 ("cuda:0"): backend "cuda" is not linked`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			specs, err := device.ReadSpecs(tc.list)
			if tc.wantErr != "" {
				if !errors.Is(err, device.ErrBadSpec) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ReadSpecs(%q) = %v, want an error wrapping ErrBadSpec saying %q", tc.list, err, tc.wantErr)
				}
				return
			}
			var got []string
			for _, s := range specs {
				got = append(got, s.String())
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("ReadSpecs(%q) = %q, %v; want %q", tc.list, got, err, tc.want)
			}
		})
	}
}

func TestRegisterSpecReaderTwice(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "spec reader registered twice: sim") {
			t.Errorf("registering sim's spec reader twice: recovered %v, want a panic naming it", r)
		}
	}()
	device.RegisterSpecReader("sim", device.SpecReader{})
}
