package shard

// The shard rule and the scheduler's index (see the package doc).

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// ErrShard is wrapped by every error about a shard or its environment.
var ErrShard = errors.New("shard")

// Environment variables FromEnv reads.
const (
	EnvSlurmID    = "SLURM_ARRAY_TASK_ID"
	EnvSlurmMin   = "SLURM_ARRAY_TASK_MIN"
	EnvSlurmStep  = "SLURM_ARRAY_TASK_STEP"
	EnvSlurmCount = "SLURM_ARRAY_TASK_COUNT"
	EnvK8sIndex   = "JOB_COMPLETION_INDEX"
	EnvCount      = "VRAM_SHARD_COUNT"
)

// Shard is shard Index of Count. The zero value is not a shard; One is
// the whole batch.
type Shard struct {
	Index, Count uint64
	// From says where the shard came from: "--shard", "slurm",
	// "kubernetes", or "" for One.
	From string
}

// One is the whole batch as a single shard.
var One = Shard{Index: 0, Count: 1}

// String is "i/N".
func (s Shard) String() string { return fmt.Sprintf("%d/%d", s.Index, s.Count) }

// Whole reports whether s is the whole batch (one shard of one).
func (s Shard) Whole() bool { return s.Count == 1 }

// Valid returns an error unless 0 ≤ Index < Count.
func (s Shard) Valid() error {
	if s.Count == 0 {
		return fmt.Errorf("%w: a count of 0 shards: want at least 1", ErrShard)
	}
	if s.Index >= s.Count {
		return fmt.Errorf("%w: index %d of %d shards: want 0 to %d", ErrShard, s.Index, s.Count, s.Count-1)
	}
	return nil
}

// Bound is ⌊i·R/N⌋, the first run of shard i (and for i = N, R: the end
// of the last shard). It panics unless N ≥ 1 and i ≤ N.
func Bound(i, runs, n uint64) uint64 {
	if n == 0 || i > n {
		panic(fmt.Sprintf("shard.Bound(%d, %d, %d): want 1 ≤ n and i ≤ n", i, runs, n))
	}
	hi, lo := bits.Mul64(i, runs)
	// hi < n because i ≤ n and runs < 2⁶⁴, so the quotient fits.
	q, _ := bits.Div64(hi, lo, n)
	return q
}

// Range is shard s's runs of a batch of runs: [start, end). s must be
// Valid.
func (s Shard) Range(runs uint64) (start, end uint64) {
	return Bound(s.Index, runs, s.Count), Bound(s.Index+1, runs, s.Count)
}

// Owner is the shard of n that holds run r of a batch of runs (r < runs).
func Owner(r, runs, n uint64) uint64 {
	if n == 0 || r >= runs {
		panic(fmt.Sprintf("shard.Owner(%d, %d, %d): want n ≥ 1 and r < runs", r, runs, n))
	}
	// ⌊((r+1)·N − 1)/R⌋ in 128 bits: (r+1)·N ≥ 1, so the −1 never
	// borrows past zero, and the quotient is below N.
	hi, lo := bits.Mul64(r, n)
	lo, c := bits.Add64(lo, n, 0)
	hi += c
	lo, b := bits.Sub64(lo, 1, 0)
	hi -= b
	q, _ := bits.Div64(hi, lo, runs)
	return q
}

// Parse reads "i/N" (as given to --shard).
func Parse(v string) (Shard, error) {
	is, ns, ok := strings.Cut(strings.TrimSpace(v), "/")
	if !ok {
		return Shard{}, fmt.Errorf("%w: %q: want i/N, such as 0/4 (the first of four shards)", ErrShard, v)
	}
	i, err1 := strconv.ParseUint(is, 10, 64)
	n, err2 := strconv.ParseUint(ns, 10, 64)
	if err1 != nil || err2 != nil {
		return Shard{}, fmt.Errorf("%w: %q: want i/N with whole numbers, such as 0/4", ErrShard, v)
	}
	s := Shard{Index: i, Count: n, From: "--shard"}
	if err := s.Valid(); err != nil {
		return Shard{}, fmt.Errorf("%q: %w", v, err)
	}
	return s, nil
}

// FromEnv finds this task's shard in the environment, looked up with
// getenv (os.Getenv, or a map in tests): ok is false when neither a Slurm
// array task nor a Kubernetes indexed pod is found. An index without a
// usable count is an error that says which variable to set.
func FromEnv(getenv func(string) string) (s Shard, ok bool, err error) {
	if id := getenv(EnvSlurmID); id != "" {
		s, err := fromSlurm(getenv, id)
		return s, true, err
	}
	if idx := getenv(EnvK8sIndex); idx != "" {
		s, err := fromKubernetes(getenv, idx)
		return s, true, err
	}
	return Shard{}, false, nil
}

func fromSlurm(getenv func(string) string, id string) (Shard, error) {
	num := func(name, def string) (uint64, error) {
		v := getenv(name)
		if v == "" {
			v = def
		}
		if v == "" {
			return 0, fmt.Errorf("%w: %s=%s is set but %s is not: run under a Slurm job array (sbatch --array), or give --shard i/N", ErrShard, EnvSlurmID, id, name)
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: %s=%q: want a whole number", ErrShard, name, v)
		}
		return n, nil
	}
	tid, err := num(EnvSlurmID, "")
	if err != nil {
		return Shard{}, err
	}
	lo, err := num(EnvSlurmMin, "0")
	if err != nil {
		return Shard{}, err
	}
	step, err := num(EnvSlurmStep, "1")
	if err != nil {
		return Shard{}, err
	}
	count, err := num(EnvSlurmCount, "")
	if err != nil {
		return Shard{}, err
	}
	if step == 0 || tid < lo || (tid-lo)%step != 0 {
		return Shard{}, fmt.Errorf("%w: Slurm array task %d with min %d and step %d: want ids min, min+step, … (an array such as --array=0-7)", ErrShard, tid, lo, step)
	}
	s := Shard{Index: (tid - lo) / step, Count: count, From: "slurm"}
	if err := s.Valid(); err != nil {
		return Shard{}, fmt.Errorf("Slurm array task %d (min %d, step %d, %d tasks; an array with holes such as --array=1,4,9 does not number its shards, use --array=0-N): %w",
			tid, lo, step, count, err)
	}
	return s, nil
}

func fromKubernetes(getenv func(string) string, idx string) (Shard, error) {
	i, err := strconv.ParseUint(idx, 10, 64)
	if err != nil {
		return Shard{}, fmt.Errorf("%w: %s=%q: want a whole number", ErrShard, EnvK8sIndex, idx)
	}
	cs := getenv(EnvCount)
	if cs == "" {
		return Shard{}, fmt.Errorf("%w: %s=%d is set but %s is not: set %s in the Job's pod template to its spec.completions, or give --shard i/N",
			ErrShard, EnvK8sIndex, i, EnvCount, EnvCount)
	}
	n, err := strconv.ParseUint(cs, 10, 64)
	if err != nil {
		return Shard{}, fmt.Errorf("%w: %s=%q: want a whole number", ErrShard, EnvCount, cs)
	}
	s := Shard{Index: i, Count: n, From: "kubernetes"}
	if err := s.Valid(); err != nil {
		return Shard{}, fmt.Errorf("Kubernetes completion index %d with %s=%d (is it the Job's spec.completions?): %w", i, EnvCount, n, err)
	}
	return s, nil
}
