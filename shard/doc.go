// Package shard splits a batch of runs among the tasks of a job that a
// scheduler started — a Slurm job array, a Kubernetes Indexed Job — by the
// index and count the scheduler hands each task, writes each task's part
// of the batch's output, and gathers the parts into the file one process
// would have written (Merge). vram run --shard and vram merge are its
// command-line face; a Go program that runs its own batch uses it alike.
//
// It owns the rule, the index found in the environment, the part's files
// and manifest, and their gathering. It does not run batches (package
// batch does) or know what a run computes: a part is any .npy array whose
// runs lie along one axis.
//
// # The rule
//
// A batch of R runs split into N shards gives shard i (0 ≤ i < N) the runs
//
//	[⌊i·R/N⌋, ⌊(i+1)·R/N⌋)
//
// so the shards are contiguous, in order, cover every run exactly once,
// and differ in length by at most one run (shards are empty only when
// N > R). The products are taken in 128 bits, so the rule holds for any
// R and N up to 2⁶⁴−1 without overflow. Owner inverts it: run r belongs to
// shard ⌊((r+1)·N − 1)/R⌋.
//
// # The scheduler's index
//
// FromEnv finds the shard of this task in its environment, first match
// wins:
//
//   - Slurm job arrays: SLURM_ARRAY_TASK_ID, with SLURM_ARRAY_TASK_MIN
//     (default 0), SLURM_ARRAY_TASK_STEP (default 1) and
//     SLURM_ARRAY_TASK_COUNT; the shard is (ID − MIN) / STEP of COUNT, so
//     --array=0-7, --array=1-8 and --array=0-14:2 each make 8 shards. An
//     array with holes (--array=1,4,9) is refused: its ids do not number
//     the shards.
//   - Kubernetes Indexed Jobs: JOB_COMPLETION_INDEX, with the count in
//     VRAM_SHARD_COUNT (Kubernetes does not put the Job's completions in
//     the pod's environment; set VRAM_SHARD_COUNT to spec.completions).
//
// Values are plain values, safe to copy and share.
//
// # Parts
//
// A task whose batch's output is OUT.npy writes its shard's runs as the
// part OUT.shard-i-of-N.npy (CreatePart): an array in C order whose run
// axis holds the shard's runs, the rest of its shape the batch's. Once
// the part is complete, Commit reads its data back and writes the
// manifest OUT.shard-i-of-N.json beside it, saying which runs of which
// batch it holds and the size and CRC-32C of its data, so that Merge
// takes that file and no other. A part without a manifest is unfinished.
// Both files are written beside their paths and renamed into place, so a
// try of a shard that fails leaves an earlier try's part and manifest as
// they were.
//
// Merge reads the manifests (found beside OUT.npy, or those of the parts
// named), checks that they describe one batch (the same runs, dtype,
// shape but for the run axis, and Batch) and cover every run exactly
// once, and copies each part's runs to their places in OUT.npy, checking
// as it reads that each part's data is the one its manifest vouches for.
// OUT.npy is written beside its path and renamed into place: it is whole
// or untouched. A manifest is untrusted input (it comes from shared
// storage): at most 64 KiB, decoded into fixed fields, quoted clipped.
// Merge holds one buffer of 4 MiB whatever the batch's size.
package shard
