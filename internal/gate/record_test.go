package gate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRecordCollect: figures recorded under the gate come back from
// Collect; a name measured twice is an error; a figure that is not valid
// is refused.
func TestRecordCollect(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(OutEnv, dir)
	if !Running() {
		t.Fatal("Running is false with $" + OutEnv + " set")
	}
	Record(t, fig("heap/a", 1), fig("heap/b", 0))
	t.Run("another test", func(t *testing.T) { Record(t, fig("heap/c", 2)) })
	got, err := Collect(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("collected %+v; want 3 figures", got)
	}
	t.Run("twice", func(t *testing.T) { Record(t, fig("heap/a", 3)) })
	if _, err := Collect(dir); err == nil || !strings.Contains(err.Error(), `"heap/a" measured twice`) {
		t.Errorf("Collect with a figure twice = %v; want an error naming it", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.jsonl"), []byte(`{"name":"x","value":1}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Collect(dir); err == nil {
		t.Error("Collect of a figure with no direction succeeded")
	}
}

// TestNeedSkips: outside the gate, Need skips.
func TestNeedSkips(t *testing.T) {
	t.Setenv(OutEnv, "")
	ran := false
	t.Run("costly", func(t *testing.T) {
		Need(t)
		ran = true
	})
	if ran {
		t.Error("Need did not skip with $" + OutEnv + " unset")
	}
}
