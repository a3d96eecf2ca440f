package vram

import (
	"context"
	"errors"
	"testing"
)

// TestCopyOfAnotherGroupsArray: a client copies into and out of its own
// arrays and its group's members', and is refused another group's (the
// copy would go on its own stream, unordered with the other group's
// work) with ErrOtherGroup; nothing is enqueued.
func TestCopyOfAnotherGroupsArray(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	owner := register(t, m, ClientOptions{Name: "owner", Group: "g"})
	member := register(t, m, ClientOptions{Name: "member", Group: "g"})
	stranger := register(t, m, ClientOptions{Name: "stranger", Group: "other"})
	must(t, owner.Queue(map[string]ArrayRequest{"x": {Shape: []int{1024}, DType: Float32, Unchunkable: true}}))
	resp, err := owner.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	x := resp.Arrays()["x"]
	h, err := m.NewHostArray([]int{1024}, Float32, Pinned, nil)
	must(t, err)
	defer h.Free()
	ctx := context.Background()
	sp := Span{Axis: 0, Start: 0, Len: 1024}
	for name, tc := range map[string]struct {
		c    *Client
		want error
	}{
		"its owner":                 {owner, nil},
		"a member of its group":     {member, nil},
		"a client of another group": {stranger, ErrOtherGroup},
	} {
		t.Run(name, func(t *testing.T) {
			for what, copyFn := range map[string]func() error{
				"ToDevice":        func() error { return tc.c.ToDevice(ctx, x, h) },
				"FromDevice":      func() error { return tc.c.FromDevice(ctx, h, x) },
				"ToDeviceChunk":   func() error { return tc.c.ToDeviceChunk(ctx, x, h, sp) },
				"FromDeviceChunk": func() error { return tc.c.FromDeviceChunk(ctx, h, x, sp) },
			} {
				if err := copyFn(); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
					t.Errorf("%s: %v, want %v", what, err, tc.want)
				}
			}
			must(t, tc.c.Sync(ctx))
		})
	}
}
