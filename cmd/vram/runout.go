// `vram run --out FILE.npy` and `--host-mem SIZE`: the trajectories kept
// in a .npy file written chunk by chunk, and the job's host memory capped.
//
// The file holds one C-order float32 array of shape (samples, 2, runs),
// the layout of the device's trajectories array: element [k, 0, i] is run
// i's position x at sample k (time k × every × dt), [k, 1, i] its
// velocity v. Once a chunk's outputs are back in a pinned staging buffer,
// each of its 2 × samples rows (Len runs of one sample and variable) is
// written at its place in the file; nothing holds more than a chunk.
// The file is written beside FILE.npy, as a temporary .FILE.npy.*.partial
// made at its full size first (sparse), and renamed to FILE.npy once the
// job has succeeded (internal/userfile): a job that fails, is interrupted
// or is killed leaves an existing FILE.npy as it was, and nothing that
// looks complete; the partial a killed job leaves is removed by the next
// run into FILE.npy.
//
// --host-mem caps the host RAM the manager's host arrays and staging
// buffers take (vram.HostOptions.Limit): host arrays past it spill to
// memory-mapped files in $VRAM_SPILL_DIR (default the temporary
// directory), and the pipeline stages through as many pinned buffers as
// fit, keeping fewer chunks in flight when they are few.

package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/internal/oscillator"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/internal/userfile"
	"github.com/vramkit/vram/npy"
)

// trajFile is the --out file being written (or, with a shard, its part):
// its new content, in a temporary file until done.
type trajFile struct {
	f             *npy.File
	path          string
	runs, samples int
	// done puts the file in place (a part, then its manifest), or with
	// failed set removes it, leaving what was at the path as it was.
	done func(failed bool) error
}

// trajHeader is the header of the trajectories of runs runs: float32,
// shape (samples, 2, runs), C order.
func trajHeader(runs, samples int) npy.Header {
	return npy.Header{Descr: vram.NPYDescr(vram.Float32), Shape: []int{samples, 2, runs}}
}

// createTrajFile makes path's new content, for samples × 2 × runs float32
// values, beside it.
func createTrajFile(path string, runs, samples int) (*trajFile, error) {
	tmp, err := userfile.Create(path, userfile.Options{})
	if err != nil {
		return nil, fmt.Errorf("--out: %w", err)
	}
	f, err := npy.CreateIn(tmp.OS(), trajHeader(runs, samples))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("--out: %w", err), tmp.Abort())
	}
	return &trajFile{f: f, path: path, runs: runs, samples: samples, done: func(failed bool) error {
		if failed {
			return tmp.Abort()
		}
		return tmp.Commit()
	}}, nil
}

// drain writes chunk sp's trajectories, the first sp.Len runs of each row
// of the staging array [samples, 2, chunk length], into the file.
func (t *trajFile) drain(sp vram.Span, stage *vram.HostArray) error {
	ld := stage.Dim(2)
	data := stage.Data()
	for row := range 2 * t.samples {
		src := data[row*ld*4:][:sp.Len*4]
		if _, err := t.f.WriteAt(src, int64(row*t.runs+sp.Start)*4); err != nil {
			return fmt.Errorf("write runs %d-%d to %s: %w", sp.Start, sp.Start+sp.Len-1, t.path, err)
		}
	}
	return nil
}

// run reads run i's samples back from the file.
func (t *trajFile) run(i int) ([]oscillator.Sample, error) {
	s := make([]oscillator.Sample, t.samples)
	var b [4]byte
	for k := range s {
		for v := range 2 {
			if _, err := t.f.ReadAt(b[:], int64((2*k+v)*t.runs+i)*4); err != nil {
				return nil, fmt.Errorf("read run %d back from %s: %w", i, t.path, err)
			}
			x := float64(math.Float32frombits(binary.LittleEndian.Uint32(b[:])))
			if v == 0 {
				s[k].X = x
			} else {
				s[k].V = x
			}
		}
	}
	return s, nil
}

// runSamples is run i's trajectory: from the --out file, or the host
// array.
func (j *job) runSamples(i int) ([]oscillator.Sample, error) {
	if j.traj != nil {
		return j.traj.run(i)
	}
	return oscillator.Decode(j.hOut.Data(), j.shape.runs, j.shape.samples, i)
}

// hostArray makes a host array on the rung the manager's ladder picks.
func (j *job) hostArray(shape []int, dt vram.DType, what string, hostBytes uint64) (*vram.HostArray, error) {
	h, err := j.m.Host().Alloc(shape, dt, vram.HostArrayOptions{Name: "vram-run-" + what})
	if err != nil {
		return nil, fmt.Errorf("host array for the %s (the host arrays take %s in all; lower --runs or --samples, or give --out): %w",
			what, units.Format(hostBytes), err)
	}
	p := h.Placement()
	j.a.log.Debug("host array", "what", what, "bytes", h.Bytes(), "rung", p.Rung.String(), "reason", p.Reason, "path", p.Path)
	if j.rungs == nil {
		j.rungs = map[string]string{}
	}
	j.rungs[what] = p.Rung.String()
	return h, nil
}

// makeHostArrays makes the full-length host arrays on the manager's host
// ladder.
func (j *job) makeHostArrays() error {
	// The host arrays hold the whole batch: 24 bytes of inputs and
	// samples × 8 + 4 bytes of outputs a run (the trajectories go to the
	// file with --out). The manager's host ladder picks their memory.
	j.phase("make the host arrays")
	n, s := j.shape.runs, j.shape.samples
	hostBytes := uint64(n) * hostBytesPerRun(s)
	var err error
	if j.hInit, err = j.hostArray([]int{2, n}, vram.Float32, "initial states", hostBytes); err != nil {
		return err
	}
	if j.hParams, err = j.hostArray([]int{4, n}, vram.Float32, "parameters", hostBytes); err != nil {
		return err
	}
	if j.outPath == "" {
		if j.hOut, err = j.hostArray([]int{s, 2, n}, vram.Float32, "trajectories", hostBytes); err != nil {
			return err
		}
	}
	if j.hStatus, err = j.hostArray([]int{n}, vram.Int32, "status", hostBytes); err != nil {
		return err
	}
	return nil
}

// hostReport adds the host side to rep: the rungs, the staging, the
// buffers the pipeline ran with, the --out file.
func (j *job) hostReport(rep *runReport, br batch.Report) {
	rep.BuffersInFlight, rep.Lag = br.Buffers, br.Lag
	rep.HostRungs = j.rungs
	hs := j.m.Host().Stats()
	rep.StagingBytes, rep.HostLimitBytes = hs.Staging, hs.Limit
	if j.traj != nil {
		rep.Out, rep.OutShape = j.traj.path, []int{j.shape.samples, 2, j.shape.runs}
	}
}

// freeHost returns the host arrays.
func (j *job) freeHost() error {
	var errs []error
	for _, h := range []*vram.HostArray{j.hInit, j.hParams, j.hOut, j.hStatus} {
		if h != nil {
			errs = append(errs, h.Free())
		}
	}
	return errors.Join(errs...)
}
