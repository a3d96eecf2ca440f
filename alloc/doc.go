// Package alloc owns vram's allocators: Direct (every call goes to the
// device), Pool (a caching best-fit allocator with splitting, coalescing
// and stream-safe reuse), Expandable (the same over expandable segments:
// device pages mapped into one growing address range per stream, on
// devices with device.VirtualMemory), AsyncPool (the device's own
// stream-ordered pool),
// PinnedPool (pooled pinned host buffers), and adaptors that wrap any
// allocator (Limit, Trace).
//
// Pool, Expandable and PinnedPool are strategies on one stream-ordered core
// (core.go): the core owns the lock, the free index that decides which
// freed memory each stream may reuse (streamorder.go, fence.go), the
// out-of-memory ladder and device-reset handling; a strategy supplies how
// memory is grown, carved, merged and given back.
//
// The registry (registry.go) lists the device allocators in one table:
// each one's name (the one name everything gives it), aliases, Kind, what
// it needs of a device, the configuration it takes and its constructor.
// Lookup reads a name, ParseKind a kind, and Kind.New makes the allocator
// that serves a kind on a device.
//
// Every allocator reports its memory (report.go: MemoryReport, with the
// largest free block and fragmentation), its out-of-memory errors are
// *OutOfMemoryError carrying that report, and an OOMObserver can watch
// them.
//
// It talks to hardware only through vram/device, and knows nothing about
// clients, budgets or chunking (package vram) or trace files (vram/trace).
package alloc
