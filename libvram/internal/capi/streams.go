package capi

// Streams of the programs that call in, as the package doc describes:
// borrowed where the device can (CUDA), one stream per key on the
// simulator, the manager's own for allocations that name none, and the
// default stream for frees that name none.

import (
	"errors"
	"fmt"

	"github.com/vramkit/vram/device"
)

// MaxStreamKeys bounds the distinct stream handles a manager on a device
// that cannot borrow streams (the simulator) makes streams for: each is a
// stream with a goroutine behind it, and a caller that passes ever new
// handles would otherwise grow them without end.
const MaxStreamKeys = 256

// perThreadStream is CU_STREAM_PER_THREAD (cudaStreamPerThread): one
// handle that names a different stream on every thread.
const perThreadStream uintptr = 0x2

// streamName names the stream handle h for a message: the handles with
// a meaning of their own by that meaning, any other by its value.
func streamName(h uintptr) string {
	switch h {
	case Unordered:
		return "no stream (VRAM_STREAM_UNORDERED)"
	case 0:
		return "the default stream"
	case perThreadStream:
		return "the per-thread default stream"
	}
	return fmt.Sprintf("stream %#x", h)
}

// allocStream is the stream an allocation named h is ordered on. Where
// streams are borrowed, an allocation on the per-thread default stream is
// made as an unordered one: its one handle names each thread's own stream,
// so memory freed on it by one thread must not be handed at once to
// another thread's (a free on it is ordered on the freeing thread's
// stream, which is right).
func (m *Manager) allocStream(h uintptr) (device.Stream, error) {
	if h == Unordered || (h == perThreadStream && m.foreign != nil) {
		return m.unordered, nil
	}
	return m.stream(h)
}

// freeStream is the stream a free named h is ordered on.
func (m *Manager) freeStream(h uintptr) (device.Stream, error) {
	if h == Unordered {
		return m.dev.DefaultStream(), nil
	}
	return m.stream(h)
}

// stream maps the handle h, never Unordered, to a stream of the device.
func (m *Manager) stream(h uintptr) (device.Stream, error) {
	if h == 0 {
		return m.dev.DefaultStream(), nil
	}
	if m.foreign != nil {
		return m.foreign.BorrowStream(h)
	}
	m.mu.Lock()
	s := m.keyed[h]
	n := len(m.keyed)
	m.mu.Unlock()
	if s != nil {
		return s, nil
	}
	if n >= MaxStreamKeys {
		return nil, fmt.Errorf("stream key %#x: the manager already has streams for %d keys, the most it makes on a device that borrows no streams (%s): %w",
			h, MaxStreamKeys, m.dev.Info().Backend, device.ErrInvalidValue)
	}
	made, err := m.dev.NewStream() // outside mu: a device call
	if err != nil {
		return nil, fmt.Errorf("stream for key %#x: %w", h, err)
	}
	m.mu.Lock()
	full := false
	if s = m.keyed[h]; s == nil {
		if full = len(m.keyed) >= MaxStreamKeys; !full {
			m.keyed[h], s, made = made, made, nil
		}
	}
	m.mu.Unlock()
	if made != nil { // another call made the key's stream first, or the last room went
		if err := made.Close(); err != nil {
			return nil, errors.Join(fmt.Errorf("stream for key %#x: closing a stream not needed", h), err)
		}
	}
	if full {
		return nil, fmt.Errorf("stream key %#x: the manager already has streams for %d keys: %w", h, MaxStreamKeys, device.ErrInvalidValue)
	}
	return s, nil
}
