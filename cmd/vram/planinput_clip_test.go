package main

import (
	"strings"
	"testing"
)

// TestPlanInputErrorsAreShort gives vram plan request sets whose bad
// value is a megabyte long (a dtype, a key, a size, a number): each
// error quotes a clipped piece of it, never the whole.
func TestPlanInputErrorsAreShort(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	digits := strings.Repeat("9", 1<<20)
	tests := map[string]struct {
		json string
		want string
	}{
		"a dtype":         {`{"requests": {"c": {"x": {"shape": [4], "dtype": "` + long + `"}}}}`, `unknown dtype "xxxxxxxx`},
		"a memory type":   {`{"requests": {"c": {"x": {"shape": [4], "dtype": "float32", "memory": "` + long + `"}}}}`, `unknown memory type "xxxx`},
		"a client's name": {`{"requests": {"` + long + `": {"x": {"shape": [-4], "dtype": "float32"}}}}`, `dimensions must be at least 1`},
		"an unknown key":  {`{"requests": {"c": {"x": {"shape": [4], "dtype": "float32", "` + long + `": 1}}}}`, `unknown key "xxxx`},
		"a budget":        {`{"budget": "` + long + `", "requests": {"c": {"x": {"shape": [4], "dtype": "float32"}}}}`, `budget: "xxxx`},
		"a number":        {`{"requests": {"c": {"x": {"shape": [` + digits + `], "dtype": "float32"}}}}`, `want an integer, got a number`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := parsePlanInput([]byte(tc.json))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%.300v; want an error saying %q", err, tc.want)
			}
			if n := len(err.Error()); n > 400 {
				t.Errorf("an error of %d bytes: %.200q…", n, err)
			}
		})
	}
}
