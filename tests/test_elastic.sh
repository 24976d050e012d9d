#!/usr/bin/env bash
# Elastic jobs (`weft train --cluster SPEC --min-workers 2`) on three emulated hosts: network
# namespaces on one bridge, each host running a worker and a parameter server. The launcher and
# host 0 run in the first namespace; hosts 1 and 2 are reached through `ip netns exec`, their
# launch prefix. Two runs against an uninterrupted one of the same total batch on all three hosts:
#   1. host 2 is removed for good mid-run (its processes killed, its namespace deleted): the
#      job restarts from its checkpoint on the two hosts that remain, the embeddings' partitions
#      re-placed over their two servers, and ends with the uninterrupted run's variables;
#   2. host 2 is missing at the start and appears mid-run: the job starts on two hosts, stops at a
#      checkpoint when host 2 answers, and ends on three with the same variables.
# The model trains in f64, so the runs differ only by the order of sums (1e-12 of each tensor's
# largest value). Restarts, sizes and causes must be in the log and metrics.jsonl. Nothing is
# added to this machine's own network. Needs root (ip netns); without it, reports why and exits
# 77 (ctest: skipped).
#
#   tests/test_elastic.sh WEFT_BINARY
set -euo pipefail

weft="$(realpath "$1")"
source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
skip() { echo "skipped: $1"; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root for ip netns"

tag="we$$"
hosts=("${tag}h0" "${tag}h1" "${tag}h2")
addresses=(10.82.0.1 10.82.0.2 10.82.0.3)
bridge="${tag}br"
work="$(mktemp -d)"
cleanup() {
  for ns in "${hosts[@]}"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "FAILED: $1"; for f in "$work"/*.log; do echo "== $f"; grep -v '^step' "$f" | tail -30; done; exit 1; }

ip netns add "${hosts[0]}" 2>/dev/null || skip "cannot create network namespaces here (ip netns add failed)"
ip netns exec "${hosts[0]}" ip link set lo up
# A bridge takes the lowest MAC address of its ports unless given one: a host's port leaving or
# joining would change the address host 0 answers on, and the others' ARP entries would point
# nowhere for half a minute, as no real switch does to a machine.
ip netns exec "${hosts[0]}" ip link add "$bridge" address 02:00:0a:52:00:01 type bridge
ip netns exec "${hosts[0]}" ip addr add "${addresses[0]}/24" dev "$bridge"
ip netns exec "${hosts[0]}" ip link set "$bridge" up

# Host i: a namespace joined to host 0's bridge by a veth pair. Deleting the namespace removes
# the pair, as a machine that is gone leaves its switch port dark.
add_host() {
  local i=$1 ns="${hosts[$1]}"
  ip netns add "$ns"
  ip netns exec "$ns" ip link set lo up
  ip link add "${tag}p$i" netns "${hosts[0]}" type veth peer name "${tag}e$i" netns "$ns"
  ip netns exec "${hosts[0]}" ip link set "${tag}p$i" master "$bridge" up
  ip netns exec "$ns" ip addr add "${addresses[$i]}/24" dev "${tag}e$i"
  ip netns exec "$ns" ip link set "${tag}e$i" up
  for _ in $(seq 100); do  # UCX needs the links' operational state up
    [[ $(ip netns exec "$ns" cat "/sys/class/net/${tag}e$i/operstate") == up &&
       $(ip netns exec "${hosts[0]}" cat "/sys/class/net/${tag}p$i/operstate") == up ]] && break
    sleep 0.1
  done
}
remove_host() {
  local ns="${hosts[$1]}"
  ip netns pids "$ns" | xargs -r kill -9
  ip netns del "$ns"
}

cat >"$work/cluster.json" <<EOF
{"bind": "${addresses[0]}", "hosts": [
  {"address": "${addresses[0]}", "cpu_workers": 1, "servers": 1, "launch_prefix": ["env"]},
  {"address": "${addresses[1]}", "cpu_workers": 1, "servers": 1, "launch_prefix": ["ip", "netns", "exec", "${hosts[1]}"]},
  {"address": "${addresses[2]}", "cpu_workers": 1, "servers": 1, "launch_prefix": ["ip", "netns", "exec", "${hosts[2]}"]}]}
EOF
cd "$work"
# Long enough that the job is still running when a host goes or comes (its steps take a few ms).
train=("$weft" train lm --cluster cluster.json --vocab 500 --classes 10 --embed 16 --hidden 32 --sampled 64
       --train-sentences 400 --heldout-sentences 20 --batch 12 --steps 3000 --dtype f64 --threads 1
       --checkpoint-every 10 --eval-every 3000 --log-every 100 --timeout 60)
at_host0() { ip netns exec "${hosts[0]}" "$@"; }
# Waits until `file` exists (at most 300 s, a bound for a job that hangs, not a pace).
wait_for() { for _ in $(seq 3000); do [[ -e "$1" ]] && return 0; sleep 0.1; done; fail "$2"; }

# Whether RUN/metrics.jsonl records restart 1 on WORKERS workers, its cause matching CAUSE.
restart_record() {
  python3 - "$1/metrics.jsonl" "$2" "$3" <<'EOF'
import json, re, sys
records = [json.loads(line) for line in open(sys.argv[1])]
ok = any(r.get("restart") == 1 and r.get("workers") == int(sys.argv[2]) and re.search(sys.argv[3], r.get("cause", ""))
         for r in records)
sys.exit(0 if ok else 1)
EOF
}

add_host 1
add_host 2

# The uninterrupted run on all three hosts.
at_host0 "${train[@]}" --out "$work/whole" >"$work/whole.log" 2>&1 || fail "the uninterrupted run failed"

# Runs an elastic job into RUN (RUN.log beside it), does CHANGE once its first checkpoint is
# written, and checks that it ends with the uninterrupted run's variables.
elastic_run() {
  local run=$1 change=$2
  shift 2
  at_host0 "${train[@]}" --min-workers 2 --probe-every 1 "$@" --out "$work/$run" >"$work/$run.log" 2>&1 &
  local launcher=$!
  wait_for "$work/$run/checkpoint.safetensors" "the elastic run $run wrote no checkpoint"
  $change
  wait "$launcher" || fail "the elastic run $run did not end well after: $change"
  python3 "$source_dir/tests/same_variables.py" whole/checkpoint.safetensors "$run/checkpoint.safetensors" ||
    fail "the elastic run $run does not end as the uninterrupted run"
}

# 1. Host 2 is lost for good after the first checkpoint.
elastic_run shrunk "remove_host 2" --max-restarts 1
grep -q "elastic job (at least 2 workers) starting with 3 workers on 3 hosts" shrunk.log || fail "no start on 3 hosts"
grep -q "restarting the job (1 of 1 restarts) with 2 workers on 2 hosts; left out host 2 (${addresses[2]}): " \
  shrunk.log || fail "the restart did not leave host 2 out, naming it"
grep -q "Cannot open network namespace" shrunk.log || fail "the restart did not say why host 2 is left out"
# Host 2's worker and server are killed together: either may be the one the launcher sees first.
restart_record shrunk 2 "(worker 0|server) of host 2 \\(pid [0-9]+\\) was killed by signal 9.*left out host 2" ||
  fail "metrics.jsonl has no record of the restart on 2 workers, naming its cause"

# 2. Host 2 is missing at the start and comes after the first checkpoint.
elastic_run grown "add_host 2"
grep -q "starting with 2 workers on 2 hosts; left out host 2 (${addresses[2]})" grown.log || fail "no start on 2 hosts"
grep -q "host 2 (${addresses[2]}) answers: the job can grow to 3 workers on 3 hosts: asking the job to stop at a" \
  grown.log || fail "the launcher did not ask for a checkpoint when host 2 came"
grep -q "stopped for the launcher after step" grown.log || fail "the job did not stop at a checkpoint"
grep -q "starting it again with 3 workers on 3 hosts" grown.log || fail "the job did not start again on 3 hosts"
restart_record grown 3 "host 2 \\(10.82.0.3\\) answers: the job can grow to 3 workers on 3 hosts; starting again" ||
  fail "metrics.jsonl has no record of the restart on 3 workers, naming its cause"
echo "elastic: a job that lost host 2 and one that gained it end as the uninterrupted run"
