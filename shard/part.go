package shard

// A shard's part of a batch's output and its manifest (see the package
// doc's # Parts): written beside their paths, the part put in place
// first, then the manifest that vouches for it.

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/vramkit/vram/internal/userfile"
	"github.com/vramkit/vram/npy"
)

// Manifest is what a finished part says about itself: the
// OUT.shard-i-of-N.json beside its .npy. A plain value.
type Manifest struct {
	Part      string `json:"part"`  // the part's .npy file name, in the manifest's directory
	Shard     uint64 `json:"shard"` // i of shard i/N
	Shards    uint64 `json:"shards"`
	From      string `json:"from"`      // where the shard came from: --shard, slurm, kubernetes
	FirstRun  int    `json:"first_run"` // the batch's index of the part's run 0
	Runs      int    `json:"runs"`      // runs in the part
	TotalRuns int    `json:"total_runs"`
	// Axis is the axis of the part's array that holds its runs.
	Axis int `json:"axis"`
	// Batch says which batch the part is of, as its writer tells
	// batches apart (vram run: the seed, steps, samples and dt); parts of
	// one batch have equal Batch values. Empty: the writer tells none.
	Batch json.RawMessage `json:"batch,omitempty"`
	// DataBytes and DataCRC32C are the part's data (after its .npy
	// header): its size and CRC-32C (Castagnoli) in hex, so that Merge
	// takes only the file this manifest was written for.
	DataBytes  int64  `json:"data_bytes"`
	DataCRC32C string `json:"data_crc32c"`
}

// Paths are the part of shard s and its manifest for the output out
// (OUT.npy): OUT.shard-i-of-N.npy and OUT.shard-i-of-N.json.
func Paths(out string, s Shard) (part, manifest string) {
	name := fmt.Sprintf("%s.shard-%d-of-%d", strings.TrimSuffix(out, ".npy"), s.Index, s.Count)
	return name + ".npy", name + ".json"
}

// PartGlob is the pattern of out's parts' files with extension ext
// ("npy", "json"), as messages write it.
func PartGlob(out, ext string) string {
	return strings.TrimSuffix(out, ".npy") + ".shard-*-of-*." + ext
}

// partPattern is PartGlob with out's own special characters escaped, for
// filepath.Glob.
func partPattern(out, ext string) string {
	r := strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`)
	return r.Replace(strings.TrimSuffix(out, ".npy")) + ".shard-*-of-*." + ext
}

// PartOptions say what CreatePart cannot tell from the header.
type PartOptions struct {
	// Axis is the axis of the header's shape that holds the part's runs.
	Axis int
	// From says where the shard came from (default s.From).
	From string
	// Batch identifies the batch (Manifest.Batch): a JSON value, or nil.
	Batch json.RawMessage
}

// Part is a shard's part being written: its .npy in a file beside its
// path until Commit. Not safe for concurrent Commit and Abort; writes
// through File are as safe as the npy.File's.
type Part struct {
	uf       *userfile.File
	f        *npy.File
	path     string // the part's .npy, once in place
	manifest string
	m        Manifest
}

// CreatePart makes the part of shard s of a batch of totalRuns runs whose
// whole output is out (OUT.npy): a zeroed array of header h, in C order,
// whose run axis (o.Axis) is as long as the shard's runs (Range). Write
// its data through File, then Commit it or Abort. A part or manifest of
// an earlier try stays as it was until Commit.
func CreatePart(out string, s Shard, totalRuns int, h npy.Header, o PartOptions) (*Part, error) {
	if err := s.Valid(); err != nil {
		return nil, fmt.Errorf("create a part of %s: %w", out, err)
	}
	if !strings.HasSuffix(out, ".npy") {
		return nil, fmt.Errorf("create a part of %s: the output's name must end in .npy: %w", out, ErrShard)
	}
	if totalRuns < 1 || s.Count > uint64(totalRuns) {
		return nil, fmt.Errorf("create a part of %s: shard %s of %d runs has no runs: want at most %d shards: %w", out, s, totalRuns, max(totalRuns, 0), ErrShard)
	}
	lo, hi := s.Range(uint64(totalRuns))
	if h.Fortran || o.Axis < 0 || o.Axis >= len(h.Shape) || h.Shape[o.Axis] != int(hi-lo) {
		return nil, fmt.Errorf("create part %s of %s: an array of %v with its runs on axis %d; want C order and %d runs (runs %d-%d) on that axis: %w",
			s, out, h, o.Axis, hi-lo, lo, hi-1, ErrShard)
	}
	if len(o.Batch) > 0 && !json.Valid(o.Batch) {
		return nil, fmt.Errorf("create part %s of %s: Batch is not a JSON value: %w", s, out, ErrShard)
	}
	path, manifest := Paths(out, s)
	uf, err := userfile.Create(path, userfile.Options{})
	if err != nil {
		return nil, fmt.Errorf("create part %s: %w", s, err)
	}
	f, err := npy.CreateIn(uf.OS(), h)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("create part %s: %w", s, err), uf.Abort())
	}
	from := o.From
	if from == "" {
		from = s.From
	}
	m := Manifest{Part: filepath.Base(path), Shard: s.Index, Shards: s.Count, From: from,
		FirstRun: int(lo), Runs: int(hi - lo), TotalRuns: totalRuns, Axis: o.Axis, Batch: o.Batch}
	return &Part{uf: uf, f: f, path: path, manifest: manifest, m: m}, nil
}

// File is the part's array, to write its data into (npy.File.WriteAt).
func (p *Part) File() *npy.File { return p.f }

// Path is where the part goes: OUT.shard-i-of-N.npy.
func (p *Part) Path() string { return p.path }

// Manifest is what the part's manifest will say (its checksum once
// committed).
func (p *Part) Manifest() Manifest { return p.m }

// Commit reads the part's data back for its checksum, removes an older
// manifest (which would vouch for the new part), puts the part in place
// and writes its manifest beside it, whole or not at all.
func (p *Part) Commit() error {
	sum, err := checksum(p.f)
	if err != nil {
		return errors.Join(fmt.Errorf("part %s: read it back: %w", p.path, err), p.uf.Abort())
	}
	if err := os.Remove(p.manifest); err != nil && !errors.Is(err, os.ErrNotExist) {
		return errors.Join(fmt.Errorf("part %s: remove the old manifest: %w", p.path, err), p.uf.Abort())
	}
	if err := p.uf.Commit(); err != nil {
		return fmt.Errorf("part %s: %w", p.path, err)
	}
	p.m.DataBytes, p.m.DataCRC32C = p.f.DataBytes(), sum
	b, err := json.MarshalIndent(p.m, "", "  ")
	if err != nil {
		return err
	}
	err = userfile.Write(p.manifest, userfile.Options{}, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
	if err != nil {
		return fmt.Errorf("part %s: write its manifest: %w", p.path, err)
	}
	return nil
}

// Abort removes the part being written, leaving what was at its path and
// its manifest as they were.
func (p *Part) Abort() error {
	if err := p.uf.Abort(); err != nil {
		return fmt.Errorf("part %s: %w", p.path, err)
	}
	return nil
}

// castagnoli is the CRC-32C table of manifests' checksums.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum is the CRC-32C of f's data, in hex.
func checksum(f *npy.File) (string, error) {
	h := crc32.New(castagnoli)
	if _, err := io.Copy(h, io.NewSectionReader(f.OS(), f.DataOffset(), f.DataBytes())); err != nil {
		return "", err
	}
	return fmt.Sprintf("%08x", h.Sum32()), nil
}
