// `vram merge OUT.npy [PART.npy ...]`: gather the parts that the shards
// of `vram run --shard i/N --out OUT.npy` wrote into OUT.npy, byte for
// byte the file `vram run --out OUT.npy` writes for the whole batch in one
// process. The mechanism, its checks and its bounds are package shard's
// (shard.Merge); this is its command and its report.

package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/shard"
)

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
anything is written or removed. Parts a Go program wrote with package
shard (github.com/vramkit/vram/shard) merge alike.`,
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

func (a *app) merge(out string, named []string, remove bool) error {
	if err := checkNPYName("OUT", out); err != nil {
		return err
	}
	res, err := shard.Merge(a.ctx, out, shard.MergeOptions{Parts: named, RemoveParts: remove})
	if err != nil {
		return err
	}
	rep := mergeReport{Out: res.Out, Shape: res.Header.Shape, Bytes: res.Bytes, Removed: res.Removed}
	for _, p := range res.Parts {
		rep.Parts = append(rep.Parts, mergeReportRow{Part: p.Path, FirstRun: p.FirstRun, Runs: p.Runs})
	}
	if a.json {
		return a.writeJSON(rep)
	}
	w := &errWriter{w: a.stdout}
	fmt.Fprintf(w, "merged %s into %s: %v, %s\n", plural(len(rep.Parts), "part"), out, res.Header, units.Format(uint64(rep.Bytes)))
	if rep.Removed {
		fmt.Fprintf(w, "removed the parts and their manifests\n")
	}
	return w.err
}
