// Package gate keeps the project's deterministic figures from getting
// worse unnoticed: heap allocations per operation on the hot paths, replay
// ratios and pages over the floor of every allocator on the shared traces
// and on a family generated from them, bytes of host memory fixed jobs ask
// for, exported methods and file lengths. None is a time.
//
// The figures live in one committed file (.ci/gates.json, File). Each is
// measured by a test of the package that owns it, a TestGate… function
// that calls Record; the gate command (internal/gate/cmd/gate, run by
// .ci/run) runs those tests, compares what they measured with the file and
// fails when a figure is worse than the file says, when a figure in the
// file is no longer measured, or when a new one is not in the file. A
// figure may get worse only in a commit that updates the file (the
// command's -update) and says why: the history check (CheckHistory) fails
// on any commit that made a figure of the file worse and left its Why as
// it was.
//
// It owns the file's format, the comparison and the history check; what
// each figure means belongs to the test that measures it.
package gate
