package vram

// Link the device backends, so that device.Open("auto") — and with it
// Default — finds CUDA when a driver and GPU are there and the simulator
// otherwise.
import (
	_ "github.com/vramkit/vram/device/cuda"
	_ "github.com/vramkit/vram/device/sim"
)
