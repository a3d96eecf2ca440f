// Package streams owns stream groups: named sets of client ids that share
// one device stream, the Go form of cubie's StreamGroups.
//
// Components of a batch program that work on the same data are put in the
// same group, so their copies and kernels are ordered on one stream and the
// memory manager (package vram) plans their arrays together. The "default"
// group is made on first use. A group lives while it has members or is
// held (Hold): the Remove, Move or release that leaves it with neither
// forgets it and closes its stream in the background once the work queued
// on it is done, without waiting for that work itself (WaitClosed waits
// for such a close; Close waits for all of them). A group's stream is
// replaced only by Reinit (after a device reset) and closed by Close.
//
// Unlike the Python original, which scans every group to find a client,
// every lookup here is a map access: O(1) in the number of clients and
// groups.
//
// The package knows nothing about memory, shares or chunking (package
// vram) and talks to the device only to make and close streams.
package streams
