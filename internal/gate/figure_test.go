package gate

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func fig(name string, v float64) Figure {
	return Figure{Name: name, Value: v, Unit: "allocs/op", Better: Lower}
}

func TestWorseThan(t *testing.T) {
	for name, tc := range map[string]struct {
		got, kept     Figure
		worse, better bool
	}{
		"equal":                     {fig("a", 2), fig("a", 2), false, false},
		"lower is better, fewer":    {fig("a", 1), fig("a", 2), false, true},
		"lower is better, more":     {fig("a", 3), fig("a", 2), true, false},
		"within slack":              {fig("a", 104), Figure{Name: "a", Value: 100, Unit: "allocs/op", Better: Lower, Slack: 0.05}, false, false},
		"past slack (100 × 1.05)":   {fig("a", 105.5), Figure{Name: "a", Value: 100, Unit: "allocs/op", Better: Lower, Slack: 0.05}, true, false},
		"higher is better, lower":   {Figure{Name: "a", Value: 1, Unit: "x", Better: Higher}, Figure{Name: "a", Value: 2, Unit: "x", Better: Higher}, true, false},
		"higher is better, higher":  {Figure{Name: "a", Value: 3, Unit: "x", Better: Higher}, Figure{Name: "a", Value: 2, Unit: "x", Better: Higher}, false, true},
		"unit changed: another one": {Figure{Name: "a", Value: 1, Unit: "bytes", Better: Lower}, fig("a", 2), true, false},
		"float noise of a ratio":    {fig("a", 1.0234+1e-15), fig("a", 1.0234), false, false},
		"a ratio up by 0.0001":      {fig("a", 1.0235), fig("a", 1.0234), true, false},
	} {
		t.Run(name, func(t *testing.T) {
			if w := tc.got.WorseThan(tc.kept); w != tc.worse {
				t.Errorf("%+v WorseThan %+v = %v; want %v", tc.got, tc.kept, w, tc.worse)
			}
			if b := tc.got.BetterThan(tc.kept); b != tc.better {
				t.Errorf("%+v BetterThan %+v = %v; want %v", tc.got, tc.kept, b, tc.better)
			}
		})
	}
}

func TestCompare(t *testing.T) {
	kept := File{Figures: []Figure{fig("same", 1), fig("up", 1), fig("down", 3), fig("gone", 1)}}
	got := []Figure{fig("same", 1), fig("up", 2), fig("down", 2), fig("new", 5)}
	want := map[string]Status{"same": Same, "up": Worse, "down": Improved, "gone": Gone, "new": New}
	changes := Compare(kept, got)
	if len(changes) != len(want) {
		t.Fatalf("%d changes %+v; want %d", len(changes), changes, len(want))
	}
	for i, c := range changes {
		if i > 0 && changes[i-1].Name >= c.Name {
			t.Errorf("changes not sorted by name: %q before %q", changes[i-1].Name, c.Name)
		}
		if c.Status != want[c.Name] {
			t.Errorf("%s: %v; want %v", c.Name, c.Status, want[c.Name])
		}
	}
}

func TestUpdate(t *testing.T) {
	kept := File{About: "x", Figures: []Figure{
		{Name: "same", Value: 1, Unit: "u", Better: Lower, Why: "old why"},
		{Name: "up", Value: 1, Unit: "u", Better: Lower, Why: "old why"},
		{Name: "down", Value: 3, Unit: "u", Better: Lower, Why: "kept why"},
		{Name: "gone", Value: 1, Unit: "u", Better: Lower},
	}}
	got := []Figure{
		{Name: "same", Value: 1, Unit: "u", Better: Lower},
		{Name: "up", Value: 2, Unit: "u", Better: Lower},
		{Name: "down", Value: 2, Unit: "u", Better: Lower},
		{Name: "new", Value: 5, Unit: "u", Better: Lower},
	}
	for name, tc := range map[string]struct {
		why     string
		partial bool
		err     string
		want    map[string]string // figure → its why afterwards
		retired []string
	}{
		"no why":                            {err: "2 figures get worse or are retired", partial: false},
		"partial, no why for the worse one": {partial: true, err: "1 figures get worse"},
		"why given":                         {why: "because", want: map[string]string{"same": "old why", "up": "because", "down": "kept why", "new": ""}, retired: []string{"gone"}},
		"why given, partial":                {why: "because", partial: true, want: map[string]string{"same": "old why", "up": "because", "down": "kept why", "new": "", "gone": ""}},
	} {
		t.Run(name, func(t *testing.T) {
			f, err := Update(kept, got, tc.why, tc.partial)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Update = %v; want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			whys := map[string]string{}
			for _, g := range f.Figures {
				whys[g.Name] = g.Why
			}
			if !reflect.DeepEqual(whys, tc.want) {
				t.Errorf("whys %v; want %v", whys, tc.want)
			}
			var retired []string
			for _, r := range f.Retired {
				retired = append(retired, r.Name)
				if r.Why != tc.why {
					t.Errorf("retired %s with why %q; want %q", r.Name, r.Why, tc.why)
				}
			}
			if !reflect.DeepEqual(retired, tc.retired) {
				t.Errorf("retired %v; want %v", retired, tc.retired)
			}
		})
	}
}

func TestParse(t *testing.T) {
	for name, tc := range map[string]struct {
		text, err string
	}{
		"fine":            {`{"about":"a","figures":[{"name":"x","value":1,"unit":"u","better":"lower"}]}`, ""},
		"twice":           {`{"about":"a","figures":[{"name":"x","value":1,"unit":"u","better":"lower"},{"name":"x","value":2,"unit":"u","better":"lower"}]}`, "listed twice"},
		"no direction":    {`{"about":"a","figures":[{"name":"x","value":1,"unit":"u"}]}`, "want \"lower\" or \"higher\""},
		"unknown field":   {`{"about":"a","figurez":[]}`, "unknown field"},
		"slack too large": {`{"about":"a","figures":[{"name":"x","value":1,"unit":"u","better":"lower","slack":1}]}`, "slack"},
		"no name":         {`{"about":"a","figures":[{"name":"","value":1,"unit":"u","better":"lower"}]}`, "non-empty name"},
		"not json":        {`figures`, "invalid character"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.text))
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("Parse = %v; want %q", err, tc.err)
			}
		})
	}
}

// TestWriteRead: the file round-trips, sorted, one figure a line, and
// Write leaves nothing beside it.
func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gates.json")
	f := File{About: "figures", Figures: []Figure{fig("b", 2), {Name: "a", Value: 1.0234, Unit: "ratio", Better: Lower, Why: "w"}},
		Retired: []Retired{{Name: "z", Why: "gone"}}}
	if err := Write(path, f); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(data), "\n"); lines != 10 {
		t.Errorf("%d lines:\n%s\nwant 10 (a figure a line)", lines, data)
	}
	back, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if back.Figures[0].Name != "a" || back.Figures[1] != fig("b", 2) || back.Retired[0].Why != "gone" || back.About != "figures" {
		t.Errorf("read back %+v", back)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files in the folder; want the file alone", len(entries))
	}
	if _, err := Read(filepath.Join(dir, "none.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read of a missing file = %v; want fs.ErrNotExist", err)
	}
}
