#!/usr/bin/env bash
# gpu-python.sh — Numba, CuPy and PyTorch on one vram pool and one cap, in
# one Python process, on a machine with an NVIDIA GPU.
#
#   scripts/gpu-python.sh build [DIR]   where Go, gcc and g++ are: build
#                                       libvram.so, libvram_torch.so and
#                                       libvram_cupy.so and
#                                       copy them, the Python package and
#                                       the workload into DIR (default
#                                       gpu-python/)
#   DIR/gpu-python.sh run [DIR]         on the GPU machine (no Go needed):
#                                       run scripts/gpu_python.py there
#   DIR/gpu-python.sh run --sim [DIR]   the same on vram's simulator: a dry
#                                       run of the script, every framework
#                                       skipped
#
# The workload (gpu_python.py) opens vram on cuda:0 with a cap
# (GPU_PYTHON_CAP bytes, default 1 GiB), installs vram as Numba's memory
# manager, CuPy's allocator and PyTorch's pluggable allocator, runs a Numba
# kernel on arrays from the plugin, a CuPy sum and a PyTorch matmul, checks
# each against the host, asks each framework for more than the cap and
# expects vram's refusal, checks that torch.cuda.empty_cache() trims vram's
# pool, and prints the shared figures: one line per framework, the report,
# and the report at the last refusal. A framework not installed is skipped
# (SKIP), not failed. It runs under a limit of GPU_PYTHON_TIMEOUT seconds
# (default 300). PYTHON names the interpreter (default python3: the one
# with the frameworks). Exit status: 0 when every check that ran passed.
set -uo pipefail

usage() { sed -n '2,14p' "$0" >&2; exit 2; }

cmd=${1:-}
[ -n "$cmd" ] || usage

build() {
	local repo out
	repo=$(cd "$(dirname "$0")/.." && pwd)
	out=${1:-$repo/gpu-python}
	case $out in /*) ;; *) out=$PWD/$out ;; esac
	for tool in go gcc g++; do
		command -v $tool >/dev/null || { echo "gpu-python: build needs $tool" >&2; exit 1; }
	done
	set -e
	mkdir -p "$out/python"
	echo "== building libvram.so, libvram_torch.so (PyTorch's hook) and libvram_cupy.so (CuPy's C hook) into $out"
	"$repo/scripts/build-libvram.sh" "$out"
	rm -rf "$out/python/vram"
	cp -r "$repo/python/vram" "$out/python/vram"
	find "$out/python" -name __pycache__ -prune -exec rm -rf {} +
	cp "$repo/scripts/gpu_python.py" "$out/gpu_python.py"
	cp "$0" "$out/gpu-python.sh"
	chmod +x "$out/gpu-python.sh"
	{
		echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) by $(go version)"
		git -C "$repo" describe --always --dirty 2>/dev/null | sed 's/^/commit /' || true
	} >"$out/BUILD-INFO"
	echo "== done: copy $out to the GPU machine and run: $(basename "$out")/gpu-python.sh run"
}

run() {
	local dir sim=0 py=${PYTHON:-python3} limit=${GPU_PYTHON_TIMEOUT:-300}
	if [ "${1:-}" = --sim ]; then
		sim=1
		shift
	fi
	dir=${1:-$(cd "$(dirname "$0")" && pwd)}
	[ -f "$dir/libvram.so" ] || { echo "gpu-python: no $dir/libvram.so (run build first)" >&2; exit 1; }
	cat "$dir/BUILD-INFO" 2>/dev/null
	command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1
	"$py" -c 'import sys; print("python", sys.version.split()[0])'
	for mod in numpy numba cupy torch; do
		"$py" -c "import $mod; print('$mod', $mod.__version__)" 2>/dev/null || echo "$mod not installed"
	done
	export VRAM_LIBRARY=$dir/libvram.so PYTHONPATH=$dir/python${PYTHONPATH:+:$PYTHONPATH}
	if [ $sim = 1 ]; then
		export GPU_PYTHON_DEVICE=sim:vram=4GiB
	fi
	local t=()
	command -v timeout >/dev/null && t=(timeout --signal=INT --kill-after=10 "$limit")
	"${t[@]}" "$py" "$dir/gpu_python.py"
}

case $cmd in
build) shift; build "$@" ;;
run) shift; run "$@"; exit $? ;;
*) usage ;;
esac
