package batch_test

import (
	"context"
	"fmt"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/kernel"
)

// affinePTX is y[i] = a·x[i] + b for i < n: the PTX form of the example's
// kernel, which CUDA compiles; affineGo below is its Go form, which the
// simulator runs.
const affinePTX = `.version 7.0
.target sm_52
.address_size 64

.visible .entry affine(
	.param .u64 affine_x,
	.param .u64 affine_y,
	.param .u32 affine_n,
	.param .f32 affine_a,
	.param .f32 affine_b
)
{
	.reg .pred	%pexit;
	.reg .b32	%blk, %bdim, %thr, %i, %n;
	.reg .b64	%x, %y, %i4, %ax, %ay;
	.reg .f32	%s, %c, %v, %r;

	mov.u32		%blk, %ctaid.x;
	mov.u32		%bdim, %ntid.x;
	mov.u32		%thr, %tid.x;
	mad.lo.u32	%i, %blk, %bdim, %thr;
	ld.param.u32	%n, [affine_n];
	setp.ge.u32	%pexit, %i, %n;
	@%pexit bra	L_done;
	ld.param.u64	%x, [affine_x];
	ld.param.u64	%y, [affine_y];
	ld.param.f32	%s, [affine_a];
	ld.param.f32	%c, [affine_b];
	cvta.to.global.u64	%x, %x;
	cvta.to.global.u64	%y, %y;
	mul.wide.u32	%i4, %i, 4;
	add.s64		%ax, %x, %i4;
	add.s64		%ay, %y, %i4;
	ld.global.f32	%v, [%ax];
	fma.rn.f32	%r, %s, %v, %c;
	st.global.f32	[%ay], %r;
L_done:
	ret;
}
`

// affineGo is the Go form: the same arguments, arrays as typed views.
func affineGo(a kernel.Args, lo, hi int) error {
	x, y := a.Float32s(0), a.Float32s(1)
	s, b := a.Float32(3), a.Float32(4)
	for i := lo; i < hi; i++ {
		y[i] = s*x[i] + b
	}
	return nil
}

// Example runs a batch four times the device: a solver and a writer
// with different shares of one group, a portable kernel, two buffers in
// flight, every error handled and every result checked.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var closers []func() error // closed last first, each error said
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			if err := closers[i](); err != nil {
				fmt.Println("close:", err)
			}
		}
	}()
	affine, err := kernel.New("affine", affinePTX, affineGo, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	closers = append(closers, affine.Close)
	dev, err := sim.New(sim.Config{TotalBytes: 8 << 20, NoContext: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	closers = append(closers, dev.Close)
	m, err := vram.New(dev)
	if err != nil {
		fmt.Println(err)
		return
	}
	closers = append(closers, m.Close)
	solver, err := m.Register(vram.ClientOptions{Name: "solver", Group: "batch", Proportion: 0.5})
	if err != nil {
		fmt.Println(err)
		return
	}
	writer, err := m.Register(vram.ClientOptions{Name: "writer", Group: "batch", Proportion: 0.25})
	if err != nil {
		fmt.Println(err)
		return
	}

	// 32 MiB of device arrays on an 8 MiB device; each array's label and
	// shape are written once, here.
	const runs = 4 << 20
	b := batch.New()
	closers = append(closers, b.Close)
	x := b.In(solver, "x", vram.ArrayRequest{Shape: []int{runs}, DType: vram.Float32})
	y := b.Out(writer, "y", vram.ArrayRequest{Shape: []int{runs}, DType: vram.Float32})
	if err := b.Allocate(ctx, vram.WithBuffers(2)); err != nil {
		fmt.Println(err)
		return
	}
	if err := b.MakeHosts(); err != nil { // full-length host arrays, shaped as the requests
		fmt.Println(err)
		return
	}
	xs := x.Host().Float32s()
	for i := range xs {
		xs[i] = float32(i % 1000)
	}
	rep, err := b.Run(ctx, batch.Options{Buffers: 2}, func(_ context.Context, ch *batch.Chunk) error {
		return ch.Launch(affine, x, y, uint32(ch.Len), float32(2), float32(1))
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	bad := 0
	for i, v := range y.Host().Float32s() {
		if v != 2*xs[i]+1 {
			bad++
		}
	}
	fmt.Printf("%s kernel, %d chunks of %d runs, %d buffers, %d of %d chunks done\n",
		affine.Form(dev), rep.Chunks, b.Plan().ChunkLength, rep.Buffers, rep.ChunksDone, rep.Chunks)
	fmt.Printf("%d MiB in, %d MiB out, %d wrong results of %d\n", rep.BytesIn>>20, rep.BytesOut>>20, bad, len(xs))
	// Output:
	// go kernel, 8 chunks of 524288 runs, 2 buffers, 8 of 8 chunks done
	// 16 MiB in, 16 MiB out, 0 wrong results of 4194304
}
