#!/usr/bin/env bash
# Jobs that torchrun starts (`torchrun --no-python weft train ...`): the job ends bit for bit as
# `weft train --workers` does, and a pipeline with a server as `weft train --stages` does; a worker killed mid-run stops the job, named; and with torchrun's
# --max-restarts the restarted workers (TORCHELASTIC_RESTART_COUNT=1) continue from the last
# checkpoint with --resume auto, to end as an uninterrupted run. torchrun comes with PyPI's torch,
# which `./weft test` installs into .venv/: the test runs the torchrun TORCHRUN names, else that
# one, else the one on PATH, and otherwise reports why and exits 77 (skipped).
#
#   tests/test_engine_torchrun.sh WEFT_BINARY
set -euo pipefail

weft="$(realpath "$1")"
skip() { echo "skipped: $1"; exit 77; }
venv_torchrun="$(dirname "${BASH_SOURCE[0]}")/../.venv/bin/torchrun"
[[ -x $venv_torchrun ]] || venv_torchrun="$(command -v torchrun || true)"
torchrun="${TORCHRUN:-$venv_torchrun}"
[[ -n $torchrun && -x $torchrun ]] ||
  skip "needs torchrun (./weft test installs PyPI's torch into .venv/; or TORCHRUN=/path/to/torchrun)"
work="$(mktemp -d)"
cleanup() {
  pkill -9 -f "$work/" 2>/dev/null || true
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
. "$(dirname "${BASH_SOURCE[0]}")/kill_member.sh"
fail() { echo "FAILED: $1"; for f in "$work"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v '^step' | tail -30; done; exit 1; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
run() {
  "$torchrun" --nnodes 1 --nproc-per-node 3 --master-addr 127.0.0.1 --master-port "$(free_port)" "$@"
}

lm=(lm --vocab 500 --classes 10 --embed 16 --hidden 32 --sampled 64 --train-sentences 400 --heldout-sentences 20
    --batch 16 --threads 1)

run --no-python "$weft" train "${lm[@]}" --steps 30 --out "$work/torchrun" > "$work/torchrun.log" 2>&1 ||
  fail "torchrun --nproc-per-node 3 weft train lm failed"
"$weft" train "${lm[@]}" --steps 30 --workers 2 --servers 1 --out "$work/own" > "$work/own.log" 2>&1 ||
  fail "weft train lm --workers 2 --servers 1 failed"
cmp -s "$work/torchrun/checkpoint.safetensors" "$work/own/checkpoint.safetensors" ||
  fail "the job torchrun started ended otherwise than the one weft started"
echo "ok: torchrun's job ends bit for bit as weft's own"

# A pipeline with a parameter server: the server on RANK 0 (--servers-per-host 1), the 2 stage
# processes on the rest. The two jobs may cut differently (each profiles its own step), and the LM
# clipping's stage sums then add up in another order: the variables agree to rounding.
run --no-python "$weft" train "${lm[@]}" --steps 30 --stages 2 --servers-per-host 1 --out "$work/pipe" \
  > "$work/pipe.log" 2>&1 || fail "torchrun --nproc-per-node 3 weft train lm --stages 2 failed"
grep -q "2 pipeline stages" "$work/pipe.log" || fail "the torchrun lm job did not run pipelined"
"$weft" train "${lm[@]}" --steps 30 --stages 2 --servers 1 --out "$work/own-pipe" > "$work/own-pipe.log" 2>&1 ||
  fail "weft train lm --stages 2 --servers 1 failed"
python3 "$(dirname "${BASH_SOURCE[0]}")/same_variables.py" "$work/pipe/checkpoint.safetensors" \
  "$work/own-pipe/checkpoint.safetensors" 1e-5 ||
  fail "the pipelined job torchrun started (1 server, 2 stages) ended otherwise than the one weft started"
echo "ok: torchrun's pipelined job with a server trains as weft's own"

# A killed worker (RANK 2: worker 1 of host 0) stops the job, named.
run --no-python "$weft" train "${lm[@]}" --steps 1000000 --log-every 1 --out "$work/killed" > "$work/killed.log" 2>&1 &
launcher=$!
kill_member_when_training "$work/killed" "$work/killed.log" RANK=2 "step *[0-9]*50/"
status=0
wait "$launcher" || status=$?
[[ $status -ne 0 ]] || fail "torchrun succeeded although a worker was killed"
grep -q "worker 1 of host 0 (local rank 2) ended without finishing" "$work/killed.log" ||
  fail "the members did not name the killed worker"
echo "ok: a killed worker stops the job, named"

# torchrun restarts the job after the kill; --resume auto continues from the last checkpoint.
run --max-restarts 1 --no-python "$weft" train "${lm[@]}" --steps 600 --log-every 1 --checkpoint-every 100 \
  --resume auto --out "$work/restarted" > "$work/restarted.log" 2>&1 &
launcher=$!
kill_member_when_training "$work/restarted" "$work/restarted.log" RANK=2 "step *150/"
wait "$launcher" || fail "the restarted job failed"
grep -q "resumed from $work/restarted/checkpoint.safetensors at step" "$work/restarted.log" ||
  fail "the restarted job did not resume from its checkpoint"
"$weft" train "${lm[@]}" --steps 600 --log-every 1 --checkpoint-every 100 --workers 2 --servers 1 \
  --out "$work/uninterrupted" > "$work/uninterrupted.log" 2>&1 || fail "the uninterrupted run failed"
cmp -s "$work/restarted/checkpoint.safetensors" "$work/uninterrupted/checkpoint.safetensors" ||
  fail "the restarted job ended otherwise than an uninterrupted one"
echo "ok: torchrun's restart resumes from the checkpoint and ends as an uninterrupted run"
