package vram

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestErrorsSayNoPrefix: no error this package (or internal/share, whose
// sentinel it re-exports) makes starts with, or contains, "vram:": the
// command that prints an error adds its name once (errors.go). It reads
// every fmt.Errorf and errors.New of the source, so an error added later
// is held to it too.
func TestErrorsSayNoPrefix(t *testing.T) {
	for _, dir := range []string{".", "internal/share"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		checked := 0
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			fset := token.NewFileSet()
			af, err := parser.ParseFile(fset, f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(af, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) == 0 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				pkg, ok := sel.X.(*ast.Ident)
				if !ok || !(pkg.Name == "fmt" && sel.Sel.Name == "Errorf" || pkg.Name == "errors" && sel.Sel.Name == "New") {
					return true
				}
				lit, ok := call.Args[0].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				checked++
				if s, err := strconv.Unquote(lit.Value); err == nil && strings.Contains(s, "vram:") {
					t.Errorf("%s: %s(%s) says \"vram:\"; the program that prints it adds its name", fset.Position(lit.Pos()), sel.Sel.Name, lit.Value)
				}
				return true
			})
		}
		if checked == 0 {
			t.Errorf("%s: no error read", dir)
		}
	}
	for _, err := range []error{ErrClosed, ErrProportion, ErrRunTooLarge, ErrUnchunkable, ErrFreed, ErrEvicted, ErrNothingQueued} {
		if strings.Contains(err.Error(), "vram") {
			t.Errorf("sentinel %q names the package", err)
		}
	}
}
