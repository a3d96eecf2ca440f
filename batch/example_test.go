package batch_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
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
// with different shares of one group, registered by the batch, a
// portable kernel, two buffers in flight, every error handled and every
// result checked. The README's program is this one, shorter.
func Example() {
	if err := example(context.Background()); err != nil {
		fmt.Println(err)
	}
	// Output:
	// go kernel, 8 chunks of 524288 runs, 2 buffers, 8 of 8 chunks done
	// 16 MiB in, 16 MiB out, 0 wrong results of 4194304
}

func example(ctx context.Context) (err error) {
	affine, err := kernel.New("affine", affinePTX, affineGo, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, affine.Close()) }()
	m, err := vram.Open("sim:vram=8MiB,context=0") // the manager and its device: Close closes both
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	b := batch.New()
	defer func() { err = errors.Join(err, b.Close()) }() // its arrays, then the clients it registered
	solver := b.Register(m, vram.ClientOptions{Name: "solver", Group: "batch", Proportion: 0.5})
	writer := b.Register(m, vram.ClientOptions{Name: "writer", Group: "batch", Proportion: 0.25})

	// 32 MiB of device arrays on an 8 MiB device; each array's label and
	// shape are written once, here.
	const runs = 4 << 20
	x := b.In(solver, "x", vram.ArrayRequest{Shape: []int{runs}, DType: vram.Float32})
	y := b.Out(writer, "y", vram.ArrayRequest{Shape: []int{runs}, DType: vram.Float32})
	if err := b.Allocate(ctx, vram.WithBuffers(2)); err != nil { // a refused Register's error too
		return err
	}
	if err := b.MakeHosts(); err != nil { // full-length host arrays, shaped as the requests
		return err
	}
	xs := x.Host().Float32s()
	for i := range xs {
		xs[i] = float32(i % 1000)
	}
	rep, err := b.Run(ctx, batch.Options{Buffers: 2}, func(_ context.Context, ch *batch.Chunk) error {
		return ch.Launch(affine, x, y, uint32(ch.Len), float32(2), float32(1))
	})
	if err != nil {
		return err
	}
	bad := 0
	for i, v := range y.Host().Float32s() {
		if v != 2*xs[i]+1 {
			bad++
		}
	}
	fmt.Printf("%s kernel, %d chunks of %d runs, %d buffers, %d of %d chunks done\n",
		affine.Form(m.Device()), rep.Chunks, b.Plan().ChunkLength, rep.Buffers, rep.ChunksDone, rep.Chunks)
	fmt.Printf("%d MiB in, %d MiB out, %d wrong results of %d\n", rep.BytesIn>>20, rep.BytesOut>>20, bad, len(xs))
	return nil
}
