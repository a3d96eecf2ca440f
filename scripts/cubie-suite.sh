#!/usr/bin/env bash
# cubie's own tests/memory, unmodified, with cubie.memory served by
# vram.cubie (python/tests/cubie/vram_cubie_plugin.py), under Numba's CUDA
# simulator and vram's simulator. Needs a cubie checkout (VRAM_CUBIE_SRC,
# ccam80/cubie) and the import shim that lets cubie's source import under
# Debian's numba 0.56 (VRAM_CUBIE_SHIM, a directory with cubie_sim_shim.py
# and an empty numba_cuda/ package); exits 2, saying why, without them.
# Extra arguments go to pytest (e.g. -q, -x, -k NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
src=${VRAM_CUBIE_SRC:-}
shim=${VRAM_CUBIE_SHIM:-$root/../shared/cubie-shim}
if [ -z "$src" ] || [ ! -d "$src/tests/memory" ]; then
	echo "cubie-suite: no cubie checkout: set VRAM_CUBIE_SRC to one (git clone https://github.com/ccam80/cubie)" >&2
	exit 2
fi
if [ ! -f "$shim/cubie_sim_shim.py" ]; then
	echo "cubie-suite: no import shim at $shim: set VRAM_CUBIE_SHIM to the directory of cubie_sim_shim.py" >&2
	exit 2
fi
lib=${VRAM_LIBRARY:-}
if [ -z "$lib" ] && [ ! -f python/vram/libvram.so ]; then
	lib=$(mktemp -d)/libvram.so
	CGO_ENABLED=1 go build -buildmode=c-shared -o "$lib" ./libvram
fi
cd "$src"
export NUMBA_ENABLE_CUDASIM=1 PYTHONDONTWRITEBYTECODE=1 VRAM_DEVICE=
export PYTHONPATH="$shim:$root/python/tests/cubie:$root/python:src:."
[ -n "$lib" ] && export VRAM_LIBRARY="$lib"
exec /usr/bin/python3 -m pytest -p cubie_sim_shim -p vram_cubie_plugin -p no:cacheprovider \
	-o addopts="--import-mode=importlib -ra" --confcutdir=tests/memory \
	-m "not nocudasim and not cupy and not specific_algos" "$@" tests/memory
