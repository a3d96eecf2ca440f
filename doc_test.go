package vram

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocMapNamesEveryFile: the package doc's map (# Files) names every
// non-test file of the package, and no file that is not there, in at
// most ten lines.
func TestDocMapNamesEveryFile(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	doc := f.Doc.Text()
	_, after, ok := strings.Cut(doc, "# Files\n")
	if !ok {
		t.Fatal("the package doc has no # Files section")
	}
	section, _, _ := strings.Cut(after, "\n# ")
	var lines int
	for _, l := range strings.Split(strings.TrimSpace(section), "\n") {
		if strings.TrimSpace(l) != "" {
			lines++
		}
	}
	if lines > 10 {
		t.Errorf("the map takes %d lines; want at most 10", lines)
	}
	named := regexp.MustCompile(`\b[a-z_]+\.go\b`).FindAllString(section, -1)
	slices.Sort(named)
	named = slices.Compact(named)
	all, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	files := slices.DeleteFunc(all, func(s string) bool { return strings.HasSuffix(s, "_test.go") })
	if !slices.Equal(named, files) {
		t.Errorf("the map names %v; the package's files are %v", named, files)
	}
}
