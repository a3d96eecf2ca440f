// Package sim is a simulated GPU: a real implementation of device.Device,
// not a mock, so that vram builds, tests and demonstrates itself on a
// machine with no GPU. It is registered as the "sim" backend of
// device.Open ("sim", "sim:vram=24GiB,backed=false", ...; see ParseSpec).
//
// What it simulates, and how faithfully:
//
//   - Memory, accounted exactly: MemInfo's free memory is the total less
//     the context's own memory, every Malloc rounded up to the
//     granularity (2 MiB by default, as current drivers), and what the
//     stream-ordered pool holds reserved. Pinned host memory takes
//     nothing from the device. A device may have up to MaxTotalBytes
//     (256 TiB) of memory.
//   - Two backing modes. Backed (the default): device memory is host
//     memory behind addresses that look like device addresses
//     (0x7f0000000000 and up, aligned to the granularity), so copies and
//     kernels work. Address-only (Config.AddressOnly, spec backed=false):
//     only addresses and accounting, no bytes, so a trace that peaks at
//     90 GB replays on a small host; copies, memsets and kernels return
//     errors wrapping device.ErrNotSupported. A backed device makes an
//     allocation's bytes on its first access and caps what it holds
//     (Config.BackingLimit, spec backing=): past the cap an access fails
//     with ErrOutOfMemory rather than ending the process.
//   - Streams: ordered queues, each served by its own goroutine (started
//     with the stream's first operation), so asynchronous work really
//     runs after the call returns and ordering bugs show. Making and
//     closing a stream costs O(1) however many are open. Events order streams. Errors of asynchronous work are
//     sticky until the next Synchronize.
//   - The driver's stream-ordered pool (MallocAsync/FreeAsync) with its
//     reuse rules and release threshold, emulated exactly as pool.go's
//     overview states.
//   - Virtual memory (device.VirtualMemory, vmm.go): reserved address
//     ranges take no memory, physical memory counts in MemInfo from
//     CreatePhysical until it is released and unmapped, an access must lie
//     in mapped pages with access granted (an unmapped page is a use after
//     free, or an invalid pointer if never mapped), and Faults.FailMapAt
//     fails a Map. VMUsage reports reserved, physical and mapped bytes.
//   - Pinned host memory, mapped or not (HostAlloc), made resident when
//     allocated as pinning does, so copies do not pay its page faults;
//     off the Go heap (a mapping of its own, with transparent huge pages
//     from 2 MiB), so HostFree gives it back to the host at once and a
//     program's RSS follows what it has pinned (PinnedBytes).
//   - Kernels written as Go functions (LaunchFunc), run over the host's
//     cores.
//   - The host's view of device memory (HostBytes, hostbytes.go), checked
//     as a copy's access is, for kernels that run on the host outside the
//     simulator (Numba's CUDA simulator over vram's arrays, through
//     libvram).
//   - 2-D (pitched) copies, device.StridedCopier, as one stream operation
//     each, checked like any copy (see strided.go).
//   - A memory checker on every copy, memset and kernel access:
//     out-of-bounds access, use after free, double free, a pointer from
//     before a Reset and a pointer from another device each give a
//     distinct error (device.ErrOutOfBounds, ErrUseAfterFree,
//     ErrDoubleFree, ErrInvalidated, ErrInvalidPointer), never silent
//     corruption. It checks against the device's own allocations (each
//     Malloc's exact size), and against an allocator's sub-allocations
//     only where the allocator marks them (device.SubAllocationChecker,
//     marks.go): under a caching allocator (alloc.Pool, or
//     alloc.Expandable, the manager's default here) an access past an
//     array but inside its pool segment or mapped pages goes unseen unless
//     the pool marks its blocks. To check a program's array bounds, set
//     alloc.PoolConfig{CheckBlocks: true} (in the Configs of a manager's
//     choice of the registry's segment Pool, which marks them).
//   - Fault injection (Device.Faults): out of memory at the nth
//     allocation or above a size, a failing copy, a device reset at a
//     chosen call.
//   - One device shared by processes (Config.Shared, spec
//     sim:shared=NAME; shared.go has the ledger's layout and rules):
//     every Device opened with the same NAME and ledger directory, in
//     this process or any other on the host, is a client of one device.
//     Each client pays its own context (context=0 makes a watcher that
//     takes nothing), and MemInfo's free is the total less what all
//     clients hold: contexts, Mallocs, async pool reserves, physical
//     memory. An allocation, pool growth or CreatePhysical that would
//     pass the total fails with device.ErrOutOfMemory in the client that
//     asks, decided atomically across processes (under the ledger file's
//     flock, which dies with its holder); the error names what the other
//     clients hold. Contents, addresses, streams and fault injection stay
//     per client. Every client must give one total and granularity
//     (else ErrSharedMismatch, naming both); at most SharedSlotCount (256)
//     are open at once (else ErrSharedFull). A client's memory goes back
//     at Close or Reset (all but its context); a process that died
//     (kill -9 included; told by pid and start time) loses its slot to
//     the next client that looks: at Open, at an allocation that does not
//     fit, and at a MemInfo 250 ms or more after the last look.
//     SharedUsage lists the clients (pid, bytes held, context). The
//     ledger is NAME.vramsim in dir=PATH, $VRAM_SIM_DIR, or
//     /dev/shm/vram-sim-UID (DefaultSharedDir), mode 0600. Linux only:
//     elsewhere New fails with device.ErrNotSupported.
//   - Reset (everything made before is invalid; it returns once the
//     work it interrupted has ended) and Close (everything
//     released, with a leak report: Device.Leaks, LeakError).
//
// What it does not simulate: timing (beyond an optional copy bandwidth
// and an optional kernel time per index, Config.KernelTime),
// PTX modules (it is no device.ModuleLoader), several contexts in one
// Device, unified memory, and the driver's sub-allocation of small Mallocs within a 2 MiB
// page (every Malloc reserves whole granules).
//
// Its costs are those of a few treap operations per allocation (O(log n);
// in steady state nothing is allocated on the Go heap but the bytes of a
// backed allocation, made on its first access) and of a mutex and a
// goroutine wake-up per stream operation; see BENCHMARKS.md.
package sim
