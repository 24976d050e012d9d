#!/usr/bin/env bash
# Jobs that Slurm starts: a one-node Slurm cluster of this machine (munged, slurmctld and slurmd
# from Debian's packages, on loopback, with a slurm.conf and a munge key made here) runs
# `srun -n 3 weft train lm ...`, data-parallel and pipelined with a server, and an sbatch script's
# `srun weft train mlp ...`; each ends as `weft train --workers` (or `--stages`) does. A task
# killed mid-run fails the step, every member naming it. Every daemon is stopped by its pid at the end. Needs root (the daemons run as root
# here) and the packages slurmctld, slurmd, slurm-client and munge; without them it reports why
# and exits 77 (ctest: skipped).
#
#   tests/test_engine_slurm.sh WEFT_BINARY
set -euo pipefail

weft="$(realpath "$1")"
skip() { echo "skipped: $1"; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root to run slurmctld and slurmd"
for program in munged mungekey slurmctld slurmd srun sbatch scontrol; do
  command -v "$program" >/dev/null || [[ -x /usr/sbin/$program ]] ||
    skip "needs $program (Debian packages slurmctld, slurmd, slurm-client, munge)"
done
PATH="$PATH:/usr/sbin"

work="$(mktemp -d)"
chmod 755 "$work"
stop_daemons() {
  local daemon pid
  for daemon in slurmd slurmctld munged; do
    [[ -f "$work/$daemon.pid" ]] || continue
    pid="$(cat "$work/$daemon.pid")"
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 100); do  # until it has written its last state and gone
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  done
}
cleanup() {
  pkill -9 -f "$work/out" 2>/dev/null || true
  stop_daemons
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
. "$(dirname "${BASH_SOURCE[0]}")/kill_member.sh"
fail() {
  echo "FAILED: $1"
  for f in "$work"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v '^step' | tail -30; done
  exit 1
}

# Two free TCP ports on loopback, for slurmctld and slurmd.
read -r ctld_port slurmd_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
node="$(hostname -s)"
mkdir -p "$work/state" "$work/spool" "$work/out"
mungekey -c -k "$work/munge.key"
munged --force -S "$work/munge.sock" --key-file="$work/munge.key" --pid-file="$work/munged.pid" \
  --log-file="$work/munged.log" --seed-file="$work/munged.seed" || skip "munged does not start here"
cat > "$work/slurm.conf" <<EOF
ClusterName=weft-test
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$work/munge.sock
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=weft Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF="$work/slurm.conf"
slurmctld -f "$SLURM_CONF" || fail "slurmctld does not start"
slurmd -f "$SLURM_CONF" || fail "slurmd does not start"
for _ in $(seq 300); do
  sinfo -h -o %t 2>/dev/null | grep -qx idle && break
  sleep 0.2
done
sinfo -h -o %t | grep -qx idle || fail "the Slurm node did not come up idle within a minute"

mlp=(mlp --steps 40 --batch 64 --threads 1)
lm=(lm --vocab 500 --classes 10 --embed 16 --hidden 32 --sampled 64 --train-sentences 400 --heldout-sentences 20
    --batch 16 --threads 1)

# srun: three tasks; the LM's default server per host takes local rank 0, two workers the rest.
srun -n 3 "$weft" train "${lm[@]}" --steps 30 --out "$work/out/srun-lm" > "$work/srun-lm.log" 2>&1 ||
  fail "srun -n 3 weft train lm failed"
"$weft" train "${lm[@]}" --steps 30 --workers 2 --servers 1 --out "$work/out/own-lm" > "$work/own-lm.log" 2>&1 ||
  fail "weft train lm --workers 2 --servers 1 failed"
cmp -s "$work/out/srun-lm/checkpoint.safetensors" "$work/out/own-lm/checkpoint.safetensors" ||
  fail "the lm job srun started ended otherwise than the one weft started"
echo "ok: srun's job ends bit for bit as weft's own"

# srun: a pipeline with a parameter server, the server on local rank 0 (--servers-per-host 1) and
# the 2 stage processes on the rest. The two jobs may cut differently (each profiles its own
# step), and the LM clipping's stage sums then add up in another order: the variables agree to
# rounding.
srun -n 3 "$weft" train "${lm[@]}" --steps 30 --stages 2 --servers-per-host 1 --out "$work/out/srun-pipe" \
  > "$work/srun-pipe.log" 2>&1 || fail "srun -n 3 weft train lm --stages 2 failed"
grep -q "2 pipeline stages" "$work/srun-pipe.log" || fail "the srun lm job did not run pipelined"
"$weft" train "${lm[@]}" --steps 30 --stages 2 --servers 1 --out "$work/out/own-pipe" > "$work/own-pipe.log" 2>&1 ||
  fail "weft train lm --stages 2 --servers 1 failed"
python3 "$(dirname "$0")/same_variables.py" "$work/out/srun-pipe/checkpoint.safetensors" \
  "$work/out/own-pipe/checkpoint.safetensors" 1e-5 ||
  fail "the pipelined lm job srun started (1 server, 2 stages) ended otherwise than the one weft started"
echo "ok: srun's pipelined job with a server trains as weft's own"

# sbatch: the script's srun line, as a user writes it.
cat > "$work/job.sh" <<EOF
#!/bin/sh
#SBATCH --ntasks=2
srun "$weft" train ${mlp[*]} --out "$work/out/sbatch-mlp"
EOF
sbatch --wait -o "$work/sbatch-mlp.log" "$work/job.sh" > /dev/null || fail "the sbatch job failed"
"$weft" train "${mlp[@]}" --workers 2 --servers 0 --out "$work/out/own-mlp" > "$work/own-mlp.log" 2>&1 ||
  fail "weft train mlp --workers 2 failed"
cmp -s "$work/out/sbatch-mlp/checkpoint.safetensors" "$work/out/own-mlp/checkpoint.safetensors" ||
  fail "the mlp job sbatch started ended otherwise than the one weft started"
echo "ok: sbatch's job ends bit for bit as weft's own"

# `scontrol requeue` mid-run: Slurm sends the tasks SIGTERM; they finish their step, worker 0
# writes a checkpoint, and the job runs again (SLURM_RESTART_COUNT=1), continuing from it with
# --resume auto, to end bit for bit as an uninterrupted run.
cat > "$work/requeue.sh" <<EOF
#!/bin/sh
#SBATCH --ntasks=3
#SBATCH --requeue
#SBATCH --open-mode=append
srun "$weft" train ${lm[*]} --steps 3000 --log-every 1 --resume auto --out "$work/out/requeued"
EOF
job=$(sbatch --parsable -o "$work/requeue.log" "$work/requeue.sh") || fail "sbatch of the requeued job failed"
for _ in $(seq 3000); do
  grep -q "step *[0-9]*[1-9]00/3000" "$work/requeue.log" 2>/dev/null && break
  sleep 0.1
done
grep -q "step *[0-9]*[1-9]00/3000" "$work/requeue.log" || fail "the job to requeue did not train within five minutes"
scontrol requeue "$job" || fail "scontrol requeue $job failed"
state=""
requeued=$SECONDS
for _ in $(seq 6000); do
  state=$(scontrol show job "$job" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
  [[ $state == COMPLETED || $state == FAILED || $state == CANCELLED ]] && break
  # A requeued job waits for its begin time; this cluster has nothing else to run. Not within
  # the second of the requeue: slurmd refuses a credential of the second it revoked the old one
  # ("Job credential revoked"), and the job would fail.
  if [[ $state == PENDING ]] && ((SECONDS - requeued >= 2)); then
    scontrol update jobid="$job" StartTime=now 2>/dev/null || true
  fi
  sleep 0.1
done
[[ $state == COMPLETED ]] || fail "the requeued job ended $state"
grep -q "stopped on SIGTERM after step" "$work/requeue.log" || fail "the job did not checkpoint on SIGTERM"
grep -q "resumed from $work/out/requeued/checkpoint.safetensors at step" "$work/requeue.log" ||
  fail "the requeued job did not resume from its checkpoint"
"$weft" train "${lm[@]}" --steps 3000 --log-every 1 --workers 2 --servers 1 --out "$work/out/uninterrupted" \
  > "$work/uninterrupted.log" 2>&1 || fail "the uninterrupted run failed"
cmp -s "$work/out/requeued/checkpoint.safetensors" "$work/out/uninterrupted/checkpoint.safetensors" ||
  fail "the requeued job ended otherwise than an uninterrupted one"
echo "ok: scontrol requeue checkpoints, and the requeued job resumes to end as an uninterrupted one"

# A task killed mid-run: the step fails, and the others name it.
srun -n 3 "$weft" train "${lm[@]}" --steps 1000000 --log-every 1 --out "$work/out/killed" > "$work/killed.log" 2>&1 &
launcher=$!
kill_member_when_training "$work/out/killed" "$work/killed.log" SLURM_PROCID=2 "step *[0-9]*50/"
status=0
wait "$launcher" || status=$?
[[ $status -ne 0 ]] || fail "srun succeeded although task 2 was killed"
grep -q "the job stopped: worker 1 of host 0 (local rank 2 on $node) ended without finishing" "$work/killed.log" ||
  fail "the members did not name the killed task"
# srun names tasks that end together in one line ("tasks 0-1: ...") and others one by one.
exited_75() { grep -qE "tasks? ([0-9]+-)?$1(-[0-9]+)?: Exited with exit code 75" "$work/killed.log"; }
exited_75 0 && exited_75 1 ||
  fail "the other tasks did not exit with 75, the status of a member stopped by another's failure"
for _ in $(seq 50); do pgrep -f "$work/out/killed" > /dev/null || break; sleep 0.1; done
! pgrep -f "$work/out/killed" > /dev/null || fail "tasks of the failed step are still running"
echo "ok: a killed task fails the step, named"
