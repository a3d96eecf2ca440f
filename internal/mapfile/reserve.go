package mapfile

import "os"

// writeZeros writes zeros over f's first n bytes, a megabyte at a time.
func writeZeros(f *os.File, n int64) error {
	zeros := make([]byte, min(n, 1<<20))
	for off := int64(0); off < n; {
		k, err := f.WriteAt(zeros[:min(int64(len(zeros)), n-off)], off)
		if err != nil {
			return err
		}
		off += int64(k)
	}
	return nil
}
