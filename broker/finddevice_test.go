package broker

import (
	"errors"
	"strings"
	"testing"
)

// TestFindDevice: a device is found by index, name or id; an error says
// first what may be given, each device by index and name, and then what
// was wrong.
func TestFindDevice(t *testing.T) {
	devs := []DeviceInfo{{Index: 0, Name: "cuda:0", ID: "GPU-a"}, {Index: 1, Name: "sim:shared=b", ID: "sim:shared=b"}}
	for name, tc := range map[string]struct {
		spec, id string
		want     int    // the index found
		err      string // or the error's start
	}{
		"by index":   {spec: "1", want: 1},
		"by name":    {spec: "cuda:0", want: 0},
		"by id":      {id: "sim:shared=b", want: 1},
		"no such":    {spec: "3", err: `name one of the broker's devices, 0 or cuda:0 (id GPU-a); 1 or sim:shared=b: it has no device "3"`},
		"no id":      {err: "name one of the broker's devices, 0 or cuda:0 (id GPU-a); 1 or sim:shared=b: this device has no id"},
		"another id": {id: "GPU-z", err: `name one of the broker's devices, 0 or cuda:0 (id GPU-a); 1 or sim:shared=b, or serve this one: device "GPU-z" is none of them`},
	} {
		t.Run(name, func(t *testing.T) {
			d, err := FindDevice(devs, tc.spec, tc.id)
			switch {
			case tc.err == "" && (err != nil || d.Index != tc.want):
				t.Errorf("FindDevice = %+v, %v; want device %d", d, err, tc.want)
			case tc.err != "" && (!errors.Is(err, ErrNotFound) || !strings.HasPrefix(err.Error(), tc.err)):
				t.Errorf("FindDevice = %v; want ErrNotFound starting %q", err, tc.err)
			}
		})
	}
}
