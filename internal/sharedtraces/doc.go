// Package sharedtraces finds the project's shared allocation traces for
// tests and benchmarks: $VRAM_TRACES, or shared/traces beside the
// repository (where CI and the developers' checkouts keep it).
//
// It owns only the search for that directory (Dir), which skips the
// calling test when there is none. Reading and replaying the traces
// belongs to package vram/trace.
package sharedtraces
