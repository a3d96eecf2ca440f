#!/usr/bin/env bash
# slurm-e2e.sh — deploy/slurm/ end to end on a real Slurm, on this machine.
#
#   scripts/slurm-e2e.sh          (as root, on Debian or Ubuntu)
#   scripts/slurm-e2e.sh shared   (the same, for vram-shared-array.sbatch)
#
# Installs Slurm and munge from the distribution's packages if they are
# missing (apt-get update once, then slurmctld slurmd slurm-client munge
# with --no-install-recommends; a policy-rc.d that exits 101 keeps the
# packages' scripts from starting the daemons), starts munged, slurmctld
# and slurmd from this script (no systemd: each in the foreground,
# backgrounded, stopped by its pid when the script exits), with a
# configuration of its own in a temporary directory: one node, this
# machine, with $SHARDS GPUs declared in gres.conf (File= set, else slurmd
# drops them and drains the node; the files are stand-ins, the job runs on
# vram's simulator). Then it builds vram, submits deploy/slurm/submit.sh:
# the job array of $SHARDS tasks (one shard and --gres=gpu:1 each) and the
# dependent merge job, polls squeue until both are gone, checks that every
# task completed and said which shard Slurm gave it, and compares the
# gathered .npy byte for byte with the same batch run in one process.
#
# With "shared" it submits deploy/slurm/vram-shared-array.sbatch instead:
# two array tasks on the node, one broker (the tasks' keepers), one
# sim:shared device of 64 MiB that both tasks' vram run --socket lease
# from. While they run it samples `vram broker status --json` and the
# shared device's ledger; it checks that both tasks completed and
# verified, that both held leases at once, that the combined peak never
# passed the device (every allocation past it would fail in its process,
# and none did: no task ran out of memory), and gathers the two parts with
# vram merge into the result one process gives.
#
# Environment: SHARDS (default 4), RUNS (default 20000), KEEP=1 to keep the
# temporary directory (configuration, daemons' and jobs' logs, results),
# E2E_TIMEOUT seconds to wait for the jobs (default 180).
# Exit status: 0 when the gathered result is identical, 1 when anything
# failed (the daemons' and jobs' logs are printed), 2 when it cannot run
# here (not root, no apt-get, or apt-get could not install Slurm).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:-shards}
case $MODE in
shards) SHARDS=${SHARDS:-4} ;;
shared) SHARDS=2 ;;
*)
	echo "usage: $0 [shared]" >&2
	exit 2
	;;
esac
RUNS=${RUNS:-20000}
E2E_TIMEOUT=${E2E_TIMEOUT:-180}

say() { echo "slurm-e2e: $*"; }
failure=
die() {
	failure=$*
	say "FAIL: $*" >&2
	exit 1
}

if [ "$(id -u)" != 0 ]; then
	say "needs root (it installs packages and starts daemons); skipped" >&2
	exit 2
fi

install_slurm() {
	if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && command -v munged >/dev/null; then
		return
	fi
	command -v apt-get >/dev/null || {
		say "Slurm is not installed and there is no apt-get to install it" >&2
		exit 2
	}
	local made_policy= ok=1
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod +x /usr/sbin/policy-rc.d
		made_policy=1
	fi
	say "installing slurmctld slurmd slurm-client munge"
	# A failed install (no network, no such package) leaves no
	# policy-rc.d behind, and is "cannot run here", not a failure of vram.
	apt-get update -qq || ok=
	if [ -n "$ok" ]; then
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null || ok=
	fi
	if [ -n "$made_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
	if [ -z "$ok" ]; then
		say "apt-get could not install slurmctld slurmd slurm-client munge; skipped" >&2
		exit 2
	fi
}
install_slurm

work=$(mktemp -d /tmp/vram-slurm-e2e.XXXXXX)
chmod 755 "$work" # munged, running as munge, reaches its socket below it
pids=()
jobs_ids=() # the jobs submitted, cancelled at exit: slurmstepd and its tasks outlive slurmd
cleanup() {
	local rc=$?
	if [ ${#jobs_ids[@]} -gt 0 ]; then
		scancel "${jobs_ids[@]}" 2>/dev/null || true
		for _ in $(seq 20); do
			[ -z "$(squeue -h -j "$(IFS=,; echo "${jobs_ids[*]}")" -o %i 2>/dev/null)" ] && break
			sleep 0.5
		done
	fi
	for ((k = ${#pids[@]} - 1; k >= 0; k--)); do
		kill "${pids[k]}" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	if [ "$rc" != 0 ]; then
		for f in "$work"/*.log "$work"/jobs/*.log; do
			[ -f "$f" ] || continue
			echo "---- ${f#"$work"/}" >&2
			tail -n 40 "$f" >&2
		done
		say "FAIL: ${failure:-exit status $rc}" >&2
	fi
	if [ -n "${KEEP:-}" ]; then
		say "kept $work"
	else
		rm -rf "$work"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

say "building vram"
(cd "$root" && go build -o "$work/vram" ./cmd/vram)

# munge: its own socket and pid file under $work, so that a munged
# already running here is left alone. /run/munge is where the package's
# defaults point; it must exist and belong to munge.
install -d -o munge -g munge -m 0755 /run/munge "$work/munge"
if [ ! -s /etc/munge/munge.key ]; then
	setpriv --reuid=munge --regid=munge --init-groups mungekey --create
fi
sock=$work/munge/munge.socket
setpriv --reuid=munge --regid=munge --init-groups \
	munged --foreground --socket="$sock" --pid-file="$work/munge/munged.pid" >"$work/munged.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || die "munged did not start"
munge --socket="$sock" -n | unmunge --socket="$sock" >/dev/null || die "munge cannot encode and decode a credential"

# Slurm: one node, this machine, with $SHARDS stand-in GPUs.
host=$(hostname -s)
mkdir -p "$work/state" "$work/spool" "$work/jobs" "$work/out"
# slurmd takes a GPU only with a File= that is a character or block
# device: copies of /dev/null stand in for them.
for i in $(seq 0 $((SHARDS - 1))); do mknod "$work/gpu$i" c 1 3; done
export SLURM_CONF=$work/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=vram-e2e
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
MinJobAge=600
SchedulerParameters=defer_batch
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) Gres=gpu:$SHARDS State=UNKNOWN
PartitionName=e2e Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
cat >"$work/gres.conf" <<EOF
Name=gpu File=$work/gpu[0-$((SHARDS - 1))]
EOF

slurmctld -D -f "$SLURM_CONF" >"$work/slurmctld.stderr" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$work/slurmd.stderr" 2>&1 &
pids+=($!)
say "waiting for the node"
state=
for _ in $(seq 60); do
	state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
	[ "$state" = idle ] && break
	sleep 0.5
done
[ "$state" = idle ] || die "the node is '${state:-unknown}', not idle: $(sinfo -h -R 2>&1)"
gres=$(scontrol show node "$host" | grep -o 'Gres=[^ ]*')
say "node $host idle, $gres"

# shards_e2e: vram-array.sbatch's tasks and the merge job.
shards_e2e() {
	# The batch: small, on the simulator, chunked (a 1 MiB device of 64 KiB
	# pages holds about 5,000 of these runs).
	export VRAM="$work/vram" VRAM_OUT="$work/out/r.npy"
	export VRAM_DEVICE=sim:granularity=64KiB,context=0
	export VRAM_RUN_ARGS="--runs $RUNS --steps 40 --samples 21 --vram 1MiB --seed 13"
	start=$(date +%s)
	ids=$(cd "$work/jobs" && "$root/deploy/slurm/submit.sh" --array="0-$((SHARDS - 1))") || die "deploy/slurm/submit.sh failed"
	read -r array merge <<<"$ids"
	jobs_ids=("$array" "$merge")
	say "submitted the array $array ($SHARDS tasks) and the merge $merge"
	while :; do
		left=$(squeue -h -j "$array,$merge" -o %i 2>/dev/null | wc -l)
		[ "$left" = 0 ] && break
		[ $(($(date +%s) - start)) -lt "$E2E_TIMEOUT" ] || die "jobs still queued after ${E2E_TIMEOUT}s: $(squeue 2>&1)"
		sleep 1
	done
	say "jobs done in $(($(date +%s) - start)) s"

	# Every task and the merge completed, exit 0.
	for i in $(seq 0 $((SHARDS - 1))); do
		st=$(jobstate "${array}_$i")
		[ "$st" = "JobState=COMPLETED ExitCode=0:0" ] || die "task $i of the array: $st"
		log=$work/jobs/vram-shard-${array}_$i.log
		grep -q "vram: shard $i/$SHARDS from Slurm" "$log" || die "task $i did not say it ran shard $i/$SHARDS from Slurm: $(head -3 "$log")"
	done
	st=$(jobstate "$merge")
	[ "$st" = "JobState=COMPLETED ExitCode=0:0" ] || die "the merge job: $st"
	cat "$work/jobs/vram-merge-$merge.log"

say "the same batch in one process"
	# shellcheck disable=SC2086
	"$VRAM" run --out "$work/whole.npy" $VRAM_RUN_ARGS >"$work/whole.log" 2>&1 || die "one-process run failed"
	cmp "$work/whole.npy" "$VRAM_OUT" || die "the gathered result differs from the one-process run"
	say "PASS: $SHARDS shards through slurmctld/slurmd, gathered, identical to one process ($(stat -c %s "$VRAM_OUT") bytes) in $(($(date +%s) - start)) s"
	echo "slurm-e2e: 1 passed, 0 failed"
}

# shared_e2e: vram-shared-array.sbatch's two tasks on one shared device.
shared_e2e() {
	local dev=$work/sim status=$work/status.jsonl
	mkdir -p "$dev"
	export VRAM="$work/vram" VRAM_OUT="$work/out/r.npy" VRAM_BROKER_DIR=$work/brokers
	mkdir -p "$VRAM_BROKER_DIR"
	export VRAM_DEVICE="sim:shared=e2e,vram=64MiB,granularity=64KiB,bandwidth=80MB,dir=$dev"
	export VRAM_RUN_ARGS="--runs 200000 --steps 100 --samples 101 --seed 13"
	start=$(date +%s)
	local array
	array=$(cd "$work/jobs" && sbatch --parsable --array=0-1 --gres=none "$root/deploy/slurm/vram-shared-array.sbatch") || die "sbatch failed"
	array=${array%%;*}
	jobs_ids=("$array")
	say "submitted the shared array $array (2 tasks, one broker, $VRAM_DEVICE)"
	local sock=$VRAM_BROKER_DIR/vram-$array/broker.sock
	while [ -n "$(squeue -h -j "$array" -o %i 2>/dev/null)" ]; do
		[ $(($(date +%s) - start)) -lt "$E2E_TIMEOUT" ] || die "jobs still queued after ${E2E_TIMEOUT}s: $(squeue 2>&1)"
		if [ -S "$sock" ]; then
			"$VRAM" broker status --socket "$sock" --json 2>/dev/null | tr -d '\n' >>"$status" && echo >>"$status" || true
		fi
		sleep 0.1
	done
	say "jobs done in $(($(date +%s) - start)) s"
	# The keepers' brokers end with their tasks.
	for _ in $(seq 50); do
		pgrep -f -- "broker --socket $sock" >/dev/null || break
		sleep 0.1
	done
	! pgrep -af -- "broker --socket $sock" || die "a task's broker outlived its task"
	for i in 0 1; do
		st=$(jobstate "${array}_$i")
		log=$work/jobs/vram-shared-${array}_$i.log
		[ "$st" = "JobState=COMPLETED ExitCode=0:0" ] || die "task $i: $st"
		grep -q "^verified " "$log" || die "task $i did not verify: $(tail -3 "$log")"
		grep -q ", 0 out of memory" "$log" || die "task $i ran out of memory: $(grep allocator "$log")"
		grep "^lease " "$log" | sed "s/^/slurm-e2e: task $i: /"
	done
	# The broker's samples: the most both tasks held at once, with their
	# contexts, against the device.
	python3 - "$status" <<'PY' || die "the broker's samples: see above"
import json, sys
peak, both, total, n = 0, 0, 0, 0
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    d = json.loads(line)["devices"][0]
    n += 1
    total = d["total_bytes"]
    peak = max(peak, d["held_bytes"])
    if len(d["leases"]) == 2:
        both += 1
print("slurm-e2e: %d samples of the broker, %d with both tasks' leases; combined peak %.1f MiB of %.0f MiB" % (n, both, peak / 2**20, total / 2**20))
sys.exit(0 if both > 0 and 0 < peak <= total else 1)
PY
	"$VRAM" merge "$VRAM_OUT" >"$work/merge.log" 2>&1 || die "vram merge failed: $(cat "$work/merge.log")"
	# shellcheck disable=SC2086
	"$VRAM" run --device "sim:vram=64MiB,granularity=64KiB" --out "$work/whole.npy" $VRAM_RUN_ARGS >"$work/whole.log" 2>&1 || die "one-process run failed"
	cmp "$work/whole.npy" "$VRAM_OUT" || die "the gathered result differs from the one-process run"
	say "PASS: 2 tasks through one broker on one shared device, both verified, gathered, identical to one process in $(($(date +%s) - start)) s"
	echo "slurm-e2e: 1 passed, 0 failed"
}

jobstate() { scontrol -o show job "$1" | grep -o 'JobState=[A-Z_]* .*ExitCode=[0-9:]*' | sed 's/ .*ExitCode=/ ExitCode=/'; }
"${MODE}_e2e"
