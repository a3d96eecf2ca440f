package broker

import (
	"errors"
	"strings"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device/sim"
)

// TestAtNeedsNoRegistry: a manager given the broker as a value (At)
// takes its lease with no dialer registered with vram, as in a program
// that never links this package's init; a socket given by name
// (WithBroker) then fails with ErrNoBroker, saying what to pass instead.
func TestAtNeedsNoRegistry(t *testing.T) {
	vram.RegisterBroker(nil)
	t.Cleanup(func() { vram.RegisterBroker(dialNamed) })
	s, path := startServer(t, oneDevice(64*MiB))
	tests := map[string]struct {
		opts    []vram.Option
		wantErr error
		mention string
	}{
		"by value": {opts: []vram.Option{vram.WithLease(vram.LeaseOptions{Broker: At(path, WithLogger(quiet)), Device: "0", Name: "by-value"})}},
		"by value over a name": {opts: []vram.Option{vram.WithBroker(path + ".none"),
			vram.WithLease(vram.LeaseOptions{Broker: At(path), Device: "0", Name: "by-value"})}},
		"by name": {opts: []vram.Option{vram.WithBroker(path), vram.WithLease(vram.LeaseOptions{Device: "0"})},
			wantErr: vram.ErrNoBroker, mention: "broker.At("},
		"no broker there": {opts: []vram.Option{vram.WithLease(vram.LeaseOptions{Broker: At(path + ".none"), Device: "0"})},
			wantErr: ErrUnavailable, mention: "start vram broker, or point $VRAM_BROKER (--socket) at a broker's socket: there is no socket " + path + ".none"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev, err := sim.New(sim.Config{TotalBytes: 64 * MiB, NoContext: true, AddressOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			m, err := vram.New(dev, append(tc.opts, vram.WithLogger(quiet))...)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.mention) {
					t.Fatalf("New = %v; want an error wrapping %v that mentions %q", err, tc.wantErr, tc.mention)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ls, ok := m.Lease()
			st := s.Status()
			if !ok || len(st.Devices[0].Leases) != 1 || st.Devices[0].Leases[0].Name != "by-value" || !strings.Contains(ls.ID, st.Devices[0].Leases[0].ID) {
				t.Errorf("the manager's lease %+v (%v); the broker's %+v: want the one lease, by-value", ls, ok, st.Devices[0].Leases)
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestAtNamesItsSocket(t *testing.T) {
	if got := At("/run/vram/broker.sock").String(); got != "/run/vram/broker.sock" {
		t.Errorf("At(...).String() = %q; want the socket", got)
	}
}
