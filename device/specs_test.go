package device_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/vramkit/vram/device"
)

func TestParseSpecs(t *testing.T) {
	for list, want := range map[string][]string{
		"sim":                                  {"sim"},
		"sim:count=3":                          {"sim:ordinal=0", "sim:ordinal=1", "sim:ordinal=2"},
		"sim:vram=1GiB,count=2":                {"sim:vram=1GiB,ordinal=0", "sim:vram=1GiB,ordinal=1"},
		"sim:vram=256MiB;sim:vram=128MiB":      {"sim:vram=256MiB,ordinal=0", "sim:vram=128MiB,ordinal=1"},
		"sim:vram=256MiB,bw=8GB,sim:vram=1GiB": {"sim:vram=256MiB,bw=8GB,ordinal=0", "sim:vram=1GiB,ordinal=1"},
		"sim,sim":                              {"sim:ordinal=0", "sim:ordinal=1"},
		"cuda:0;cuda:1":                        {"cuda:0", "cuda:1"},
		"sim:ordinal=5;sim":                    {"sim:ordinal=5", "sim:ordinal=1"},
	} {
		got, err := device.ParseSpecs(list)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseSpecs(%q) = %q, %v; want %q", list, got, err, want)
		}
	}
	for _, bad := range []string{"", ";", "sim:count=0", "sim:count=x", "cuda:count=2", "sim:count=2,count=3", "sim:count=65", "sim:count=2,ordinal=1"} {
		if _, err := device.ParseSpecs(bad); !errors.Is(err, device.ErrBadSpec) {
			t.Errorf("ParseSpecs(%q): %v; want ErrBadSpec", bad, err)
		}
	}
}

func TestOpenAllSims(t *testing.T) {
	devs, err := device.OpenAll("sim:vram=64MiB,count=2;sim:vram=32MiB")
	if err != nil {
		t.Fatal(err)
	}
	var totals []uint64
	for i, d := range devs {
		if got := d.Info().Ordinal; got != i {
			t.Errorf("device %d has ordinal %d", i, got)
		}
		_, total, _ := d.MemInfo()
		totals = append(totals, total)
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	}
	if want := []uint64{64 << 20, 64 << 20, 32 << 20}; !slices.Equal(totals, want) {
		t.Errorf("totals %v; want %v", totals, want)
	}
	if _, err := device.OpenAll("sim;sim:vram=oops"); !errors.Is(err, device.ErrBadSpec) {
		t.Errorf("OpenAll with a bad spec: %v; want ErrBadSpec", err)
	}
}

// "all" counts CUDA devices; this test binary links no CUDA backend, so
// it says there is none.
func TestParseSpecsAllWithoutCUDA(t *testing.T) {
	if _, err := device.ParseSpecs("all"); !errors.Is(err, device.ErrNoDevice) {
		t.Errorf("ParseSpecs(all) without the cuda backend: %v; want ErrNoDevice", err)
	}
}
