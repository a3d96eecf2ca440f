package device_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/vramkit/vram/device"
	_ "github.com/vramkit/vram/device/sim"
)

// The simulator starts goroutines: every test must close its devices.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOpen: Open reads a spec's text (or $VRAM_DEVICE's) and opens the
// device it names; OpenSpec of the same text read by ParseSpec opens the
// same device and says whether auto fell back.
func TestOpen(t *testing.T) {
	tests := map[string]struct {
		spec, env string
		total     uint64
		backed    bool
		fellBack  bool
	}{
		"sim":               {spec: "sim", total: 8 << 30, backed: true},
		"sim with vram":     {spec: "sim:vram=256MiB", total: 256 << 20, backed: true},
		"case and spaces":   {spec: "  SIM : vram = 1GiB ", total: 1 << 30, backed: true},
		"address-only":      {spec: "sim:vram=80GiB,backed=false", total: 80 << 30},
		"env default":       {spec: "", env: "sim:vram=128MiB", total: 128 << 20, backed: true},
		"auto falls back":   {spec: "auto", total: 8 << 30, backed: true, fellBack: true},
		"auto with options": {spec: "auto:vram=64MiB", total: 64 << 20, backed: true, fellBack: true},
		"unset env is auto": {spec: "", total: 8 << 30, backed: true, fellBack: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv(device.EnvDevice, tc.env)
			d, err := device.Open(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			info := d.Info()
			if info.Backend != "sim" || info.TotalBytes != tc.total || info.Backed != tc.backed {
				t.Errorf("Open(%q) = %+v; want sim, total %d, backed %v", tc.spec, info, tc.total, tc.backed)
			}
			spec, err := device.ParseSpec(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			d2, fallback, err := device.OpenSpec(spec)
			if err != nil {
				t.Fatal(err)
			}
			defer d2.Close()
			if got := d2.Info(); got.TotalBytes != info.TotalBytes || got.Backed != info.Backed {
				t.Errorf("OpenSpec(%q) = %+v; want the device Open opened, %+v", tc.spec, got, info)
			}
			if tc.fellBack != (fallback != nil) {
				t.Errorf("fallback = %v, want one: %v", fallback, tc.fellBack)
			}
			if fallback != nil && !errors.Is(fallback, device.ErrNoDevice) {
				t.Errorf("fallback %v does not wrap ErrNoDevice", fallback)
			}
		})
	}
}

func TestOpenBad(t *testing.T) {
	tests := map[string]struct {
		spec     string
		also     error
		mentions string
	}{
		"unknown backend":      {spec: "tpu", mentions: "linked: sim"},
		"cuda not linked":      {spec: "cuda:0", mentions: "import _"},
		"no name":              {spec: ":vram=1GiB", mentions: "no backend name"},
		"unknown option":       {spec: "sim:colour=red", mentions: "known: vram"},
		"bad size":             {spec: "sim:vram=lots", mentions: "vram"},
		"option with no =":     {spec: "sim:backed", mentions: "key=value"},
		"bad granularity":      {spec: "sim:granularity=3MiB", also: device.ErrInvalidValue, mentions: "power of two"},
		"context too large":    {spec: "sim:vram=64MiB,context=64MiB", also: device.ErrInvalidValue, mentions: "leaves nothing"},
		"negative size":        {spec: "sim:vram=-8GiB", mentions: "negative"},
		"zero size":            {spec: "sim:vram=0", mentions: "must be > 0"},
		"empty backend opts":   {spec: "sim:,,vram", mentions: "key=value"},
		"unknown name says so": {spec: "gpu:0", mentions: "unknown backend \"gpu\" (want sim, cuda or auto"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := device.Open(tc.spec)
			if err == nil {
				d.Close()
				t.Fatalf("Open(%q) succeeded", tc.spec)
			}
			if !errors.Is(err, device.ErrBadSpec) {
				t.Errorf("Open(%q) = %v; want ErrBadSpec", tc.spec, err)
			}
			if tc.also != nil && !errors.Is(err, tc.also) {
				t.Errorf("Open(%q) = %v; want it to wrap %v too", tc.spec, err, tc.also)
			}
			if !strings.Contains(err.Error(), tc.mentions) {
				t.Errorf("Open(%q) = %v; want the message to mention %q", tc.spec, err, tc.mentions)
			}
		})
	}
}

func TestBackendsAndRegister(t *testing.T) {
	if !slices.Contains(device.Backends(), "sim") {
		t.Fatalf("Backends() = %v, want sim", device.Backends())
	}
	defer func() {
		if recover() == nil {
			t.Error("registering sim twice did not panic")
		}
	}()
	device.Register("sim", func(string) (device.Device, error) { return nil, nil })
}

func TestDefaultSpec(t *testing.T) {
	t.Setenv(device.EnvDevice, "")
	if got := device.DefaultSpec(); got != "auto" {
		t.Errorf("DefaultSpec with no env = %q, want auto", got)
	}
	t.Setenv(device.EnvDevice, " sim:vram=1GiB ")
	if got := device.DefaultSpec(); got != "sim:vram=1GiB" {
		t.Errorf("DefaultSpec = %q", got)
	}
}

func TestPtr(t *testing.T) {
	p := device.Ptr(0x7f0000000000)
	if p.String() != "0x7f0000000000" || p.Add(0x100).String() != "0x7f0000000100" {
		t.Errorf("Ptr formatting: %v, %v", p, p.Add(0x100))
	}
}

func ExampleOpen() {
	dev, err := device.Open("sim:vram=1GiB,context=64MiB")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	free, total, _ := dev.MemInfo()
	fmt.Println(dev.Info().Backend, total>>20, "MiB total,", free>>20, "MiB free")
	// Output: sim 1024 MiB total, 960 MiB free
}

// TestHugeSpecClipped: a spec of a megabyte, wrong in each place it can
// be, gives an error of a few hundred bytes that quotes it clipped, with
// its length: ParseSpec quotes the part at fault once, Open the spec
// once more, ParseSpecs the item and its count.
func TestHugeSpecClipped(t *testing.T) {
	huge := strings.Repeat("a", 1<<20)
	digits := strings.Repeat("9", 1<<20)
	tests := map[string]string{
		"backend":        huge + ":0",
		"option":         "sim:" + huge,
		"option name":    "sim:" + huge + "=1",
		"size":           "sim:vram=" + digits,
		"shared name":    "sim:shared=" + huge,
		"bool":           "sim:backed=" + huge,
		"count":          "sim:workers=" + digits,
		"duration":       "sim:kerneltime=" + huge,
		"directory":      "sim:dir=" + huge,
		"list count":     "sim:count=" + digits,
		"list no device": strings.Repeat(";", 1<<20),
	}
	for name, spec := range tests {
		t.Run(name, func(t *testing.T) {
			check := func(call string, err error, most int) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s succeeded", call)
				}
				msg := err.Error()
				if !errors.Is(err, device.ErrBadSpec) || len(msg) > 600 || !strings.Contains(msg, " bytes)") {
					t.Errorf("%s: %d bytes of error (%.300s…); want at most 600 that wrap ErrBadSpec and give the length", call, len(msg), msg)
				}
				run := strings.Repeat(spec[len(spec)/2:len(spec)/2+1], 48) // one in each clipped quote
				if n := strings.Count(msg, run); n > most {
					t.Errorf("%s quotes the spec %d times: %.300s", call, n, msg)
				}
			}
			if strings.HasPrefix(name, "list") {
				_, err := device.ParseSpecs(spec)
				check("ParseSpecs", err, 2) // the item, and the count in it
				return
			}
			_, err := device.ParseSpec(spec)
			check("ParseSpec", err, 1)
			d, err := device.Open(spec)
			if err == nil {
				d.Close()
			}
			check("Open", err, 2)
		})
	}
}
