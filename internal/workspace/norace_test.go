//go:build !race

package workspace

const raced = false
