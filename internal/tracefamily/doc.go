// Package tracefamily derives a family of allocation traces from a few
// real ones, to judge allocators on traces they were not tuned to: each
// member is made from a seed by taking a window of a source (a forward
// pass, a part of a step), scaling its sizes to a peak drawn from
// 16 MiB–4 GiB (each distinct size moved by up to 10 % on some), and on
// some interleaving a second source time-shifted against the first, or
// reordering events locally. The same seed and sources always make the
// same member; a test's seeds are its family, and seeds it does not use
// hold out members to check a choice on.
//
// It owns the generator only: replaying members is package trace's, and
// what a family's figures must be is the tests'.
package tracefamily
