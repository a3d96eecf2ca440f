// Package account is a process's account of one device's memory: one
// allocator (package alloc, chosen from its registry), a cap around it,
// and, when the node broker divides the device between processes, the
// lease the cap follows.
//
// It answers what may be held now, and why (Room: the device's free
// memory, the cap and what it leaves, the lease, the allocator's
// statement of costs); makes room before its owner allocates (Reserve:
// under a lease it claims what the lease lacks and reports what the
// allocator will hold, in one call); allocates and frees (Alloc,
// AllocExact, Free); changes the cap (SetCap, WaitWithinCap); says when
// what may be held changed (Note, LastChange, WaitChange); gives the
// cache back (Trim); reports (Stats, Report, Lease); and replaces or
// closes the allocator (Prepare and Swap, Close). When a broker asks the
// account to shrink, it trims its cache and asks its owner, through the
// one hook back (Owner.Reclaim), to free what idle allocations hold.
//
// Its owners: the vram Manager, which shares the account's memory between
// clients and stream groups and plans their batches within its Room, and
// the C library (libvram), which allocates through it for PyTorch, CuPy
// and Numba.
//
// What it does not own: allocation strategy (package alloc), the broker
// and its protocol (package broker, which registers the dialer a lease
// comes by: RegisterBroker), clients, groups, shares, plans and eviction
// (package vram), streams (package streams) and the hardware (package
// device). It imports none of them but alloc and device.
//
// An Account is safe for concurrent use. Its lock order is in account.go.
package account
