// Package units parses and formats byte sizes the way vram's specs, flags
// and error messages write them: "256MiB", "2 GiB", "1.5GB", "4096".
//
// It owns the byte multiples (KiB to TiB), ParseSize, Format and RoundUp
// (rounding up to a granularity without overflowing). It knows nothing of
// devices or allocators; it only turns numbers into text and back.
package units
