#!/usr/bin/env bash
# gpu-check.sh — check vram's CUDA backend on a machine with an NVIDIA GPU.
#
#   scripts/gpu-check.sh build [DIR]   where Go is: compile the test binaries
#                                      and the CLI into DIR (default gpu-check/)
#   DIR/gpu-check.sh run [DIR]         on the GPU machine (no Go needed): run
#                                      them and print one summary table
#
# `build` compiles without cgo (CGO_ENABLED=0: purego loads the driver at
# run time), for the build machine's GOOS/GOARCH (set GOARCH=arm64 for a
# Grace Hopper machine). The binaries link nothing but the system's glibc
# (libc, libdl, libpthread) dynamically, so DIR can be copied to any Linux
# machine of that architecture with glibc and the NVIDIA driver installed. `run` first asks the CLI to
# open the GPU (`vram info --device cuda`); without a usable GPU it says why
# and stops at once (exit 1). Otherwise it runs, each under a timeout: the
# device conformance suite, the allocator conformance suite (Direct, Pool
# and AsyncPool on the CUDA device) and the other GPU tests of device/cuda,
# the PTX kernel test of internal/oscillator, the CUDA benchmarks, and
# `vram run` on the GPU and on the simulator. It then prints one table: the
# cost of an allocate-and-free pair (cuMemAlloc/cuMemFree,
# cuMemAllocAsync/cuMemFreeAsync, Pool's cache hit) with the hit's ratios
# to the other two (goals 50x and 5x), pinned 64 MiB copy bandwidth through
# the manager (vram.Manager ToDevice/FromDevice) against a raw loop of
# driver calls timed in the same benchmark loop (goal 90%), and vram run's
# runs per second on the GPU and on the simulator. Everything it ran is
# logged under DIR/logs/. It stays within 8 minutes: the step limits add up
# to 6 min 55 s, and a step is killed at most 5 s after its limit.
# Exit status: 0 when every step passed, 1 otherwise (the table is printed
# either way).
set -uo pipefail

usage() { sed -n '2,7p' "$0" >&2; exit 2; }

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
	cp "$0" "$out/gpu-check.sh"
	chmod +x "$out/gpu-check.sh"
	{
		echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) by $(go version)"
		git -C "$repo" describe --always --dirty 2>/dev/null | sed 's/^/commit /' || true
	} >"$out/BUILD-INFO"
	echo "== done: copy $out to the GPU machine and run: $(basename "$out")/gpu-check.sh run"
}

run() {
	local dir logs failed=0
	dir=${1:-$(cd "$(dirname "$0")" && pwd)}
	cd "$dir" || exit 1
	logs=$dir/logs
	mkdir -p "$logs"
	local start=$SECONDS

	echo "== machine"
	cat BUILD-INFO 2>/dev/null
	if command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1 | tee "$logs/gpu.txt"
	else
		echo "nvidia-smi not found (the checks still try libcuda.so.1)" | tee "$logs/gpu.txt"
	fi
	local have_timeout=1
	if ! command -v timeout >/dev/null; then
		have_timeout=0
		echo "timeout(1) not found: steps run without a time limit"
	fi

	# step NAME TIMEOUT_SECONDS COMMAND... : run, log, and note a failure.
	step() {
		local name=$1 limit=$2 rc
		shift 2
		printf '== %-28s (limit %3ss) ' "$name" "$limit"
		if [ $have_timeout = 1 ]; then
			timeout --signal=INT --kill-after=5 "$limit" "$@" >"$logs/$name.txt" 2>&1
		else
			"$@" >"$logs/$name.txt" 2>&1
		fi
		rc=$?
		case $rc in
		0) echo "ok" ;;
		124 | 137) echo "TIMED OUT"; failed=1 ;;
		*) echo "FAILED (exit $rc)"; failed=1 ;;
		esac
		# A skip on the GPU machine usually means the backend did not open: say why.
		if grep -q -- '^--- SKIP' "$logs/$name.txt"; then
			grep -m3 -A1 -- '^--- SKIP' "$logs/$name.txt" | sed 's/^/   /'
		fi
		return $rc
	}

	local gpu=1
	if [ -x ./vram ]; then
		if ! step preflight 10 ./vram info --device cuda; then
			gpu=0
			echo "   no usable CUDA device here:"
			tail -3 "$logs/preflight.txt" | sed 's/^/   /'
		fi
	fi
	if [ $gpu = 1 ]; then
		# The device conformance suite runs alone, so that a test that hangs
		# there (-test.timeout names it) cannot take the other checks with it.
		step device-conformance 75 ./cuda.test -test.v -test.count=1 -test.timeout=70s -test.run '^TestConformance$'
		step cuda-tests 100 ./cuda.test -test.v -test.count=1 -test.timeout=95s \
			-test.run 'AllocatorConformance|Allocators|LaunchPTX|Pinned|ResetAcross|Strided|DriverOutOfMemory|NoAlias|ManagerCopies|NothingAtImport|Example'
		step oscillator-ptx 35 ./oscillator.test -test.v -test.count=1 -test.timeout=30s -test.run 'PTX|GoKernel'
		step cuda-bench 80 ./cuda.test -test.run '^$' -test.bench . -test.benchtime 500ms -test.timeout=75s
		if [ -x ./vram ]; then
			step vram-run-cuda 35 ./vram run --device cuda --json
			step vram-run-cuda-chunked 35 ./vram run --device cuda --vram 256MiB --double-buffer --json
			step vram-run-sim 45 ./vram run --device sim --json
		fi
	fi

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
		echo "NO GPU: nothing was measured (see $logs/preflight.txt)"
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
