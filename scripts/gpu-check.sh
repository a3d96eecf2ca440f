#!/usr/bin/env bash
# gpu-check.sh — check vram's CUDA backend on a machine with an NVIDIA GPU.
#
#   scripts/gpu-check.sh build [DIR]   where Go is: compile the test binaries
#                                      and the CLI into DIR (default gpu-check/)
#   DIR/gpu-check.sh run [DIR]         on the GPU machine (no Go needed): run
#                                      them and print one summary table
#
# `build` makes static binaries (CGO_ENABLED=0; the driver is loaded at run
# time), so DIR can be copied to any Linux machine of the same architecture
# with the NVIDIA driver installed. `run` runs, each under a timeout, the
# device conformance suite and the GPU tests of device/cuda, the PTX kernel
# test of internal/oscillator, the allocator conformance suite (which runs
# on the simulator: alloctest takes no device), the CUDA benchmarks,
# and `vram run` on the GPU and on the simulator; it then prints the cost
# of an allocate-and-free pair (cuMemAlloc/cuMemFree, cuMemAllocAsync/
# cuMemFreeAsync, Pool's cache hit), pinned copy bandwidth through the
# device API against a raw loop of driver calls, and vram run's runs per
# second on the GPU and on the simulator. Everything it ran is logged under
# DIR/logs/. It stays within 8 minutes (the timeouts below add up to under 7.5).
# Exit status: 0 when every step passed, 1 otherwise (the table is printed
# either way).
set -uo pipefail

usage() { sed -n '2,8p' "$0" >&2; exit 2; }

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
	go test -c -o "$out/alloc.test" ./alloc
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
		nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
	else
		echo "nvidia-smi not found (the checks still try libcuda.so.1)" | tee "$logs/gpu.txt"
	fi

	# step NAME TIMEOUT_SECONDS COMMAND... : run, log, and note a failure.
	step() {
		local name=$1 limit=$2 rc
		shift 2
		printf '== %-28s (limit %3ss) ' "$name" "$limit"
		timeout --signal=INT --kill-after=5 "$limit" "$@" >"$logs/$name.txt" 2>&1
		rc=$?
		case $rc in
		0) echo "ok" ;;
		124 | 137) echo "TIMED OUT"; failed=1 ;;
		*) echo "FAILED (exit $rc)"; failed=1 ;;
		esac
		# A skip on the GPU machine means the backend did not open: say why.
		if grep -q -- '--- SKIP' "$logs/$name.txt"; then
			grep -m3 -A1 -- '--- SKIP' "$logs/$name.txt" | sed 's/^/   /'
		fi
		return $rc
	}

	step cuda-tests 120 ./cuda.test -test.v -test.count=1 -test.timeout=110s \
		-test.run 'Conformance|Allocators|LaunchPTX|Pinned|ResetAcross|OpenWithout|Example'
	step oscillator-ptx 40 ./oscillator.test -test.v -test.count=1 -test.timeout=35s -test.run 'PTX|GoKernel'
	step alloc-conformance 45 ./alloc.test -test.count=1 -test.timeout=40s -test.run 'Conformance'
	step cuda-bench 90 ./cuda.test -test.run '^$' -test.bench . -test.benchtime 500ms -test.timeout=80s
	if [ -x ./vram ]; then
		step vram-run-cuda 40 ./vram run --device cuda --json
		step vram-run-cuda-chunked 40 ./vram run --device cuda --vram 256MiB --double-buffer --json
		step vram-run-sim 55 ./vram run --device sim --json
	fi

	# ns/op of a benchmark (first match), or "-".
	ns() { awk -v b="$1" '$1 ~ "^"b"(-[0-9]+)?$" { for (i = 2; i < NF; i++) if ($(i+1) == "ns/op") { print $i; exit } }' "$logs/cuda-bench.txt"; }
	mbs() { awk -v b="$1" '$1 ~ "^"b"(-[0-9]+)?$" { for (i = 2; i < NF; i++) if ($(i+1) == "MB/s") { print $i; exit } }' "$logs/cuda-bench.txt"; }
	rps() {
		[ -f "$logs/$1.txt" ] || return 0
		grep -o '"runs_per_second": *[0-9.eE+-]*' "$logs/$1.txt" | head -1 | sed 's/.*: *//' | awk '{ printf "%.0f", $1 }'
	}
	ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.1f×", a / b; else print "-" }'; }
	pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.0f%%", 100 * a / b; else print "-" }'; }
	or() { [ -n "$1" ] && echo "$1" || echo "-"; }

	local m a p
	m=$(ns 'BenchmarkMallocFree/2MiB'); a=$(ns 'BenchmarkMallocAsyncFreeAsync/2MiB'); p=$(ns 'BenchmarkPoolHit/2MiB')
	local hapi hraw dapi draw
	hapi=$(mbs 'BenchmarkCopy/HtoD/api'); hraw=$(mbs 'BenchmarkCopy/HtoD/raw')
	dapi=$(mbs 'BenchmarkCopy/DtoH/api'); draw=$(mbs 'BenchmarkCopy/DtoH/raw')
	local rc rs
	rc=$(rps vram-run-cuda); rs=$(rps vram-run-sim)

	echo
	echo "== summary ($(cat "$logs/gpu.txt" | head -1); $((SECONDS - start)) s)"
	printf '%-44s %14s  %s\n' "measure" "value" "vs"
	printf '%-44s %11s ns  %s\n' "alloc+free 2 MiB, cuMemAlloc/cuMemFree" "$(or "$m")" ""
	printf '%-44s %11s ns  %s\n' "alloc+free 2 MiB, cuMemAllocAsync/FreeAsync" "$(or "$a")" ""
	printf '%-44s %11s ns  %s\n' "alloc+free 2 MiB, Pool cache hit" "$(or "$p")" \
		"$(ratio "$m" "$p") cheaper than cuMemAlloc (goal 50×), $(ratio "$a" "$p") than async (goal 5×)"
	printf '%-44s %9s MB/s  %s\n' "pinned HtoD 64 MiB, device API" "$(or "$hapi")" "$(pct "$hapi" "$hraw") of raw (goal 90%)"
	printf '%-44s %9s MB/s  %s\n' "pinned HtoD 64 MiB, raw driver loop" "$(or "$hraw")" ""
	printf '%-44s %9s MB/s  %s\n' "pinned DtoH 64 MiB, device API" "$(or "$dapi")" "$(pct "$dapi" "$draw") of raw (goal 90%)"
	printf '%-44s %9s MB/s  %s\n' "pinned DtoH 64 MiB, raw driver loop" "$(or "$draw")" ""
	printf '%-44s %9s /s    %s\n' "vram run, runs per second on the GPU" "$(or "$rc")" "$(ratio "$rc" "$rs") the simulator"
	printf '%-44s %9s /s\n' "vram run, runs per second on the simulator" "$(or "$rs")"
	echo "logs: $logs"
	[ $failed = 0 ] && echo "all steps passed" || echo "SOME STEPS FAILED: see the logs"
	return $failed
}

case $cmd in
build) shift; build "$@" ;;
run) shift; run "$@"; exit $? ;;
*) usage ;;
esac
