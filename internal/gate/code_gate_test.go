package gate_test

// The shape of the module's code as gate figures: functions over the
// project's 80 lines, files over 600 and 800 lines and the longest, and
// the exported methods of every exported type of a public package that
// has at least minMethods of them. Test files, generated files and
// testdata are not counted.

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vramkit/vram/internal/gate"
)

// Limits of the figures: the project's longest function, the file
// lengths counted, and the fewest exported methods a type's row needs.
const (
	maxFuncLines = 80
	longFile     = 600
	tooLongFile  = 800
	minMethods   = 8
)

// codeShape is what the walk counted.
type codeShape struct {
	longFuncs        int
	over600, over800 int
	longest          int
	longestFile      string
	methods          map[string]int // "pkg/path.Type" → exported methods
}

func TestGateCode(t *testing.T) {
	root := moduleRoot(t)
	s := shapeOf(t, root)
	figs := []gate.Figure{
		{Name: "code/functions over 80 lines", Value: float64(s.longFuncs), Unit: "count", Better: gate.Lower},
		{Name: "code/files over 600 lines", Value: float64(s.over600), Unit: "count", Better: gate.Lower},
		{Name: "code/files over 800 lines", Value: float64(s.over800), Unit: "count", Better: gate.Lower},
		{Name: "code/longest file", Value: float64(s.longest), Unit: "lines", Better: gate.Lower},
	}
	for typ, n := range s.methods {
		if n >= minMethods {
			figs = append(figs, gate.Figure{Name: "code/exported methods/" + typ, Value: float64(n), Unit: "methods", Better: gate.Lower})
		}
	}
	slices.SortFunc(figs[4:], func(a, b gate.Figure) int { return strings.Compare(a.Name, b.Name) })
	if s.longest == 0 || s.methods["vram.Manager"] == 0 {
		t.Fatalf("the walk of %s found no Go file or no vram.Manager: %+v", root, s)
	}
	t.Logf("longest file %s (%d lines)", s.longestFile, s.longest)
	gate.Record(t, figs...)
}

// moduleRoot is the folder of the module's go.mod, above the test's.
func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no go.mod above %s", dir)
		}
	}
}

// shapeOf walks the module's non-test, non-generated Go files.
func shapeOf(t *testing.T, root string) codeShape {
	s := codeShape{methods: map[string]int{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		s.addFile(fset, f, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// addFile counts one file: its lines, long functions and exported
// methods (of a public package: not internal, not a command).
func (s *codeShape) addFile(fset *token.FileSet, f *ast.File, rel string) {
	lines := fset.File(f.Pos()).LineCount()
	if lines > longFile {
		s.over600++
	}
	if lines > tooLongFile {
		s.over800++
	}
	if lines > s.longest {
		s.longest, s.longestFile = lines, rel
	}
	pkg := filepath.ToSlash(filepath.Dir(rel))
	if pkg == "." {
		pkg = "vram"
	}
	public := f.Name.Name != "main" && !strings.Contains("/"+pkg+"/", "/internal/")
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
			s.longFuncs++
		}
		if !public || fd.Recv == nil || !fd.Name.IsExported() || len(fd.Recv.List) != 1 {
			continue
		}
		typ := fd.Recv.List[0].Type
		if st, ok := typ.(*ast.StarExpr); ok {
			typ = st.X
		}
		if id, ok := typ.(*ast.Ident); ok && id.IsExported() {
			s.methods[pkg+"."+id.Name]++
		}
	}
}
