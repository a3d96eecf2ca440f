package capi

// What the client API asks of a whole manager: its limit mode and shares,
// its groups' members, frees and invalidations, fresh streams after a
// reset (vram.Manager's methods, under the manager's use).

import (
	"fmt"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
)

// do runs f on m's vram manager as the call op; its error is prefixed
// with op.
func (m *Manager) do(op string, f func(*vram.Manager) error) error {
	done, err := m.use(op)
	if err != nil {
		return err
	}
	defer done()
	if err := f(m.Manager()); err != nil {
		return fmt.Errorf("vram: %s: %w", op, err)
	}
	return nil
}

// SetLimitMode sets the limit mode (0 passive, 1 active).
func (m *Manager) SetLimitMode(mode int) error {
	if mode != int(vram.Passive) && mode != int(vram.Active) {
		return fmt.Errorf("vram: limit mode %d: want %d (passive) or %d (active): %w", mode, vram.Passive, vram.Active, device.ErrInvalidValue)
	}
	return m.do("set limit mode", func(vm *vram.Manager) error { return vm.SetLimitMode(vram.LimitMode(mode)) })
}

// Shares are how m divides memory between its clients.
func (m *Manager) Shares() (vram.Shares, error) {
	var s vram.Shares
	err := m.do("shares", func(vm *vram.Manager) error { s = vm.Shares(); return nil })
	return s, err
}

// MemInfo is the device's free and total memory.
func (m *Manager) MemInfo() (free, total uint64, err error) {
	err = m.do("memory info", func(vm *vram.Manager) (err error) { free, total, err = vm.MemInfo(); return err })
	return free, total, err
}

// GroupMembers are the handles of the open clients of group, by id.
func (m *Manager) GroupMembers(group string) ([]int64, error) {
	var hs []int64
	err := m.do("group members", func(vm *vram.Manager) error {
		for _, c := range vm.GroupMembers(group) {
			hs = append(hs, int64(c.ID()))
		}
		return nil
	})
	return hs, err
}

// FreeLabel frees every client's arrays under label.
func (m *Manager) FreeLabel(label string) error {
	return m.do(fmt.Sprintf("free %q", label), func(vm *vram.Manager) error { return vm.Free(label) })
}

// FreeAll frees every client's arrays.
func (m *Manager) FreeAll() error {
	return m.do("free all", (*vram.Manager).FreeAll)
}

// InvalidateAll frees every client's arrays and tells each (its
// OnInvalidate, an event for Poll).
func (m *Manager) InvalidateAll() error {
	return m.do("invalidate all", (*vram.Manager).InvalidateAll)
}

// ReinitStreams gives every stream group a fresh stream.
func (m *Manager) ReinitStreams() error {
	return m.do("reinit streams", (*vram.Manager).ReinitStreams)
}
