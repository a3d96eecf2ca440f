// Package trace records and replays device allocation logs.
//
// It owns the log format, RAPIDS RMM's logging CSV
// (Thread,Time,Action,Pointer,Size,Stream; Read, Write, Event, Summarize),
// and Replay, which runs a log's allocations and frees against any
// alloc.Allocator and measures what it spent: the log's peak live bytes,
// the allocator's peak reserved bytes, its device allocations and frees,
// failed allocations, frees of pointers never allocated in the log
// (counted and skipped), and replay speed, with an optional time series
// for a plot. ReplayOn does it on a fresh device that a DeviceFactory
// makes, sized for the log by DeviceBytes: an address-only simulator
// (vram/device/sim, which the package does not import) replays a log that
// peaked at 55 GB on a laptop.
//
// PyTorch memory snapshots (torch.cuda.memory._dump_snapshot pickles) are
// read as logs by ReadSnapshot: the blocks live when recording began are
// allocated at time 0, then the allocator history follows, and
// PyTorchFigures say what PyTorch's own allocator reserved over it. A
// snapshot is untrusted: its pickle is read by a decoder of plain data
// only (nothing is imported or called), at most MaxPickleBytesPerByte
// bytes allocated per byte of it and a fixed time per opcode, and the
// walk over it visits at most one segment, block or entry per 4 bytes
// (pickle.go and snapshot.go state the bound).
// RecordReplay records a replay as a History (trace entries and the
// segments held at the end) and WriteSnapshot pickles it as a snapshot
// that PyTorch's memory visualizer opens.
//
// Event, Summary, Options, Result and Sample are plain values. Read,
// Write, Summarize and Replay are safe to call from several goroutines at
// once on separate data (a Replay needs its allocator to itself for its
// figures to be its own); a Writer is not safe for concurrent use.
//
// Logs are recorded by alloc.Trace (an adaptor that writes the same CSV),
// by RMM's logging_resource_adaptor, or by PyTorch's memory history. The package does not own the
// allocators (vram/alloc), the devices (vram/device) or plotting (the vram
// command draws Result.Samples).
package trace
