//go:build !race

package batch_test

// raceOn is true in a build with the race detector.
const raceOn = false
