package main

import (
	"context"
	"fmt"

	"github.com/vramkit/vram"
)

func main() {
	m, err := vram.Open("sim:vram=8GiB,backed=false")
	if err != nil {
		panic(err)
	}
	defer m.Close()
	c, _ := m.Register(vram.ClientOptions{Name: "solver"})
	_ = c.Queue(map[string]vram.ArrayRequest{
		"t": {Shape: []int{1 << 40}, DType: vram.Float64, Unchunkable: true},
		"x": {Shape: []int{4, 1000}, DType: vram.Float32, ChunkAxis: 1},
	})
	_, err = c.Allocate(context.Background())
	fmt.Println(err)
	_ = c.Queue(map[string]vram.ArrayRequest{
		"t": {Shape: []int{1 << 40}, DType: vram.Float64, Unchunkable: true},
	})
	_, err = c.Allocate(context.Background())
	fmt.Println(err)
}
