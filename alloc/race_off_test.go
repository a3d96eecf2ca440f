//go:build !race

package alloc_test

// raceOn is true in a build with the race detector.
const raceOn = false
