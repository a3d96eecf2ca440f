#!/usr/bin/env bash
# gpu-check.sh — everything vram can check on a machine with an NVIDIA GPU,
# in one call that ends with one RESULT table.
#
#   scripts/gpu-check.sh build [ARCHIVE]
#       where Go and gcc are (and g++, for the C++ hooks): build stripped
#       binaries and pack them,
#       with this script, into one archive (default
#       gpu-check/vram-gpu-check.tar.gz, a folder git ignores)
#   tar -xzf ARCHIVE -C DIR && DIR/vram-gpu-check/gpu-check.sh run [--sim] [--out OUT]
#       on the GPU machine (no Go needed): run every check, writing at most
#       8 files to OUT (default DIR/vram-gpu-check/out) and the RESULT table
#       last on standard output
#
# The archive holds: the test binaries of device/cuda (the device and
# allocator conformance suites on CUDA and the other GPU tests) and
# internal/oscillator, the vram command, libvram (libvram.so, its SONAME
# link libvram.so.N, and the C++ hooks libvram_torch.so, libvram_cupy.so),
# the Python package with scripts/gpu_python.py, every PTX file vram ships
# (git ls-files '*.ptx'), and the stand-in driver (libcuda.so.1 from
# device/cuda/testdata/fakecuda.c). Go binaries are built without cgo
# (purego loads the driver at run time) for the build machine's
# GOOS/GOARCH (GOARCH=arm64 for a Grace Hopper machine); BUILD-INFO says
# the newest glibc symbol version libvram needs.
#
# `run` does, each step under a limit, the whole within GPU_CHECK_BUDGET
# seconds (default 540; a step starts with what is left, and one with no
# time left is a fail, "not run"):
#   versions     the driver (nvidia-smi), toolkit (ptxas, nvcc), Python and
#                framework (numpy, numba, numba-cuda, cupy, torch) versions
#   ptxas        ptxas -arch=sm_90 on every PTX file in the archive
#   first open   a keeper process opens device 0 and holds it, so that only
#                it pays a cold cuInit
#   device/alloc the device and allocator conformance suites on CUDA
#   cuda tests   the other GPU tests of device/cuda and the PTX oscillator
#   vram run     vram run --device cuda (the example batch job)
#   sticky       a kernel that faults on purpose, in a process of its own
#   python       Numba (numba-cuda), CuPy (both hooks) and PyTorch on one
#                vram pool in one process, the cap refusing each (while
#                the keeper still holds the GPU)
#   bench        the CUDA benchmarks, briefly, when time is left
# --sim runs the same archive here, without a GPU: the device checks
# against the stand-in driver (on LD_LIBRARY_PATH), vram run and the Python
# check (vram's own part; the frameworks skip) on the simulator and the
# stand-in; CI runs it so (.ci/run), so that the call cannot rot.
# Exit status: 0 when no check failed.
set -uo pipefail

usage() { sed -n '2,13p' "$0" >&2; exit 2; }

build() {
	local repo archive stage top
	repo=$(cd "$(dirname "$0")/.." && pwd)
	archive=${1:-$repo/gpu-check/vram-gpu-check.tar.gz}
	case $archive in /*) ;; *) archive=$PWD/$archive ;; esac
	for tool in go gcc; do
		command -v $tool >/dev/null || { echo "gpu-check: build needs $tool" >&2; exit 1; }
	done
	command -v g++ >/dev/null || echo "gpu-check: no g++: the archive has no C++ hooks, and the PyTorch and CuPy C hook checks will fail on a GPU" >&2
	set -e
	stage=$(mktemp -d)
	trap "rm -rf '$stage'" EXIT
	top=$stage/vram-gpu-check
	mkdir -p "$top/bin" "$top/lib" "$top/ptx" "$top/standin" "$top/python"
	cd "$repo"
	echo "== test binaries and the vram command (no cgo, stripped)"
	CGO_ENABLED=0 go test -c -ldflags='-s -w' -o "$top/bin/cuda.test" ./device/cuda
	CGO_ENABLED=0 go test -c -ldflags='-s -w' -o "$top/bin/oscillator.test" ./internal/oscillator
	CGO_ENABLED=0 go build -ldflags='-s -w' -o "$top/bin/vram" ./cmd/vram
	echo "== libvram and its C++ hooks (stripped)"
	scripts/build-libvram.sh --strip "$top/lib"
	echo "== the Python package, the PTX files, the stand-in driver"
	cp -r python/vram "$top/python/vram"
	find "$top/python" -name __pycache__ -prune -exec rm -rf {} +
	cp scripts/gpu_python.py "$top/gpu_python.py"
	git ls-files '*.ptx' | while read -r f; do cp "$f" "$top/ptx/$(echo "$f" | tr / _)"; done
	gcc -shared -fPIC -O1 -o "$top/standin/libcuda.so.1" device/cuda/testdata/fakecuda.c -lpthread
	cp "$0" "$top/gpu-check.sh"
	chmod +x "$top/gpu-check.sh"
	{
		echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) by $(go version)"
		git describe --always --dirty 2>/dev/null | sed 's/^/commit /' || true
		echo "libvram needs glibc $(objdump -T "$top/lib/libvram.so" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 | cut -c7-) or newer"
	} >"$top/BUILD-INFO"
	mkdir -p "$(dirname "$archive")"
	tar -czf "$archive" -C "$stage" vram-gpu-check
	echo "== $archive: $(du -k "$archive" | cut -f1) KiB"
}

# ---- run ----

# row CHECK RESULT SECONDS NOTE: one line of the RESULT table, kept in
# $table as soon as the check ends, so a run cut short still shows it.
row() {
	printf '%-22s %-5s %5ss  %s\n' "$1" "$2" "$3" "${4:0:110}" >>"$table"
	case $2 in pass) ((npass++)) ;; fail) ((nfail++)) ;; *) ((nskip++)) ;; esac
	printf '%-22s %-5s %5ss  %s\n' "$1" "$2" "$3" "${4:0:110}"
}

# left is the budget's seconds left.
left() { echo $((budget - (SECONDS - start))); }

# step NAME LIMIT LOG CMD...: run CMD under min(LIMIT, what is left),
# appending its output to LOG; sets $rc (124: timed out, 125: not run).
step() {
	local name=$1 limit=$2 log=$3
	shift 3
	local t=$(($(left) - 5))
	[ "$t" -lt "$limit" ] && limit=$t
	{ echo; echo "==== $name: $* (limit ${limit}s)"; } >>"$log"
	lines=$(wc -l <"$log")
	if [ "$limit" -lt 5 ]; then
		rc=125
		return
	fi
	timeout --signal=INT --kill-after=5 "$limit" "$@" >>"$log" 2>&1
	rc=$?
	[ $rc = 137 ] && rc=124
}

# check KIND NAME LIMIT LOG ARGS...: a step and its table row. KIND go is
# a test binary: pass, fail (the first failing lines as the note), or skip
# when every test that ran was skipped; cmd is any other command: pass
# when it exits 0.
check() {
	local kind=$1 name=$2 limit=$3 log=$4 t0=$SECONDS out skips
	shift 4
	step "$name" "$limit" "$log" "$@"
	out=$(tail -n +"$((lines + 1))" "$log")
	case $rc in
	0)
		skips=$(echo "$out" | grep -c -- '--- SKIP')
		if [ "$kind" = cmd ] || echo "$out" | grep -q -- '^--- PASS'; then
			row "$name" pass $((SECONDS - t0)) "$([ "$skips" != 0 ] && echo "$skips subtests skipped (the log says why)")"
		else
			row "$name" skip $((SECONDS - t0)) "$(echo "$out" | grep -m1 -A1 -- '^--- SKIP' | tail -1 | sed 's/^ *//')"
		fi ;;
	124) row "$name" fail $((SECONDS - t0)) "timed out after its limit" ;;
	125) row "$name" fail 0 "not run: no time left in the budget" ;;
	*) row "$name" fail $((SECONDS - t0)) "$(echo "$out" | grep -m2 -E -- '--- FAIL|panic:|\.go:[0-9]+:|vram: ' | tr '\n' ' ' | sed 's/  */ /g')" ;;
	esac
}

# figures picks the headline figures out of the benchmarks' log: the
# cost of an alloc+free pair of 2 MiB (cuMemAlloc/cuMemFree, the async
# pool, alloc.Pool's cache hit) and the manager's pinned copies as a share
# of a raw driver loop (BenchmarkManagerCopy's pct-of-raw).
figures() {
	awk '
	function val(unit,   i) { for (i = 2; i < NF; i++) if ($(i+1) == unit) return $i; return "" }
	$1 ~ /^BenchmarkMallocFree\/2MiB/ { m = val("ns/op") }
	$1 ~ /^BenchmarkMallocAsyncFreeAsync\/2MiB/ { a = val("ns/op") }
	$1 ~ /^BenchmarkPoolHit\/2MiB/ { p = val("ns/op") }
	$1 ~ /^BenchmarkManagerCopy\/HtoD/ { h = val("pct-of-raw") }
	$1 ~ /^BenchmarkManagerCopy\/DtoH/ { d = val("pct-of-raw") }
	END { printf "2 MiB pair: cuMemAlloc %s ns, async %s ns, Pool hit %s ns; copies %s%%/%s%% of raw", m, a, p, h, d }' "$1"
}

versions() {
	local log=$out/ptx.txt py=$1
	{
		cat BUILD-INFO
		echo "glibc: $(ldd --version 2>&1 | head -1)"
		if command -v nvidia-smi >/dev/null; then
			nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode,mig.mode.current --format=csv,noheader 2>&1 | head -2
		else
			echo "nvidia-smi: not found"
		fi
		echo "ptxas: $( ($ptxas --version 2>/dev/null || echo not found) | tail -1)"
		echo "nvcc: $( (nvcc --version 2>/dev/null || echo not found) | tail -1)"
		"$py" - <<'PY' 2>&1
import importlib, sys
print("python", sys.version.split()[0])
for mod in ("numpy", "numba", "numba_cuda", "cupy", "torch"):
    try:
        m = importlib.import_module(mod)
        extra = ""
        if mod == "torch":
            extra = " (CUDA %s)" % m.version.cuda
        print("%s %s%s" % (mod, getattr(m, "__version__", "?"), extra))
    except Exception as e:
        print("%s not importable: %s" % (mod, str(e).splitlines()[0][:80]))
PY
	} | tee -a "$log" | sed 's/^/  /'
}

ptxcheck() {
	local log=$out/ptx.txt t0=$SECONDS n=0 bad=0 f
	if [ -z "$ptxas" ]; then
		row ptxas skip 0 "no ptxas (PATH, /usr/local/cuda/bin)"
		return
	fi
	for f in ptx/*.ptx; do
		n=$((n + 1))
		echo "== $ptxas -arch=sm_90 $f" >>"$log"
		timeout 30 "$ptxas" -arch=sm_90 -o /dev/null "$f" >>"$log" 2>&1 || bad=$((bad + 1))
	done
	if [ $bad = 0 ]; then
		row ptxas pass $((SECONDS - t0)) "$n PTX files compile for sm_90"
	else
		row ptxas fail $((SECONDS - t0)) "$bad of $n PTX files refused: $(grep -m1 -i error "$log")"
	fi
}

# keeper opens device 0 and holds it until the run ends (cuda.test's
# TestHoldDevice): without persistence mode the driver tears the GPU down
# whenever no process holds it, and every check would pay a cold cuInit.
keeper() {
	local ready=$dir/.ready t0=$SECONDS log=$out/cuda.txt
	rm -f "$ready"
	echo "==== first open (the keeper, cuda.test -test.run TestHoldDevice)" >>"$log"
	VRAM_GPU_CHECK_HOLD=$ready bin/cuda.test -test.run '^TestHoldDevice$' -test.v -test.timeout=30m >>"$log" 2>&1 &
	keeper_pid=$!
	while [ ! -s "$ready" ] && kill -0 $keeper_pid 2>/dev/null && [ $((SECONDS - t0)) -lt 90 ]; do sleep 0.2; done
	if [ -s "$ready" ]; then
		row "first open" pass $((SECONDS - t0)) "$(cut -c7- "$ready")"
		return 0
	fi
	row "first open" fail $((SECONDS - t0)) "no CUDA device 0: $(grep -v '^====' "$log" | grep -m1 -E 'no CUDA|SKIP|FAIL|cuda' | sed 's/^ *//')"
	return 1
}

python_check() {
	local py=$1 spec=$2 log=$out/python.txt t0=$SECONDS
	if ! command -v "$py" >/dev/null; then
		row python "$([ "$spec" = cuda:0 ] && [ -z "${GPU_PYTHON_NO_FRAMEWORKS:-}" ] && echo fail || echo skip)" 0 "no $py (set PYTHON)"
		return
	fi
	VRAM_LIBRARY=$dir/lib/libvram.so PYTHONPATH=$dir/python${PYTHONPATH:+:$PYTHONPATH} GPU_PYTHON_DEVICE=$spec \
		step python 200 "$log" "$py" gpu_python.py
	local name result note
	while read -r _ name result note; do
		row "python $name" "$result" $((SECONDS - t0)) "$note"
	done < <(grep '^CHECK ' "$log")
	case $rc in
	0) ;;
	124 | 125) row python fail $((SECONDS - t0)) "$([ $rc = 124 ] && echo "timed out" || echo "not run: no time left")" ;;
	*) grep -q '^CHECK ' "$log" || row python fail $((SECONDS - t0)) "$(grep -E '^[A-Za-z_.]*(Error|Exception)' "$log" | tail -1)" ;;
	esac
}

run() {
	local sim=0
	out=
	while [ $# -gt 0 ]; do
		case $1 in
		--sim) sim=1 ;;
		--out) out=$2; shift ;;
		*) usage ;;
		esac
		shift
	done
	dir=$(cd "$(dirname "$0")" && pwd)
	cd "$dir" || exit 1
	out=${out:-$dir/out}
	mkdir -p "$out"
	out=$(cd "$out" && pwd)
	start=$SECONDS budget=${GPU_CHECK_BUDGET:-540} npass=0 nfail=0 nskip=0
	table=$out/RESULT.txt
	local f
	for f in ptx device alloc cuda vram python sticky; do : >"$out/$f.txt"; done
	local py=${PYTHON:-python3} spec=cuda:0 t0
	ptxas=$(command -v ptxas || { [ -x /usr/local/cuda/bin/ptxas ] && echo /usr/local/cuda/bin/ptxas; } || true)
	: >"$table"
	echo "== vram gpu-check$([ $sim = 1 ] && echo " --sim: the stand-in driver and the simulator, no GPU")"
	if [ $sim = 1 ]; then
		export LD_LIBRARY_PATH=$dir/standin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	fi
	versions "$py"
	echo
	printf '%-22s %-5s %6s  %s\n' check result took note | tee -a "$table"
	row versions pass 0 "$( (command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1 | sed 's/^/driver /') || echo "no nvidia-smi")"
	ptxcheck
	local gpu=0
	if keeper; then
		gpu=1
		check go "device conformance" 120 "$out/device.txt" bin/cuda.test -test.v -test.timeout=115s -test.run '^TestConformance$'
		check go "alloc conformance" 150 "$out/alloc.txt" bin/cuda.test -test.v -test.timeout=145s -test.run '^TestAllocatorConformance$'
		check go "cuda tests" 90 "$out/cuda.txt" bin/cuda.test -test.v -test.timeout=85s \
			-test.run 'Allocators|LaunchPTX|Pinned|ResetAcross|Strided|DriverOutOfMemory|NoAlias|ManagerCopies|NothingAtImport|Example'
		if [ $sim = 1 ]; then
			row "oscillator PTX" skip 0 "the stand-in runs no real kernel"
			check cmd "vram run" 60 "$out/vram.txt" bin/vram run --device sim --json
		else
			check go "oscillator PTX" 40 "$out/vram.txt" bin/oscillator.test -test.v -test.timeout=35s -test.run 'PTX|GoKernel'
			check cmd "vram run" 60 "$out/vram.txt" bin/vram run --device cuda --json
		fi
		# In a process of its own: it breaks that process's context.
		VRAM_GPU_CHECK_STICKY=1 check go "sticky error" 30 "$out/sticky.txt" bin/cuda.test -test.v -test.timeout=25s -test.run '^TestStickyErrorOnGPU$'
	fi
	# The keeper still holds the GPU: Python's cuInit is a warm one.
	if [ $sim = 1 ]; then
		GPU_PYTHON_NO_FRAMEWORKS=1 python_check "$py" cuda:0
	else
		python_check "$py" "$spec"
	fi
	t0=$SECONDS
	if [ $sim = 0 ] && [ $gpu = 1 ] && [ "$(left)" -gt 60 ]; then
		step bench 45 "$out/vram.txt" bin/cuda.test -test.run '^$' -test.bench . -test.benchtime 200ms -test.timeout=40s
		row bench "$([ $rc = 0 ] && echo pass || echo fail)" $((SECONDS - t0)) "$(figures "$out/vram.txt")"
	fi
	rm -f "$dir/.ready"
	[ -n "${keeper_pid:-}" ] && wait "$keeper_pid" 2>/dev/null
	{
		echo
		echo "RESULT: $npass pass, $nfail fail, $nskip skip in $((SECONDS - start)) s; logs in $out"
	} | tee -a "$table"
	echo
	echo "RESULT"
	cat "$table"
	[ $nfail = 0 ]
}

case ${1:-} in
build) shift; build "$@" ;;
run) shift; run "$@"; exit $? ;;
*) usage ;;
esac
