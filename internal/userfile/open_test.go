package userfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestReadBounded(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "m.json")
	write(t, p, "0123456789")
	tests := map[string]struct {
		path string
		max  int64
		want error
	}{
		"at the bound":   {p, 10, nil},
		"over the bound": {p, 9, ErrTooLarge},
		"a directory":    {dir, 10, ErrNotRegular},
		"not there":      {filepath.Join(dir, "none"), 10, os.ErrNotExist},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b, err := ReadBounded(tc.path, tc.max)
			if !errors.Is(err, tc.want) || (err == nil && string(b) != "0123456789") {
				t.Errorf("ReadBounded: %q, %v; want error %v", b, err, tc.want)
			}
		})
	}
}
