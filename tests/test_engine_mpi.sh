#!/usr/bin/env bash
# Jobs that Open MPI's mpirun starts: `mpirun -np N weft train ...` forms the job with no
# --workers, and ends bit for bit as `weft train --workers` does (an AllReduce job and a job with
# a parameter server); a rank killed mid-run stops the job, every member naming it. Without
# mpirun (Debian package openmpi-bin) it reports why and exits 77 (ctest: skipped).
#
#   tests/test_engine_mpi.sh WEFT_BINARY
set -euo pipefail

weft="$(realpath "$1")"
skip() { echo "skipped: $1"; exit 77; }
command -v mpirun >/dev/null || skip "needs mpirun (Debian package openmpi-bin)"
# mpirun refuses root unless told; the test's processes are this user's either way.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d)"
cleanup() {
  pkill -9 -f "$work/" 2>/dev/null || true
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
. "$(dirname "${BASH_SOURCE[0]}")/kill_member.sh"
fail() { echo "FAILED: $1"; for f in "$work"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | tail -30; done; exit 1; }
mpi() { mpirun -np "$1" --oversubscribe --bind-to none "${@:2}"; }

mlp=(mlp --steps 40 --batch 64 --threads 1)
lm=(lm --vocab 500 --classes 10 --embed 16 --hidden 32 --sampled 64 --train-sentences 400 --heldout-sentences 20
    --batch 16 --threads 1)

# An AllReduce job (no servers), and an LM job whose embedding the default server per host holds.
mpi 2 "$weft" train "${mlp[@]}" --out "$work/mpi-mlp" > "$work/mpi-mlp.log" 2>&1 || fail "mpirun -np 2 weft train mlp failed"
"$weft" train "${mlp[@]}" --workers 2 --servers 0 --out "$work/own-mlp" > "$work/own-mlp.log" 2>&1 ||
  fail "weft train mlp --workers 2 failed"
cmp -s "$work/mpi-mlp/checkpoint.safetensors" "$work/own-mlp/checkpoint.safetensors" ||
  fail "the mlp job mpirun started ended otherwise than the one weft started"
grep -q "2 workers" "$work/mpi-mlp.log" || fail "the mpirun mlp job did not train with 2 workers"

mpi 3 "$weft" train "${lm[@]}" --steps 30 --out "$work/mpi-lm" > "$work/mpi-lm.log" 2>&1 || fail "mpirun -np 3 weft train lm failed"
"$weft" train "${lm[@]}" --steps 30 --workers 2 --servers 1 --out "$work/own-lm" > "$work/own-lm.log" 2>&1 ||
  fail "weft train lm --workers 2 --servers 1 failed"
cmp -s "$work/mpi-lm/checkpoint.safetensors" "$work/own-lm/checkpoint.safetensors" ||
  fail "the lm job mpirun started (1 server, 2 workers) ended otherwise than the one weft started"
echo "ok: mpirun's jobs end bit for bit as weft's own"

# Rank 2 (worker 1 of host 0, local rank 2) is killed mid-run: the job stops, naming it.
mpi 3 "$weft" train "${lm[@]}" --steps 1000000 --log-every 1 --out "$work/killed" > "$work/killed.log" 2>&1 &
launcher=$!
kill_member_when_training "$work/killed" "$work/killed.log" OMPI_COMM_WORLD_RANK=2 "step *[0-9]*50/"
status=0
wait "$launcher" || status=$?
[[ $status -ne 0 ]] || fail "mpirun succeeded although rank 2 was killed"
grep -q "the job stopped: worker 1 of host 0 (local rank 2) ended without finishing" "$work/killed.log" ||
  fail "the members did not name the killed rank"
sleep 1
! pgrep -f "$work/killed" > /dev/null || fail "processes of the stopped job are still running"
echo "ok: a killed rank stops the job, named"
