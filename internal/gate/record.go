package gate

// The tests' side: a TestGate… function measures its figures and hands
// them to Record, which writes them, one JSON object a line, to a file of
// its own in the folder $VRAM_GATE_OUT names (the gate command sets it);
// outside the gate it logs them. Collect reads the folder back.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// OutEnv names the folder the gate command collects figures in.
const OutEnv = "VRAM_GATE_OUT"

// Running reports whether the gate command runs the calling test.
func Running() bool { return os.Getenv(OutEnv) != "" }

// Need skips tb unless the gate command runs it: for figures that cost
// too much for every run of the package's tests.
func Need(tb testing.TB) {
	tb.Helper()
	if !Running() {
		tb.Skipf("a gate's figures, measured by the gate (go run ./internal/gate/cmd/gate; $%s unset)", OutEnv)
	}
}

// Record hands figures to the gate. A figure that is not valid (no name,
// no direction, a value that is not a number) fails tb.
func Record(tb testing.TB, figs ...Figure) {
	tb.Helper()
	for _, f := range figs {
		if err := f.check(); err != nil {
			tb.Fatal(err)
		}
		f.Why = ""
	}
	dir := os.Getenv(OutEnv)
	if dir == "" {
		for _, f := range figs {
			tb.Logf("gate figure %s: %v %s", f.Name, f.Value, f.Unit)
		}
		return
	}
	name := fmt.Sprintf("%d-%s.jsonl", os.Getpid(), unsafeChars.ReplaceAllString(tb.Name(), "_"))
	out, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriter(out)
	for _, f := range figs {
		line, _ := json.Marshal(f)
		w.Write(line)
		w.WriteByte('\n')
	}
	err = w.Flush()
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		tb.Fatal(err)
	}
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// maxCollect bounds what Collect reads: a few thousand figures.
const maxCollect = 16 << 20

// Collect reads the figures Record wrote into dir. A name measured twice
// is an error.
func Collect(dir string) ([]Figure, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("gate: %w", err)
	}
	var out []Figure
	seen := map[string]string{}
	read := 0
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("gate: %w", err)
		}
		if read += len(data); read > maxCollect {
			return nil, fmt.Errorf("gate: the figures in %s pass %d bytes", dir, maxCollect)
		}
		for line := range strings.Lines(string(data)) {
			var f Figure
			if err := json.Unmarshal([]byte(line), &f); err != nil {
				return nil, fmt.Errorf("gate: %s: %w", filepath.Base(p), err)
			}
			if err := f.check(); err != nil {
				return nil, err
			}
			if prev, ok := seen[f.Name]; ok {
				return nil, fmt.Errorf("gate: figure %q measured twice (%s and %s)", f.Name, prev, filepath.Base(p))
			}
			seen[f.Name] = filepath.Base(p)
			out = append(out, f)
		}
	}
	return out, nil
}
