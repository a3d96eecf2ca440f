#!/usr/bin/env bash
# gpu-check.sh — check vram's CUDA backend on a machine with an NVIDIA GPU.
#
#   scripts/gpu-check.sh build [DIR]   where Go is: compile the test binaries
#                                      and the CLI into DIR (default gpu-check/)
#   DIR/gpu-check.sh run [DIR]         on the GPU machine (no Go needed): run
#                                      them, one table line per step
#   DIR/gpu-check.sh run --standin [DIR]   the same against the stand-in
#                                      driver (device/cuda/testdata/fakecuda.c,
#                                      built by `build` when cc exists): a dry
#                                      run of the script here, no GPU
#
# `build` compiles without cgo (CGO_ENABLED=0: purego loads the driver at
# run time), for the build machine's GOOS/GOARCH (set GOARCH=arm64 for a
# Grace Hopper machine). The binaries link nothing but the system's glibc
# dynamically, so DIR can be copied to any Linux machine of that
# architecture with glibc and the NVIDIA driver installed.
#
# `run` first starts a keeper (cuda.test's TestHoldDevice) that opens device
# 0 and holds it for the whole run: its first open pays the cold cuInit
# (up to 120 s allowed: without persistence mode a first cuInit can take a
# minute or more, and the driver tears the GPU down whenever no process
# holds it, so without the keeper every step would pay it again). Without
# a usable GPU it says why and stops. Then, each under a timeout: the
# device conformance suite (one device held open throughout), the
# allocator conformance suite and the other GPU tests of device/cuda, the
# PTX kernel test of internal/oscillator, the CUDA benchmarks, `vram run`
# on the GPU and on the simulator, and the sticky-error check. Each step prints its table line as
# soon as it ends (also in DIR/logs/table.txt), so a run cut short still
# shows what passed; a failed step prints its first failure lines. Then a
# summary of the figures: the cost of an allocate-and-free pair
# (cuMemAlloc/cuMemFree, cuMemAllocAsync/cuMemFreeAsync, Pool's cache hit)
# with the hit's ratios to the other two (goals 50x and 5x), pinned 64 MiB
# copy bandwidth through the manager against a raw loop of driver calls
# (goal 90%), and vram run's runs per second on the GPU and the simulator.
# Logs go to DIR/logs/.
#
# Time: the step limits add up to 9 min 5 s (first open 120, preflight 20,
# conformance 90, cuda tests 100, PTX 35, bench 75, vram runs 30+30+40,
# and last, in a process of its own, a kernel fault to check that the
# sticky error is reported and whether Reset recovers from it: 25),
# a step is killed at most 5 s after its limit, and a step that would end
# past GPU_CHECK_BUDGET seconds (default 600) is not started but listed as
# NOT RUN: the whole run stays within about 10 minutes. GPU_CHECK_BENCHTIME
# sets -test.benchtime (500ms; 20ms with --standin).
# Exit status: 0 when every step passed, 1 otherwise.
set -uo pipefail

usage() { sed -n '2,11p' "$0" >&2; exit 2; }

cmd=${1:-}
[ -n "$cmd" ] || usage

build() {
	local repo out
	repo=$(cd "$(dirname "$0")/.." && pwd)
	out=${1:-$repo/gpu-check}
	case $out in /*) ;; *) out=$PWD/$out ;; esac
	command -v go >/dev/null || { echo "gpu-check: build needs Go" >&2; exit 1; }
	mkdir -p "$out"
	cd "$repo" || exit 1
	set -e
	export CGO_ENABLED=0
	echo "== building test binaries into $out"
	go test -c -o "$out/cuda.test" ./device/cuda
	go test -c -o "$out/oscillator.test" ./internal/oscillator
	if [ -d cmd/vram ] && go list ./cmd/vram >/dev/null 2>&1; then
		echo "== building the CLI"
		go build -o "$out/vram" ./cmd/vram
	else
		echo "== cmd/vram is not buildable here: vram run will be skipped"
	fi
	if command -v cc >/dev/null; then
		echo "== building the stand-in driver (for run --standin, a dry run without a GPU)"
		mkdir -p "$out/standin"
		cc -shared -fPIC -O1 -o "$out/standin/libcuda.so.1" device/cuda/testdata/fakecuda.c -lpthread
	fi
	cp "$0" "$out/gpu-check.sh"
	chmod +x "$out/gpu-check.sh"
	{
		echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) by $(go version)"
		git -C "$repo" describe --always --dirty 2>/dev/null | sed 's/^/commit /' || true
	} >"$out/BUILD-INFO"
	echo "== done: copy $out to the GPU machine and run: $(basename "$out")/gpu-check.sh run"
}

run() {
	local dir logs failed=0 standin=0
	if [ "${1:-}" = --standin ]; then
		standin=1
		shift
	fi
	dir=${1:-$(cd "$(dirname "$0")" && pwd)}
	cd "$dir" || exit 1
	logs=$dir/logs
	mkdir -p "$logs"
	local start=$SECONDS benchtime=${GPU_CHECK_BENCHTIME:-500ms} budget=${GPU_CHECK_BUDGET:-600}
	local table=$logs/table.txt
	: >"$table"

	echo "== machine"
	cat BUILD-INFO 2>/dev/null
	if [ $standin = 1 ]; then
		[ -f standin/libcuda.so.1 ] || { echo "gpu-check: no standin/libcuda.so.1 (build with a C compiler)" >&2; exit 1; }
		export LD_LIBRARY_PATH=$dir/standin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
		benchtime=${GPU_CHECK_BENCHTIME:-20ms}
		echo "STAND-IN DRIVER (standin/libcuda.so.1): this checks the script and the binding, not a GPU; figures mean nothing" | tee "$logs/gpu.txt"
		echo "(the stand-in runs no kernel but the tests' fill: oscillator-ptx and vram-run-cuda* are expected to fail)"
	elif command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=name,memory.total,driver_version,persistence_mode --format=csv,noheader 2>&1 | head -1 | tee "$logs/gpu.txt"
	else
		echo "nvidia-smi not found (the checks still try libcuda.so.1)" | tee "$logs/gpu.txt"
	fi
	local have_timeout=1
	if ! command -v timeout >/dev/null; then
		have_timeout=0
		echo "timeout(1) not found: steps run without a time limit"
	fi

	# row STEP LIMIT RESULT SECONDS: one line of the step table, printed at
	# once (and kept in logs/table.txt), so a run cut short still shows
	# every step that finished.
	row() { printf '%-24s %6s  %-22s %5ss\n' "$1" "$2" "$3" "$4" | tee -a "$table"; }
	echo
	printf '%-24s %6s  %-22s %6s\n' "step" "limit" "result" "took" | tee -a "$table"

	# step NAME LIMIT COMMAND... : run under a limit, log, add a table row.
	step() {
		local name=$1 limit=$2 rc t0=$SECONDS res
		shift 2
		if [ $((SECONDS - start + limit)) -gt "$budget" ]; then
			row "$name" "${limit}s" "NOT RUN (budget)" 0
			failed=1
			return 1
		fi
		if [ $have_timeout = 1 ]; then
			timeout --signal=INT --kill-after=5 "$limit" "$@" >"$logs/$name.txt" 2>&1
		else
			"$@" >"$logs/$name.txt" 2>&1
		fi
		rc=$?
		case $rc in
		0) res=ok ;;
		124 | 137) res="TIMED OUT"; failed=1 ;;
		*) res="FAILED (exit $rc)"; failed=1 ;;
		esac
		if [ $rc = 0 ] && grep -q -- '^--- SKIP' "$logs/$name.txt"; then
			res="ok, top-level skips"
		fi
		row "$name" "${limit}s" "$res" $((SECONDS - t0))
		if [ $rc != 0 ]; then
			grep -m4 -E -- '--- FAIL|panic:|Error|error' "$logs/$name.txt" | cut -c1-160 | sed 's/^/   | /'
		fi
		return $rc
	}

	# The keeper holds device 0 open for the whole run: its Open pays the
	# cold cuInit (generous limit: without persistence mode a first cuInit
	# can take a minute or more), and while it holds the GPU the driver
	# stays initialized for every later process.
	local gpu=1 ready=$logs/hold.ready keeper=0 t0=$SECONDS
	rm -f "$ready"
	VRAM_GPU_CHECK_HOLD=$ready ./cuda.test -test.run '^TestHoldDevice$' -test.v -test.count=1 -test.timeout=25m >"$logs/hold.txt" 2>&1 &
	keeper=$!
	trap 'rm -f "$ready"; kill $keeper 2>/dev/null' EXIT
	while [ ! -s "$ready" ] && kill -0 $keeper 2>/dev/null && [ $((SECONDS - t0)) -lt 120 ]; do sleep 0.2; done
	if [ -s "$ready" ]; then
		row "first-open (cuInit)" 120s ok $((SECONDS - t0))
	else
		gpu=0
		failed=1
		row "first-open (cuInit)" 120s "NO DEVICE" $((SECONDS - t0))
		grep -m3 -E 'SKIP|no CUDA|FAIL|cuda' "$logs/hold.txt" | cut -c1-200 | sed 's/^/   | /'
	fi

	if [ $gpu = 1 ]; then
		[ -x ./vram ] && step preflight 20 ./vram info --device cuda
		# The device conformance suite runs alone, so that a test that hangs
		# there (-test.timeout names it) cannot take the other checks with it.
		step device-conformance 90 ./cuda.test -test.v -test.count=1 -test.timeout=85s -test.run '^TestConformance$'
		step cuda-tests 100 ./cuda.test -test.v -test.count=1 -test.timeout=95s \
			-test.run 'AllocatorConformance|Allocators|LaunchPTX|Pinned|ResetAcross|Strided|DriverOutOfMemory|NoAlias|ManagerCopies|NothingAtImport|Example'
		step oscillator-ptx 35 ./oscillator.test -test.v -test.count=1 -test.timeout=30s -test.run 'PTX|GoKernel'
		step cuda-bench 75 ./cuda.test -test.run '^$' -test.bench . -test.benchtime "$benchtime" -test.timeout=70s
		if [ -x ./vram ]; then
			step vram-run-cuda 30 ./vram run --device cuda --json
			step vram-run-cuda-chunked 30 ./vram run --device cuda --vram 256MiB --double-buffer --json
			step vram-run-sim 40 ./vram run --device sim --json
		fi
		# Last and alone: it breaks its own process's context on purpose.
		VRAM_GPU_CHECK_STICKY=1 step sticky-error 25 ./cuda.test -test.v -test.count=1 -test.timeout=20s -test.run '^TestStickyErrorOnGPU$'
	fi
	rm -f "$ready"
	wait $keeper 2>/dev/null
	trap - EXIT

	local bench=$logs/cuda-bench.txt
	# metric BENCHMARK UNIT: the figure before UNIT on BENCHMARK's line, or "".
	metric() {
		[ -f "$bench" ] || return 0
		awk -v b="$1" -v u="$2" '$1 ~ "^"b"(-[0-9]+)?$" { for (i = 2; i < NF; i++) if ($(i+1) == u) { print $i; exit } }' "$bench"
	}
	rps() {
		[ -f "$logs/$1.txt" ] || return 0
		grep -o '"runs_per_second": *[0-9.eE+-]*' "$logs/$1.txt" | head -1 | sed 's/.*: *//' | awk '{ printf "%.0f", $1 }'
	}
	# ratio A B GOAL: A/B as "N.Nx", with "(goal GOALx: met|NOT met)" when GOAL is given.
	ratio() {
		awk -v a="$1" -v b="$2" -v g="${3:-}" 'BEGIN {
			if (!(a > 0 && b > 0)) { print "-"; exit }
			r = a / b; s = sprintf("%.1fx", r)
			if (g != "") s = s sprintf(" (goal %sx: %s)", g, (r >= g ? "met" : "NOT met"))
			print s }'
	}
	pct() {
		awk -v p="$1" -v g="$2" 'BEGIN {
			if (!(p > 0)) { print "-"; exit }
			printf "%.1f%% of raw (goal %s%%: %s)\n", p, g, (p >= g ? "met" : "NOT met") }'
	}
	or() { [ -n "$1" ] && echo "$1" || echo "-"; }

	local m a p
	m=$(metric 'BenchmarkMallocFree/2MiB' ns/op)
	a=$(metric 'BenchmarkMallocAsyncFreeAsync/2MiB' ns/op)
	p=$(metric 'BenchmarkPoolHit/2MiB' ns/op)
	local hm hr hp dm dr dp
	hm=$(metric 'BenchmarkManagerCopy/HtoD' mgr-MB/s); hr=$(metric 'BenchmarkManagerCopy/HtoD' raw-MB/s)
	hp=$(metric 'BenchmarkManagerCopy/HtoD' pct-of-raw)
	dm=$(metric 'BenchmarkManagerCopy/DtoH' mgr-MB/s); dr=$(metric 'BenchmarkManagerCopy/DtoH' raw-MB/s)
	dp=$(metric 'BenchmarkManagerCopy/DtoH' pct-of-raw)
	local rc rs
	rc=$(rps vram-run-cuda); rs=$(rps vram-run-sim)

	echo
	echo "== summary ($(head -1 "$logs/gpu.txt"); $((SECONDS - start)) s)"
	printf '%-46s %14s  %s\n' "measure" "value" "vs"
	printf '%-46s %11s ns  %s\n' "alloc+free 2 MiB, cuMemAlloc/cuMemFree" "$(or "$m")" ""
	printf '%-46s %11s ns  %s\n' "alloc+free 2 MiB, cuMemAllocAsync/FreeAsync" "$(or "$a")" ""
	printf '%-46s %11s ns  %s\n' "alloc+free 2 MiB, Pool cache hit" "$(or "$p")" \
		"cheaper than cuMemAlloc: $(ratio "$m" "$p" 50); than async: $(ratio "$a" "$p" 5)"
	printf '%-46s %9s MB/s  %s\n' "pinned HtoD 64 MiB, manager ToDevice" "$(or "$hm")" "$(pct "$hp" 90)"
	printf '%-46s %9s MB/s  %s\n' "pinned HtoD 64 MiB, raw driver loop" "$(or "$hr")" ""
	printf '%-46s %9s MB/s  %s\n' "pinned DtoH 64 MiB, manager FromDevice" "$(or "$dm")" "$(pct "$dp" 90)"
	printf '%-46s %9s MB/s  %s\n' "pinned DtoH 64 MiB, raw driver loop" "$(or "$dr")" ""
	printf '%-46s %9s /s    %s\n' "vram run, runs per second on the GPU" "$(or "$rc")" "$(ratio "$rc" "$rs") the simulator"
	printf '%-46s %9s /s\n' "vram run, runs per second on the simulator" "$(or "$rs")"
	echo "logs: $logs"
	if [ $gpu = 0 ]; then
		echo "NO GPU: nothing was measured (see $logs/hold.txt)"
		return 1
	fi
	[ $failed = 0 ] && echo "all steps passed" || echo "SOME STEPS FAILED: see the logs"
	return $failed
}

case $cmd in
build) shift; build "$@" ;;
run) shift; run "$@"; exit $? ;;
*) usage ;;
esac
