package gate

// Figures, the file that keeps them, and how measured figures compare
// with kept ones. Rules:
//
//   - A figure is worse than the kept one when it moved past the kept
//     value in the direction its Better names by more than the kept
//     Slack (a fraction of the kept value; 0 for an exact figure), or when
//     its unit or direction changed (it is then another figure).
//   - The file lists figures sorted by name, one a line, so that a change
//     reads as a one-line diff; Write replaces it only once the new text
//     is whole (a temporary file beside it, renamed).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Better says which way a figure improves.
type Better string

// The directions.
const (
	Lower  Better = "lower"  // fewer allocations, bytes, pages, lines
	Higher Better = "higher" // none yet; for figures where more is better
)

// Figure is one gated figure: measured by a test (Record), or kept in the
// file.
type Figure struct {
	// Name is unique in the file: slash-separated, the owner first
	// ("heap/alloc.Pool/hit 4 KiB", "family/expandable/ratio p95").
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`   // "allocs/op", "ratio", "pages", "bytes", "lines", "methods", "count"
	Better Better  `json:"better"` // Lower or Higher
	// Slack is the part of the kept value a measurement may move the
	// wrong way without being worse, for figures that are not exactly
	// repeatable (0: exact). The measuring test states it.
	Slack float64 `json:"slack,omitempty"`
	// Why, in the file, is why the figure is what it is: required to
	// change in any commit that makes the figure worse.
	Why string `json:"why,omitempty"`
}

// check reports what is wrong with f, if anything.
func (f Figure) check() error {
	switch {
	case f.Name == "" || strings.ContainsAny(f.Name, "\n\r\t"):
		return fmt.Errorf("gate: figure name %q: want a non-empty name on one line", clip(f.Name))
	case f.Better != Lower && f.Better != Higher:
		return fmt.Errorf("gate: figure %q: better %q: want %q or %q", clip(f.Name), clip(string(f.Better)), Lower, Higher)
	case math.IsNaN(f.Value) || math.IsInf(f.Value, 0):
		return fmt.Errorf("gate: figure %q: value %v: want a finite number", clip(f.Name), f.Value)
	case f.Slack < 0 || f.Slack >= 1:
		return fmt.Errorf("gate: figure %q: slack %v: want 0 ≤ slack < 1", clip(f.Name), f.Slack)
	}
	return nil
}

// WorseThan reports whether f, measured, is worse than kept (the rules
// above).
func (f Figure) WorseThan(kept Figure) bool {
	if f.Unit != kept.Unit || f.Better != kept.Better {
		return true
	}
	tol := math.Abs(kept.Value)*kept.Slack + 1e-12*max(1, math.Abs(kept.Value))
	if kept.Better == Higher {
		return f.Value < kept.Value-tol
	}
	return f.Value > kept.Value+tol
}

// BetterThan reports whether f is better than kept by any amount.
func (f Figure) BetterThan(kept Figure) bool {
	if f.Unit != kept.Unit || f.Better != kept.Better {
		return false
	}
	if kept.Better == Higher {
		return f.Value > kept.Value
	}
	return f.Value < kept.Value
}

// Retired is a figure no longer measured, and why.
type Retired struct {
	Name string `json:"name"`
	Why  string `json:"why"`
}

// File is the kept figures.
type File struct {
	About   string    `json:"about"`
	Figures []Figure  `json:"figures"`
	Retired []Retired `json:"retired,omitempty"`
}

// maxFileBytes bounds a gates file: a few thousand figures at most.
const maxFileBytes = 4 << 20

// Read reads the file at path.
func Read(path string) (File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return File{}, fmt.Errorf("gate: %w", err)
	}
	if st.Size() > maxFileBytes {
		return File{}, fmt.Errorf("gate: %s is %d bytes; a gates file is at most %d", path, st.Size(), maxFileBytes)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return File{}, fmt.Errorf("gate: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		return File{}, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Parse reads a file's bytes: valid JSON, every figure valid, no name
// twice.
func Parse(data []byte) (File, error) {
	var f File
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return File{}, fmt.Errorf("gate: %w", err)
	}
	seen := make(map[string]bool, len(f.Figures))
	for _, fig := range f.Figures {
		if err := fig.check(); err != nil {
			return File{}, err
		}
		if seen[fig.Name] {
			return File{}, fmt.Errorf("gate: figure %q is listed twice", clip(fig.Name))
		}
		seen[fig.Name] = true
	}
	return f, nil
}

// Marshal writes f as the file holds it: figures and retired figures
// sorted by name, one a line.
func (f File) Marshal() []byte {
	figs := slices.Clone(f.Figures)
	slices.SortFunc(figs, func(a, b Figure) int { return strings.Compare(a.Name, b.Name) })
	ret := slices.Clone(f.Retired)
	slices.SortFunc(ret, func(a, b Retired) int { return strings.Compare(a.Name, b.Name) })
	var b bytes.Buffer
	about, _ := json.Marshal(f.About)
	fmt.Fprintf(&b, "{\n\"about\": %s,\n\"figures\": [\n", about)
	for i, fig := range figs {
		line, _ := json.Marshal(fig) // plain values: cannot fail
		b.Write(line)
		if i < len(figs)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("]")
	if len(ret) > 0 {
		b.WriteString(",\n\"retired\": [\n")
		for i, r := range ret {
			line, _ := json.Marshal(r)
			b.Write(line)
			if i < len(ret)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString("]")
	}
	b.WriteString("\n}\n")
	return b.Bytes()
}

// Write replaces the file at path with f: written to a temporary file
// beside it, synced, then renamed over it.
func Write(path string, f File) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.partial")
	if err != nil {
		return fmt.Errorf("gate: write %s: %w", path, err)
	}
	_, err = tmp.Write(f.Marshal())
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return errors.Join(fmt.Errorf("gate: write %s: %w", path, err), os.Remove(tmp.Name()))
	}
	return nil
}

// Status is how a measured figure stands against the file.
type Status uint8

// The statuses.
const (
	Same     Status = iota // within the kept value and its slack, not better
	Improved               // better than kept
	Worse                  // worse than kept: the gate fails
	New                    // measured, not in the file: the gate fails
	Gone                   // in the file, not measured: the gate fails
)

// String is the status as the command prints it.
func (s Status) String() string {
	return [...]string{"same", "better", "WORSE", "NEW", "NOT MEASURED"}[s]
}

// Change is one figure's standing.
type Change struct {
	Name   string
	Kept   Figure // zero when New
	Got    Figure // zero when Gone
	Status Status
}

// Compare sets measured figures against the file's, by name.
func Compare(kept File, got []Figure) []Change {
	byName := make(map[string]Figure, len(got))
	for _, g := range got {
		byName[g.Name] = g
	}
	var out []Change
	for _, k := range kept.Figures {
		g, ok := byName[k.Name]
		delete(byName, k.Name)
		c := Change{Name: k.Name, Kept: k, Got: g}
		switch {
		case !ok:
			c.Status = Gone
		case g.WorseThan(k):
			c.Status = Worse
		case g.BetterThan(k):
			c.Status = Improved
		}
		out = append(out, c)
	}
	for _, g := range byName {
		out = append(out, Change{Name: g.Name, Got: g, Status: New})
	}
	slices.SortFunc(out, func(a, b Change) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Update returns the file with the measured figures in it: every measured
// figure takes its measured value, unit, direction and slack; those worse
// than kept take why as their Why; those not measured are retired with
// why, unless partial (only part of the gate ran), when they stay as they
// are. It refuses an empty why when a figure is worse or retired.
func Update(kept File, got []Figure, why string, partial bool) (File, error) {
	changes := Compare(kept, got)
	var needWhy []string
	out := File{About: kept.About, Retired: slices.Clone(kept.Retired)}
	for _, c := range changes {
		switch c.Status {
		case Gone:
			if partial {
				out.Figures = append(out.Figures, c.Kept)
				continue
			}
			needWhy = append(needWhy, c.Name+" (no longer measured)")
			out.Retired = append(slices.DeleteFunc(out.Retired, func(r Retired) bool { return r.Name == c.Name }), Retired{Name: c.Name, Why: why})
		case Worse:
			needWhy = append(needWhy, fmt.Sprintf("%s (%v → %v %s)", c.Name, c.Kept.Value, c.Got.Value, c.Got.Unit))
			g := c.Got
			g.Why = why
			out.Figures = append(out.Figures, g)
		default:
			g := c.Got
			g.Why = c.Kept.Why
			out.Figures = append(out.Figures, g)
			out.Retired = slices.DeleteFunc(out.Retired, func(r Retired) bool { return r.Name == c.Name })
		}
	}
	if len(needWhy) > 0 && strings.TrimSpace(why) == "" {
		return File{}, fmt.Errorf("gate: %d figures get worse or are retired; say why with -why:\n  %s", len(needWhy), strings.Join(needWhy, "\n  "))
	}
	return out, nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) <= 80 {
		return s
	}
	return s[:80] + "…"
}
