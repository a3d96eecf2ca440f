// Package streams owns the streams of stream groups: one device stream
// per named group, kept while the group is held.
//
// Components of a batch program that work on the same data are put in the
// same group, so their copies and kernels are ordered on one stream and the
// memory manager (package vram) plans their arrays together. Who is in
// which group is the manager's (its registry is the one membership table,
// the Go form of cubie's StreamGroups); each member holds its group here
// (Hold), and so does a call that must keep the group's stream open. A
// group is made, with its stream, by the first Hold of its name; the
// release that leaves it with no hold forgets it and closes its stream in
// the background once the work queued on it is done, without waiting for
// that work itself (WaitClosed waits for such a close; Close waits for all
// of them). A group's stream is replaced only by Reinit (after a device
// reset) and closed by Close. Every look-up is a map access: O(1) in the
// number of groups.
//
// The package knows nothing about clients, memory, shares or chunking
// (package vram) and talks to the device only to make and close streams.
package streams
