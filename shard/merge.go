package shard

// Gathering the parts of a batch into its whole output (see the package
// doc's # Parts). The steps, in order: read the manifests and open the
// parts they name (loadParts), check that they are one batch's and cover
// it (checkCoverage), refuse an output that is one of them or no regular
// file, then copy every part's runs into the output's new content and put
// it in place (writeMerged).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/vramkit/vram/internal/userfile"
	"github.com/vramkit/vram/npy"
)

// Errors of Merge about the set of parts.
var (
	ErrMissingPart   = errors.New("runs missing from the parts")
	ErrDuplicatePart = errors.New("runs in more than one part")
	ErrPartMismatch  = errors.New("parts of different batches")
	ErrPartData      = errors.New("a part's data does not match its manifest")
)

// MaxManifestBytes bounds a manifest Merge reads: one is a few hundred
// bytes.
const MaxManifestBytes = 64 << 10

// mergeCopyBytes is the size of the buffer Merge copies through.
const mergeCopyBytes = 4 << 20

// MergeOptions say which parts Merge gathers and what it leaves.
type MergeOptions struct {
	// Parts are the parts' .npy files; none: every part of out with a
	// manifest beside it.
	Parts []string
	// RemoveParts removes the parts and their manifests once out is
	// written.
	RemoveParts bool
}

// Merged is what Merge wrote. A plain value.
type Merged struct {
	Out    string
	Header npy.Header // out's dtype and shape
	Bytes  int64      // out's size, its header included
	Parts  []MergedPart
	// Removed is set when RemoveParts removed the parts and manifests.
	Removed bool
}

// MergedPart is one part Merge gathered.
type MergedPart struct {
	Path     string
	FirstRun int
	Runs     int
}

// Merge gathers the parts of the batch whose whole output is out into
// out, as the package doc's # Parts says, stopping between parts when ctx
// is done. An error leaves out as it was; one about the set of parts
// wraps ErrMissingPart, ErrDuplicatePart, ErrPartMismatch or ErrPartData.
func Merge(ctx context.Context, out string, o MergeOptions) (_ Merged, err error) {
	if !strings.HasSuffix(out, ".npy") {
		return Merged{}, fmt.Errorf("merge into %s: the output's name must end in .npy: %w", out, ErrShard)
	}
	parts, err := loadParts(out, o.Parts)
	defer func() {
		for _, p := range parts {
			if p.f != nil {
				err = errors.Join(err, p.f.Close())
			}
		}
	}()
	if err != nil {
		return Merged{}, err
	}
	if err := checkCoverage(out, parts); err != nil {
		return Merged{}, err
	}
	if _, _, err := userfile.Check(out, userfile.Options{Inputs: inputs(parts)}); err != nil {
		return Merged{}, fmt.Errorf("merge into %s: %w", out, err)
	}
	res, err := writeMerged(ctx, out, parts)
	if err != nil || !o.RemoveParts {
		return res, err
	}
	var errs []error
	for _, p := range parts {
		errs = append(errs, p.f.Close(), os.Remove(p.path), os.Remove(p.manifest))
		p.f = nil
	}
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("%s is written, but removing the parts failed: %w", out, err)
	}
	res.Removed = true
	return res, nil
}

// mergePart is one part to gather: its manifest and its open file.
type mergePart struct {
	Manifest
	manifest string // the manifest's path
	path     string // the part's .npy
	f        *npy.File
}

// loadParts reads the manifests of the parts named, or of those found
// beside out, and opens their .npy files, checked against the manifests.
// The parts come back sorted by their first run.
func loadParts(out string, named []string) ([]*mergePart, error) {
	var manifests []string
	for _, p := range named {
		manifests = append(manifests, strings.TrimSuffix(p, ".npy")+".json")
	}
	if len(named) == 0 {
		found, err := filepath.Glob(partPattern(out, "json"))
		if err != nil {
			return nil, err
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("no parts of %s: want %s files, each with its .json manifest%s: %w",
				out, PartGlob(out, "npy"), unfinishedNote(out), ErrMissingPart)
		}
		manifests = found
	}
	var parts []*mergePart
	for _, m := range manifests {
		p, err := openPart(m)
		if p != nil {
			parts = append(parts, p)
		}
		if err != nil {
			return parts, err
		}
	}
	sort.SliceStable(parts, func(i, j int) bool { return parts[i].FirstRun < parts[j].FirstRun })
	return parts, nil
}

// unfinishedNote names the parts of out that have no manifest, if any.
func unfinishedNote(out string) string {
	found, _ := filepath.Glob(partPattern(out, "npy"))
	if len(found) == 0 {
		return ""
	}
	return fmt.Sprintf("; %s exist without a manifest: their shards did not finish", strings.Join(found, ", "))
}

// openPart reads one manifest and opens the part it names.
func openPart(manifest string) (*mergePart, error) {
	b, err := userfile.ReadBounded(manifest, MaxManifestBytes)
	if errors.Is(err, os.ErrNotExist) {
		part := strings.TrimSuffix(manifest, ".json") + ".npy"
		if _, serr := os.Stat(part); serr == nil {
			return nil, fmt.Errorf("part %s has no manifest %s: its shard did not finish (run it again): %w", part, manifest, ErrMissingPart)
		}
		return nil, fmt.Errorf("part %s: not found: %w", part, ErrMissingPart)
	}
	if err != nil {
		return nil, fmt.Errorf("read the manifest: %w", err)
	}
	m, err := ParseManifest(manifest, b)
	if err != nil {
		return nil, err
	}
	p := &mergePart{Manifest: m, manifest: manifest, path: filepath.Join(filepath.Dir(manifest), m.Part)}
	if p.f, err = npy.Open(p.path); err != nil {
		return nil, fmt.Errorf("part of manifest %s: %w", manifest, err)
	}
	h := p.f.Header()
	if h.Fortran || p.Axis >= len(h.Shape) || h.Shape[p.Axis] != p.Runs {
		return p, fmt.Errorf("part %s holds %v, but its manifest says %d runs on axis %d in C order", p.path, h, p.Runs, p.Axis)
	}
	if p.f.DataBytes() != p.DataBytes {
		return p, fmt.Errorf("part %s holds %d bytes of data, but its manifest says %d", p.path, p.f.DataBytes(), p.DataBytes)
	}
	return p, nil
}

// ParseManifest reads b, the manifest at path, and checks that it
// describes a part CreatePart writes: a shard's runs of a batch by the
// rule, its own part's name and the checksum of that part's data. A
// manifest is untrusted: b is decoded by encoding/json into fixed fields
// (memory a small multiple of its size, time linear), and a message
// quotes at most 40 bytes of a name in it.
func ParseManifest(path string, b []byte) (Manifest, error) {
	var m struct {
		Manifest
		Axis *int `json:"axis"` // nil: an older manifest, which says none
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("manifest %s: %w", path, err)
	}
	if m.Part == "" || m.Runs < 1 || m.FirstRun < 0 || m.Runs > m.TotalRuns-m.FirstRun {
		return Manifest{}, fmt.Errorf("manifest %s: part %s of runs %d+%d of %d does not describe a part of a batch", path, clip(m.Part), m.FirstRun, m.Runs, m.TotalRuns)
	}
	// The runs must be those the rule gives the shard it names, which
	// also bounds its count of shards by the batch's runs.
	s := Shard{Index: m.Shard, Count: m.Shards}
	if s.Valid() != nil || s.Count > uint64(m.TotalRuns) {
		return Manifest{}, fmt.Errorf("manifest %s: shard %d of %d shards of %d runs: not a shard of the rule", path, m.Shard, m.Shards, m.TotalRuns)
	}
	if lo, hi := s.Range(uint64(m.TotalRuns)); lo != uint64(m.FirstRun) || hi-lo != uint64(m.Runs) {
		return Manifest{}, fmt.Errorf("manifest %s: shard %s of %d runs holds runs %d-%d, but the manifest says %d+%d", path, s, m.TotalRuns, lo, hi-1, m.FirstRun, m.Runs)
	}
	if m.Axis == nil || *m.Axis < 0 {
		return Manifest{}, fmt.Errorf("manifest %s names no run axis (an older vram wrote it): run its shard again", path)
	}
	m.Manifest.Axis = *m.Axis
	if err := checkNames(path, m.Manifest); err != nil {
		return Manifest{}, err
	}
	return m.Manifest, nil
}

// checkNames checks that the manifest at path is its shard's (by its file
// name) and names its shard's part, in its own directory, and that it
// carries the checksum of that part's data.
func checkNames(path string, m Manifest) error {
	stem := strings.TrimSuffix(filepath.Base(path), ".json")
	if want := fmt.Sprintf(".shard-%d-of-%d", m.Shard, m.Shards); !strings.HasSuffix(stem, want) {
		return fmt.Errorf("manifest %s says it is shard %d/%d, which its name does not: it was renamed or edited", path, m.Shard, m.Shards)
	}
	if want := stem + ".npy"; m.Part != want {
		return fmt.Errorf("manifest %s names the part %s, not its own %s: it was edited, or copied from another shard", path, clip(m.Part), want)
	}
	if _, err := strconv.ParseUint(m.DataCRC32C, 16, 32); err != nil || len(m.DataCRC32C) != 8 {
		return fmt.Errorf("manifest %s has no checksum of its part's data (data_crc32c %s; an older vram wrote none): run the shard again", path, clip(m.DataCRC32C))
	}
	return nil
}

// clip quotes s, at most 40 bytes of it.
func clip(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q… (%d bytes)", s[:40], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// checkCoverage checks that the parts, sorted by first run, are of one
// batch and hold each of its runs exactly once.
func checkCoverage(out string, parts []*mergePart) error {
	first := parts[0]
	var errs []error
	for _, p := range parts[1:] {
		if !sameBatch(first, p) {
			errs = append(errs, fmt.Errorf("%s (%s) and %s (%s): %w", first.manifest, batchOf(first), p.manifest, batchOf(p), ErrPartMismatch))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	next, last := 0, (*mergePart)(nil) // runs before next are covered, the last of them by last
	for _, p := range parts {
		end := p.FirstRun + p.Runs
		switch {
		case p.FirstRun > next:
			errs = append(errs, missing(out, parts, next, p.FirstRun))
		case p.FirstRun < next:
			errs = append(errs, fmt.Errorf("runs %d-%d are in both %s and %s: %w", p.FirstRun, min(next, end)-1, last.path, p.path, ErrDuplicatePart))
		}
		if end > next {
			next, last = end, p
		}
	}
	if next < first.TotalRuns {
		errs = append(errs, missing(out, parts, next, first.TotalRuns))
	}
	return errors.Join(errs...)
}

// sameBatch reports whether a and b are parts of one batch: the same
// runs, Batch, run axis, dtype and shape but for that axis.
func sameBatch(a, b *mergePart) bool {
	ha, hb := a.f.Header(), b.f.Header()
	if a.TotalRuns != b.TotalRuns || a.Axis != b.Axis || ha.Descr != hb.Descr || len(ha.Shape) != len(hb.Shape) || !sameJSON(a.Batch, b.Batch) {
		return false
	}
	for i := range ha.Shape {
		if i != a.Axis && ha.Shape[i] != hb.Shape[i] {
			return false
		}
	}
	return true
}

// sameJSON reports whether a and b are the same JSON value, key order and
// spacing aside (both empty: the same).
func sameJSON(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return bytes.Equal(a, b)
	}
	ca, _ := json.Marshal(va) // maps marshal with sorted keys
	cb, _ := json.Marshal(vb)
	return bytes.Equal(ca, cb)
}

// batchOf describes p's batch for a message.
func batchOf(p *mergePart) string {
	s := fmt.Sprintf("%d runs of %v on axis %d", p.TotalRuns, p.f.Header(), p.Axis)
	if len(p.Batch) > 0 {
		var b bytes.Buffer
		_ = json.Compact(&b, p.Batch) // valid: it was decoded
		if b.Len() > 120 {
			return fmt.Sprintf("%s, batch %s… (%d bytes)", s, b.Bytes()[:120], b.Len())
		}
		s += ", batch " + b.String()
	}
	return s
}

// missing says that runs lo … hi−1 are in no part, and, when the parts
// agree on a count of shards, which shards' parts would hold them.
func missing(out string, parts []*mergePart, lo, hi int) error {
	msg := fmt.Sprintf("runs %d-%d of %d are in no part", lo, hi-1, parts[0].TotalRuns)
	n := parts[0].Shards
	for _, p := range parts {
		if p.Shards != n {
			n = 0
		}
	}
	if n > 0 {
		var names []string
		for i := range n {
			s := Shard{Index: i, Count: n}
			start, end := s.Range(uint64(parts[0].TotalRuns))
			if int(start) < hi && int(end) > lo {
				path, manifest := Paths(out, s)
				names = append(names, fmt.Sprintf("shard %s (%s: %s)", s, path, partState(path, manifest)))
			}
		}
		msg += ": " + strings.Join(names, ", ")
	}
	return fmt.Errorf("%s: %w", msg, ErrMissingPart)
}

// partState says why a part Merge needs was not among those it read:
// there is no part, or no manifest (its shard did not finish), or both
// are there and it was not named.
func partState(path, manifest string) string {
	_, perr := os.Stat(path)
	_, merr := os.Stat(manifest)
	switch {
	case perr != nil:
		return "not found"
	case merr != nil:
		return "no manifest " + filepath.Base(manifest) + ": the shard did not finish"
	}
	return "finished, with its manifest " + filepath.Base(manifest) + ", but not among the parts named: name it too, or name no parts to gather every part beside OUT"
}

// inputs are the files Merge reads: the parts and their manifests, none
// of which the output may be.
func inputs(parts []*mergePart) []string {
	var in []string
	for _, p := range parts {
		in = append(in, p.path, p.manifest)
	}
	return in
}

// writeMerged copies every part's runs into out's new content, written
// beside it and renamed into place once whole.
func writeMerged(ctx context.Context, out string, parts []*mergePart) (res Merged, err error) {
	first := parts[0]
	h := first.f.Header()
	h.Shape = slices.Clone(h.Shape)
	h.Shape[first.Axis] = first.TotalRuns
	res = Merged{Out: out, Header: h}
	uf, err := userfile.Create(out, userfile.Options{Inputs: inputs(parts)})
	if err != nil {
		return res, fmt.Errorf("merge into %s: %w", out, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, uf.Abort())
		}
	}()
	f, err := npy.CreateIn(uf.OS(), h)
	if err != nil {
		return res, fmt.Errorf("merge into %s: %w", out, err)
	}
	buf := make([]byte, mergeCopyBytes)
	for _, p := range parts {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("merge interrupted: %w", err)
		}
		if err := copyPart(f, uf.TempName(), p, buf); err != nil {
			return res, err
		}
		res.Parts = append(res.Parts, MergedPart{Path: p.path, FirstRun: p.FirstRun, Runs: p.Runs})
	}
	res.Bytes = f.DataOffset() + f.DataBytes()
	if err := uf.Commit(); err != nil {
		return res, fmt.Errorf("merge into %s: %w", out, err)
	}
	return res, nil
}

// copyPart copies part p's runs to their places in f (out's new content,
// the file tmp) through buf, and checks that the data read is what p's
// manifest vouches for (its CRC-32C): a part rewritten, zeroed or of
// another job since is an error. Each of the part's blocks (one per
// index of the axes before the run axis) is its runs × the bytes of the
// axes after it, and goes at the run FirstRun of the output's block.
func copyPart(f *npy.File, tmp string, p *mergePart, buf []byte) error {
	h := p.f.Header()
	item, err := h.ItemSize()
	if err != nil {
		return fmt.Errorf("part %s: %w", p.path, err)
	}
	blocks, inner := int64(1), int64(item)
	for i, d := range h.Shape {
		if i < p.Axis {
			blocks *= int64(d)
		} else if i > p.Axis {
			inner *= int64(d)
		}
	}
	sum := crc32.New(castagnoli)
	for b := range blocks {
		src, dst := b*int64(p.Runs)*inner, (b*int64(p.TotalRuns)+int64(p.FirstRun))*inner
		for left := int64(p.Runs) * inner; left > 0; {
			chunk := buf[:min(left, int64(len(buf)))]
			if _, err := p.f.ReadAt(chunk, src); err != nil {
				return fmt.Errorf("read %s: %w", p.path, err)
			}
			sum.Write(chunk)
			if _, err := f.WriteAt(chunk, dst); err != nil {
				return fmt.Errorf("write %s: %w", tmp, err)
			}
			src, dst, left = src+int64(len(chunk)), dst+int64(len(chunk)), left-int64(len(chunk))
		}
	}
	if got := fmt.Sprintf("%08x", sum.Sum32()); got != p.DataCRC32C {
		return fmt.Errorf("part %s's data has CRC-32C %s, but its manifest %s says %s: the part was rewritten, zeroed or replaced since its shard wrote it; run the shard again: %w",
			p.path, got, p.manifest, p.DataCRC32C, ErrPartData)
	}
	return nil
}
