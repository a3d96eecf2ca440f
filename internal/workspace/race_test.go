//go:build race

package workspace

// raced: this test binary was built with the race detector, and so are
// the other modules' tests it runs.
const raced = true
