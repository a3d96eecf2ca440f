// `vram merge OUT.npy [PART.npy ...]`: gather the parts that the shards
// of `vram run --shard i/N --out OUT.npy` wrote into OUT.npy.
//
// Each part OUT.shard-i-of-N.npy holds the trajectories of a contiguous
// range of the batch's runs, shape (samples, 2, its runs); its manifest
// OUT.shard-i-of-N.json says which range of which batch. merge reads the
// manifests (found beside OUT.npy, or the ones of the parts named), checks
// that they describe one batch and that their ranges cover every run
// exactly once, that each names its own shard's part, and, as it copies,
// that each part's data is the one its manifest vouches for (its size and
// CRC-32C), and copies each part's 2 × samples rows to their places
// in OUT.npy, shape (samples, 2, runs): the file `vram run --out OUT.npy`
// writes for the whole batch in one process, byte for byte. A run in no
// part, or in two, is an error that names the runs and the parts. The
// output is written beside OUT.npy (internal/userfile) and renamed into
// place, so OUT.npy is either whole or untouched; an OUT.npy that is one
// of the parts or manifests, or not a regular file, is refused before
// anything is written or removed. It holds no more than one buffer of data
// in memory, whatever the batch's size.

package main

import (
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

	"github.com/spf13/cobra"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/internal/userfile"
	"github.com/vramkit/vram/npy"
)

// Errors of merge about the set of parts.
var (
	errMissingPart   = errors.New("runs missing from the parts")
	errDuplicatePart = errors.New("runs in more than one part")
	errPartMismatch  = errors.New("parts of different batches")
	errPartData      = errors.New("a part's data does not match its manifest")
)

// mergeCopyBytes is the size of the buffer merge copies through.
const mergeCopyBytes = 4 << 20

// mergePart is one part to gather: its manifest and its open file.
type mergePart struct {
	partManifest
	manifest string // the manifest's path
	path     string // the part's .npy
	f        *npy.File
}

// mergeReport is what merge reports; --json prints it.
type mergeReport struct {
	Out   string           `json:"out"`
	Shape []int            `json:"shape"`
	Bytes int64            `json:"bytes"`
	Parts []mergeReportRow `json:"parts"`
	// Removed is set when --remove-parts removed the parts and manifests.
	Removed bool `json:"removed_parts,omitempty"`
}

type mergeReportRow struct {
	Part     string `json:"part"`
	FirstRun int    `json:"first_run"`
	Runs     int    `json:"runs"`
}

func (a *app) mergeCommand() *cobra.Command {
	var remove bool
	cmd := &cobra.Command{
		Use:         "merge OUT.npy [PART.npy ...]",
		Annotations: noDeviceSpec(),
		Short:       "Gather the parts written by sharded runs into one .npy",
		Long: `Merge gathers the parts that the shards of
    vram run --shard i/N --out OUT.npy
(or the tasks of a Slurm job array or Kubernetes Indexed Job, which find
their shard in the environment) wrote as OUT.shard-i-of-N.npy, each with
its manifest OUT.shard-i-of-N.json, into OUT.npy: float32, C order, shape
(samples, 2, runs), byte for byte the file one process writes with
vram run --out OUT.npy.

With no PART arguments it gathers every part with a manifest beside
OUT.npy. The parts must describe one batch (the same --runs, --seed,
--steps, --samples and --dt) and cover each of its runs exactly once: a
run in no part (a shard that failed, or never ran: its part has no
manifest) or in two (parts of different splits) is an error naming the
runs and the parts, and OUT.npy is left as it was. So is a part whose
data is not the one its manifest was written for (its CRC-32C differs:
rewritten, zeroed, another job's). An OUT.npy that is
one of the parts or manifests, or not a regular file, is refused before
anything is written or removed.`,
		Example: `  vram merge results.npy
  vram merge results.npy results.shard-0-of-2.npy results.shard-1-of-2.npy
  vram merge --remove-parts results.npy`,
		Args: usageArgs(1, -1, "OUT.npy, the file to gather the parts into"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.merge(args[0], args[1:], remove)
		},
	}
	cmd.Flags().BoolVar(&remove, "remove-parts", false, "remove the parts and their manifests once OUT.npy is written")
	return cmd
}

func (a *app) merge(out string, named []string, remove bool) (err error) {
	if err := checkNPYName("OUT", out); err != nil {
		return err
	}
	parts, err := loadParts(out, named)
	defer func() {
		for _, p := range parts {
			if p.f != nil {
				err = errors.Join(err, p.f.Close())
			}
		}
	}()
	if err != nil {
		return err
	}
	if err := checkCoverage(out, parts); err != nil {
		return err
	}
	if err := checkMergeOut(out, parts); err != nil {
		return err
	}
	rep, err := writeMerged(a, out, parts)
	if err != nil {
		return err
	}
	if remove {
		var errs []error
		for _, p := range parts {
			errs = append(errs, p.f.Close(), os.Remove(p.path), os.Remove(p.manifest))
			p.f = nil
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("%s is written, but removing the parts failed: %w", out, err)
		}
		rep.Removed = true
	}
	if a.json {
		return a.writeJSON(rep)
	}
	w := &errWriter{w: a.stdout}
	fmt.Fprintf(w, "merged %s into %s: float32 (%d, 2, %d), %s\n", plural(len(parts), "part"), out, rep.Shape[0], rep.Shape[2], units.Format(uint64(rep.Bytes)))
	if rep.Removed {
		fmt.Fprintf(w, "removed the parts and their manifests\n")
	}
	return w.err
}

// loadParts reads the manifests of the parts named, or of those found
// beside out, and opens their .npy files, checked against the manifests.
// The parts come back sorted by their first run.
func loadParts(out string, named []string) ([]*mergePart, error) {
	var manifests []string
	if len(named) > 0 {
		for _, p := range named {
			manifests = append(manifests, strings.TrimSuffix(p, ".npy")+".json")
		}
	} else {
		found, err := filepath.Glob(globEscape(strings.TrimSuffix(out, ".npy")) + ".shard-*-of-*.json")
		if err != nil {
			return nil, err
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("no parts of %s: want %s files, each with its .json manifest, written by vram run --shard i/N --out %s (or a scheduler's array of them)%s: %w",
				out, partGlob(out, "npy"), out, unfinishedNote(out), errMissingPart)
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

// maxManifestBytes bounds a manifest merge reads: one is a few hundred
// bytes.
const maxManifestBytes = 64 << 10

// openPart reads one manifest and opens the part it names.
func openPart(manifest string) (*mergePart, error) {
	b, err := userfile.ReadBounded(manifest, maxManifestBytes)
	if errors.Is(err, os.ErrNotExist) {
		part := strings.TrimSuffix(manifest, ".json") + ".npy"
		if _, serr := os.Stat(part); serr == nil {
			return nil, fmt.Errorf("part %s has no manifest %s: its shard did not finish (run it again): %w", part, manifest, errMissingPart)
		}
		return nil, fmt.Errorf("part %s: not found: %w", part, errMissingPart)
	}
	if err != nil {
		return nil, fmt.Errorf("read the manifest: %w", err)
	}
	p, err := parseManifest(manifest, b)
	if err != nil {
		return nil, err
	}
	p.path = filepath.Join(filepath.Dir(manifest), p.Part)
	if p.f, err = npy.Open(p.path); err != nil {
		return nil, fmt.Errorf("part of manifest %s: %w", manifest, err)
	}
	h, want := p.f.Header(), []int{p.Samples, 2, p.Runs}
	if h.Descr != vram.NPYDescr(vram.Float32) || h.Fortran || !slices.Equal(h.Shape, want) {
		return p, fmt.Errorf("part %s holds %v, but its manifest says float32 %v in C order", p.path, h, want)
	}
	if p.f.DataBytes() != p.DataBytes {
		return p, fmt.Errorf("part %s holds %d bytes of data, but its manifest says %d", p.path, p.f.DataBytes(), p.DataBytes)
	}
	return p, nil
}

// parseManifest reads b, the manifest at path manifest, and checks that it
// describes a part vram run writes: a shard's runs of a batch, its own
// part's name and the checksum of that part's data. A manifest is
// untrusted (it comes from shared storage): it is at most
// maxManifestBytes, decoded by encoding/json into fixed fields (memory a
// small multiple of its size, time linear), and a message quotes at most
// 40 bytes of a name in it.
func parseManifest(manifest string, b []byte) (*mergePart, error) {
	p := &mergePart{manifest: manifest}
	if err := json.Unmarshal(b, &p.partManifest); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", manifest, err)
	}
	if p.Part == "" || p.Runs < 1 || p.FirstRun < 0 || p.Runs > p.TotalRuns-p.FirstRun || p.Samples < 2 {
		return nil, fmt.Errorf("manifest %s: part %s of runs %d+%d of %d with %d samples does not describe a part of a batch", manifest, clip(p.Part), p.FirstRun, p.Runs, p.TotalRuns, p.Samples)
	}
	// The runs must be those the shard rule gives the shard it names,
	// which also bounds its count of shards by the batch's runs.
	s := shardOf(p.Shard, p.Shards)
	if s.Valid() != nil || s.Count > uint64(p.TotalRuns) {
		return nil, fmt.Errorf("manifest %s: shard %d of %d shards of %d runs: not a shard vram run writes", manifest, p.Shard, p.Shards, p.TotalRuns)
	}
	if lo, hi := s.Range(uint64(p.TotalRuns)); lo != uint64(p.FirstRun) || hi-lo != uint64(p.Runs) {
		return nil, fmt.Errorf("manifest %s: shard %s of %d runs holds runs %d-%d, but the manifest says %d+%d", manifest, s, p.TotalRuns, lo, hi-1, p.FirstRun, p.Runs)
	}
	if err := p.checkNames(); err != nil {
		return nil, err
	}
	return p, nil
}

// checkNames checks that the manifest is its shard's (by its file name)
// and names its shard's part, in its own directory, and that it carries
// the checksum of that part's data.
func (p *mergePart) checkNames() error {
	stem := strings.TrimSuffix(filepath.Base(p.manifest), ".json")
	if want := fmt.Sprintf(".shard-%d-of-%d", p.Shard, p.Shards); !strings.HasSuffix(stem, want) {
		return fmt.Errorf("manifest %s says it is shard %d/%d, which its name does not: it was renamed or edited", p.manifest, p.Shard, p.Shards)
	}
	if want := stem + ".npy"; p.Part != want {
		return fmt.Errorf("manifest %s names the part %s, not its own %s: it was edited, or copied from another shard", p.manifest, clip(p.Part), want)
	}
	if _, err := strconv.ParseUint(p.DataCRC32C, 16, 32); err != nil || len(p.DataCRC32C) != 8 {
		return fmt.Errorf("manifest %s has no checksum of its part's data (data_crc32c %s; an older vram wrote none): run the shard again", p.manifest, clip(p.DataCRC32C))
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
		if p.TotalRuns != first.TotalRuns || p.Seed != first.Seed || p.Steps != first.Steps || p.Samples != first.Samples || p.Dt != first.Dt {
			errs = append(errs, fmt.Errorf("%s (%s) and %s (%s): %w", first.manifest, batchOf(first.partManifest), p.manifest, batchOf(p.partManifest), errPartMismatch))
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
			errs = append(errs, fmt.Errorf("runs %d-%d are in both %s and %s: %w", p.FirstRun, min(next, end)-1, last.path, p.path, errDuplicatePart))
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
			s := shardOf(i, n)
			start, end := s.Range(uint64(parts[0].TotalRuns))
			if int(start) < hi && int(end) > lo {
				path, manifest := partPaths(out, s)
				names = append(names, fmt.Sprintf("shard %s (%s: %s)", s, path, partState(path, manifest)))
			}
		}
		msg += ": " + strings.Join(names, ", ")
	}
	return fmt.Errorf("%s: %w", msg, errMissingPart)
}

// partState says why a part merge needs was not among those it read:
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

func batchOf(m partManifest) string {
	return fmt.Sprintf("%d runs, seed %d, %d steps, %d samples, dt %g", m.TotalRuns, m.Seed, m.Steps, m.Samples, m.Dt)
}

// mergeInputs are the files merge reads: the parts and their manifests,
// none of which the output may be.
func mergeInputs(parts []*mergePart) []string {
	var in []string
	for _, p := range parts {
		in = append(in, p.path, p.manifest)
	}
	return in
}

// checkMergeOut refuses an out that merge could not write without
// damaging a file: one of the parts or manifests, or not a regular file.
func checkMergeOut(out string, parts []*mergePart) error {
	if _, _, err := userfile.Check(out, userfile.Options{Inputs: mergeInputs(parts)}); err != nil {
		return fmt.Errorf("merge into %s: %w", out, err)
	}
	return nil
}

// copyPart copies part p's rows to their places in f (OUT's new content,
// the file tmp), of total runs, through buf, and checks that the data read is what p's manifest vouches
// for (its CRC-32C): a part rewritten, zeroed or of another job since is
// an error.
func copyPart(f *npy.File, tmp string, p *mergePart, total int, buf []byte) error {
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for row := range int64(2 * p.Samples) {
		src, dst := row*int64(p.Runs)*4, (row*int64(total)+int64(p.FirstRun))*4
		for left := int64(p.Runs) * 4; left > 0; {
			b := buf[:min(left, int64(len(buf)))]
			if _, err := p.f.ReadAt(b, src); err != nil {
				return fmt.Errorf("read %s: %w", p.path, err)
			}
			h.Write(b)
			if _, err := f.WriteAt(b, dst); err != nil {
				return fmt.Errorf("write %s: %w", tmp, err)
			}
			src, dst, left = src+int64(len(b)), dst+int64(len(b)), left-int64(len(b))
		}
	}
	if got := fmt.Sprintf("%08x", h.Sum32()); got != p.DataCRC32C {
		return fmt.Errorf("part %s's data has CRC-32C %s, but its manifest %s says %s: the part was rewritten, zeroed or replaced since its shard wrote it; run the shard again: %w",
			p.path, got, p.manifest, p.DataCRC32C, errPartData)
	}
	return nil
}

// writeMerged copies every part's rows into out's new content, written
// beside it and renamed into place once whole.
func writeMerged(a *app, out string, parts []*mergePart) (rep mergeReport, err error) {
	total, samples := parts[0].TotalRuns, parts[0].Samples
	rep = mergeReport{Out: out, Shape: []int{samples, 2, total}}
	uf, err := userfile.Create(out, userfile.Options{Inputs: mergeInputs(parts)})
	if err != nil {
		return rep, fmt.Errorf("merge into %s: %w", out, err)
	}
	tmp := uf.TempName()
	defer func() {
		if err != nil {
			err = errors.Join(err, uf.Abort())
		}
	}()
	f, err := npy.CreateIn(uf.OS(), npy.Header{Descr: vram.NPYDescr(vram.Float32), Shape: rep.Shape})
	if err != nil {
		return rep, fmt.Errorf("merge into %s: %w", out, err)
	}
	buf := make([]byte, mergeCopyBytes)
	for _, p := range parts {
		if err := a.ctx.Err(); err != nil {
			return rep, fmt.Errorf("merge interrupted: %w", err)
		}
		if err := copyPart(f, tmp, p, total, buf); err != nil {
			return rep, err
		}
		rep.Parts = append(rep.Parts, mergeReportRow{Part: p.path, FirstRun: p.FirstRun, Runs: p.Runs})
	}
	rep.Bytes = f.DataOffset() + f.DataBytes()
	if err := uf.Commit(); err != nil {
		return rep, fmt.Errorf("merge into %s: %w", out, err)
	}
	return rep, nil
}
