package main

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestBackendsOnlyLinked: the command imports the backends only to link
// them (a blank import, so that device.Open finds them); everything it
// needs of a device goes through package device (device.Spec and its
// backend's SpecReader), never a backend's own API.
func TestBackendsOnlyLinked(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	backends := map[string]bool{"github.com/vramkit/vram/device/sim": false, "github.com/vramkit/vram/device/cuda": false}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if _, ok := backends[path]; !ok {
				continue
			}
			if imp.Name == nil || imp.Name.Name != "_" {
				t.Errorf("%s: imports %s for its API; reach it through package device", fset.Position(imp.Pos()), path)
				continue
			}
			backends[path] = true
		}
	}
	for path, linked := range backends {
		if !linked {
			t.Errorf("no file links %s (a blank import), so --device cannot open it", path)
		}
	}
}
