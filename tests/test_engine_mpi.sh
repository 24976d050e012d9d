#!/usr/bin/env bash
# Jobs that Open MPI's mpirun starts: `mpirun -np N weft train ...` forms the job with no
# --workers, and ends bit for bit as `weft train --workers` does (an AllReduce job and a job with
# a parameter server), and a pipeline with a server as `weft train --stages` does; an AMP job trains as `--amp --processes` does, and SIGTERM stops it with a
# checkpoint that --resume auto continues from; a rank killed mid-run stops the job, every member
# naming it. Without
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

# same_variables A B MESSAGE [F32_TOLERANCE]: fails with MESSAGE unless the checkpoints hold the
# same variables (tests/same_variables.py).
same_variables() { python3 "$(dirname "$0")/same_variables.py" "$1" "$2" "${4:-}" || fail "$3"; }

# A pipeline with a parameter server: mpirun's 3 ranks are the server (--servers-per-host 1) and
# the 2 stage processes. Each process profiles its own step to choose the cut, so the two jobs may
# cut differently, and the stages' squared norms behind the LM's clipping then add up in another
# order: the variables agree to rounding. The stages hold the LSTM's Adam slots alone (50 kB): the
# embedding's and the softmax's (about 200 kB) are on the server.
mpi 3 "$weft" train "${lm[@]}" --steps 30 --stages 2 --servers-per-host 1 --out "$work/mpi-pipe" \
  > "$work/mpi-pipe.log" 2>&1 || fail "mpirun -np 3 weft train lm --stages 2 failed"
grep -q "2 pipeline stages" "$work/mpi-pipe.log" || fail "the mpirun lm job did not run pipelined"
slots=$(sed -n 's/^stage [01]: .*optimizer state \([0-9.]*\) \(B\|kB\),.*/\1 \2/p' "$work/mpi-pipe.log" |
  awk '{ total += $2 == "kB" ? $1 * 1000 : $1 } END { print int(total) }')
[[ -n "$slots" && $slots -lt 100000 ]] || fail "the mpirun pipeline's stages hold $slots bytes of optimizer state: not served"
"$weft" train "${lm[@]}" --steps 30 --stages 2 --servers 1 --out "$work/own-pipe" > "$work/own-pipe.log" 2>&1 ||
  fail "weft train lm --stages 2 --servers 1 failed"
same_variables "$work/mpi-pipe/checkpoint.safetensors" "$work/own-pipe/checkpoint.safetensors" \
  "the pipelined lm job mpirun started (1 server, 2 stages) ended otherwise than the one weft started" 1e-5
echo "ok: mpirun's pipelined job with a server trains as weft's own"

# An AMP job: mpirun's ranks are the processes of `--amp --processes 2`, rank 0 the controller.
# Gradients summed across processes arrive in any order: the variables agree to rounding.
amp=(list_reduction --amp --dtype f64 --minibatch 8 --max-active-keys 2 --target 0 --train-size 48 --eval-size 8
     --hidden 16 --workers 1)
mpi 2 "$weft" train "${amp[@]}" --epochs 3 --out "$work/mpi-amp" --save "$work/mpi-amp.safetensors" \
  > "$work/mpi-amp.log" 2>&1 || fail "mpirun -np 2 weft train list_reduction --amp failed"
grep -q "2 process(es) of 1 workers" "$work/mpi-amp.log" || fail "the mpirun AMP job did not run as 2 processes"
"$weft" train "${amp[@]}" --epochs 3 --processes 2 --out "$work/own-amp" --save "$work/own-amp.safetensors" \
  > "$work/own-amp.log" 2>&1 || fail "weft train list_reduction --amp --processes 2 failed"
same_variables "$work/mpi-amp.safetensors" "$work/own-amp.safetensors" \
  "the AMP job mpirun started ended otherwise than the one weft started"
echo "ok: mpirun's AMP job trains as weft's own"

# SIGTERM to an AMP job's ranks (as an engine preempting it): every process stops after an epoch,
# the controller's checkpoint written, each exiting 143; --resume auto ends as the uninterrupted run.
# Each rank's status is recorded by a shell around it, which the signal does not reach, and passed
# on: mpirun stops the others at the first non-zero one, so none may exit before the checkpoint,
# and a rank stopped that way after it (its work done) may not get to say so itself.
mpi 2 bash -c '"$0" "$@"; s=$?; echo "rank $OMPI_COMM_WORLD_RANK exited $s" >> '"$work/amp-term.status"'; exit $s' \
  "$weft" train "${amp[@]}" --epochs 1000000 --out "$work/amp-term" > "$work/amp-term.log" 2>&1 &
launcher=$!
for _ in $(seq 3000); do grep -q "^epoch   2 |" "$work/amp-term.log" 2>/dev/null && break; sleep 0.1; done
grep -q "^epoch   2 |" "$work/amp-term.log" || fail "the AMP job to stop did not train two epochs within five minutes"
for pid in $(pgrep -f "$work/amp-term" || true); do
  [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$weft" ]] && kill -TERM "$pid"
done
wait "$launcher" || true  # mpirun reports the ranks' non-zero statuses
grep -q "stopped on SIGTERM after epoch [0-9]*: checkpoint $work/amp-term/checkpoint.safetensors written" \
  "$work/amp-term.log" || fail "the AMP job did not checkpoint on SIGTERM"
grep -q "^rank [01] exited 143$" "$work/amp-term.status" &&
  ! grep -v "^rank [01] exited 143$" "$work/amp-term.status" | grep -q . ||
  fail "the ranks did not exit with 143: $(cat "$work/amp-term.status")"
stopped=$(sed -n 's/^stopped on SIGTERM after epoch \([0-9]*\).*/\1/p' "$work/amp-term.log")
target=$((stopped + 1))
mpi 2 "$weft" train "${amp[@]}" --epochs "$target" --resume auto --out "$work/amp-term" \
  --save "$work/amp-resumed.safetensors" > "$work/amp-resumed.log" 2>&1 || fail "the resumed AMP job failed"
grep -q "resumed from $work/amp-term/checkpoint.safetensors after epoch $stopped" "$work/amp-resumed.log" ||
  fail "the AMP job did not resume from its checkpoint"
"$weft" train "${amp[@]}" --epochs "$target" --processes 2 --out "$work/amp-whole" \
  --save "$work/amp-whole.safetensors" > "$work/amp-whole.log" 2>&1 || fail "the uninterrupted AMP job failed"
same_variables "$work/amp-resumed.safetensors" "$work/amp-whole.safetensors" \
  "the resumed AMP job ended otherwise than an uninterrupted one"
echo "ok: SIGTERM stops an AMP job at an epoch's end with a checkpoint, and --resume auto continues it"

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
