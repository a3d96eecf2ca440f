package vram

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// TestCloseNamesLiveHostArrays: Manager.Close frees the pinned, mapped
// and file-backed host arrays still live (it once returned nil and left
// them to dangle) and names them in an error wrapping
// ErrLiveHostArrays; freed arrays, pageable ones and a client's own are
// not named.
func TestCloseNamesLiveHostArrays(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB, WithHostOptions(HostOptions{SpillDir: t.TempDir()}))
	pinned, err1 := m.NewHostArray([]int{4}, Float32, Pinned, nil)
	mapped, err2 := m.NewHostArray([]int{5}, Int32, Mapped, nil)
	file, err3 := m.Host().Alloc([]int{6}, Float64, HostArrayOptions{Rung: RungFile})
	pageable, err4 := m.NewHostArray([]int{7}, Float64, Pageable, nil)
	freed, err5 := m.NewHostArray([]int{8}, Float32, Pinned, nil)
	if err := errors.Join(err1, err2, err3, err4, err5, freed.Free()); err != nil {
		t.Fatal(err)
	}
	c := register(t, m, ClientOptions{Name: "c"})
	resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{"h": {Shape: []int{9}, DType: Uint8, Memory: Pinned}})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Close()
	if !errors.Is(err, ErrLiveHostArrays) || !strings.Contains(err.Error(), "3 host array(s)") {
		t.Fatalf("Close = %v; want ErrLiveHostArrays for 3 arrays", err)
	}
	for _, h := range []*HostArray{pinned, mapped, file} {
		if !strings.Contains(err.Error(), h.String()) || !h.Freed() {
			t.Errorf("%v: named %v, freed %v; want both", h, strings.Contains(err.Error(), h.String()), h.Freed())
		}
	}
	for _, h := range []*HostArray{pageable, freed, resp.Host()["h"]} {
		if strings.Contains(err.Error(), h.String()) {
			t.Errorf("%v named in %v", h, err)
		}
	}
	if pageable.Freed() || len(pageable.Float64s()) != 7 {
		t.Error("Close took a pageable array")
	}
	if _, serr := os.Stat(file.Placement().Path); !os.IsNotExist(serr) {
		t.Errorf("the file-backed array's file is still there: %v", serr)
	}
	if err := errors.Join(pinned.Free(), m.Close()); err != nil {
		t.Errorf("Free after Close, a second Close: %v; want nil", err)
	}
}
