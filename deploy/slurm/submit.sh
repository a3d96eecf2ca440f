#!/bin/bash
# Submits a vram batch to Slurm: the job array of vram-array.sbatch (one
# shard and one GPU a task), then vram-merge.sbatch, which starts only
# once every task of the array has succeeded (--dependency=afterok).
#
#   VRAM_OUT=/shared/results/r.npy VRAM_RUN_ARGS="--runs 4000000" \
#       deploy/slurm/submit.sh [sbatch options for the array, e.g. --array=0-7 --partition=gpu]
#
# Prints the two job ids, the array's then the merge's, on one line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${VRAM_OUT:?set VRAM_OUT to the path of the result on shared storage, e.g. /shared/results/r.npy}"
export VRAM_OUT
array=$(sbatch --parsable "$@" "$here/vram-array.sbatch")
array=${array%%;*} # "id;cluster" on a federation
merge=$(sbatch --parsable --dependency="afterok:$array" --kill-on-invalid-dep=yes "$here/vram-merge.sbatch")
merge=${merge%%;*}
echo "$array $merge"
