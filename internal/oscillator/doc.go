// Package oscillator is the kernel of vram's example batch job: many damped,
// driven oscillators
//
//	x'' + 2·ζ·ω·x' + ω²·x = A·cos(Ω·t)
//
// integrated side by side with classic RK4 at a fixed step, one run per
// column of a set of device arrays (see Args for their layout).
//
// It owns the kernel as one portable value (NewPortable, a
// kernel.Kernel) in two forms that compute the same thing — a Go function
// over typed views for devices that run Go kernels (device.FuncLauncher:
// the simulator) and hand-written PTX for devices that load PTX
// (device.ModuleLoader: CUDA) — New, which wraps it in the form the
// device supports for launches from raw pointers (Args), and the float64 host reference (Reference) with Verify, which
// checks a device's float32 results against it. It also packs inputs into
// and reads results out of the arrays' byte layout.
//
// It does not own memory: the caller allocates the arrays (the manager, in
// vram run), copies inputs in and results out.
package oscillator
