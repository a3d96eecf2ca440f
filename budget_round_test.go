package vram

import (
	"context"
	"errors"
	"regexp"
	"testing"
)

// TestBudgetWrittenOnce: an Allocate that fails for want of memory
// writes its budget, and the cap that bounds it, the same way where it
// says what bounds it and where the plan says it is too small (once
// "budget 1.3 MiB … but the budget is 1.2 MiB" for 1.28 MiB).
func TestBudgetWrittenOnce(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB, WithCap(1342177)) // 1.28 MiB
	c := register(t, m, ClientOptions{})
	must(t, c.Queue(map[string]ArrayRequest{"x": {Shape: []int{1 << 20}, DType: Float32, Unchunkable: true}}))
	_, err := c.Allocate(context.Background())
	if !errors.Is(err, ErrUnchunkable) {
		t.Fatalf("Allocate: %v; want ErrUnchunkable", err)
	}
	var figures []string
	for _, m := range regexp.MustCompile(`(?:budget (?:is )?|at most |\()([0-9.]+ [KMG]?i?B)(?: under| left|:|,)`).FindAllStringSubmatch(err.Error(), -1) {
		figures = append(figures, m[1])
	}
	if len(figures) < 2 {
		t.Fatalf("the error writes the budget %d times: %v", len(figures), err)
	}
	for _, f := range figures[1:] {
		if f != figures[0] {
			t.Errorf("the budget is written as %q and as %q: %v", figures[0], f, err)
		}
	}
}

// TestBudgetErrorBound: the error of a group that does not fit says, as
// a BudgetError, what bounded its budget.
func TestBudgetErrorBound(t *testing.T) {
	tests := map[string]struct {
		opts  []Option
		share float64
		want  BudgetBound
	}{
		"the device":         {nil, 0, BoundDevice},
		"the allocation cap": {[]Option{WithCap(8 * MiB)}, 0, BoundCap},
		"the members' caps":  {[]Option{WithLimitMode(Active)}, 0.1, BoundCaps},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newManager(t, 64*MiB, tc.opts...)
			c := register(t, m, ClientOptions{Proportion: tc.share})
			must(t, c.Queue(map[string]ArrayRequest{"x": {Shape: []int{32 << 20}, DType: Float32, Unchunkable: true}}))
			_, err := c.Allocate(context.Background())
			var be *BudgetError
			if !errors.As(err, &be) || be.Bound != tc.want || be.Group != "default" {
				t.Fatalf("Allocate: %v (%+v); want a BudgetError bound by %d", err, be, tc.want)
			}
		})
	}
}
