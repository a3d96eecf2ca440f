package main

import (
	"bytes"
	"os"
	"testing"
)

// TestRunJobShape keeps the command thin: the batch job's file stays
// under 500 lines (its pipeline lives in the library, its flag checks in
// runflags.go).
func TestRunJobShape(t *testing.T) {
	src, err := os.ReadFile("runjob.go")
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(src, []byte("\n")); n >= 500 {
		t.Errorf("runjob.go has %d lines, want under 500: move a self-contained part to its own run*.go file", n)
	}
}
