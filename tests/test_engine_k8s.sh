#!/usr/bin/env bash
# Kubernetes' environment contract, without a cluster: two network namespaces stand in for two
# pods. Each runs weft with exactly the environment examples/k8s/jobset.yaml (then trainjob.yaml)
# gives its pod: the manifest's env entries, the variables the JobSet (or Kubeflow's trainer)
# controller adds, its host name, and the job secret mounted as a Secret volume is (a symlink into
# a timestamped directory, mode 0400) at the manifest's path, in a mount namespace of its own. The
# pods' stable host names resolve to the namespaces' addresses (/etc/netns/NAME/hosts, which
# `ip netns exec` mounts over /etc/hosts). The job of the two pods must end as
# `weft train --workers 2` does. The manifests' commands run with a small model and a few steps.
# Needs root (ip netns, mounts); without it, reports why and exits 77 (ctest: skipped).
#
#   tests/test_engine_k8s.sh WEFT_BINARY
set -euo pipefail

weft="$(realpath "$1")"
source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
skip() { echo "skipped: $1"; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root for ip netns and mounts"
command -v unshare >/dev/null || skip "needs unshare (Debian package util-linux)"

tag="wk$$"
pods=("${tag}p0" "${tag}p1")
addresses=(10.81.0.1 10.81.0.2)
work="$(mktemp -d)"
cleanup() {
  pkill -9 -f "$work/" 2>/dev/null || true
  for ns in "${pods[@]}"; do
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "FAILED: $1"; for f in "$work"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v '^step' | tail -20; done; exit 1; }

for ns in "${pods[@]}"; do
  ip netns add "$ns" 2>/dev/null || skip "cannot create network namespaces here (ip netns add failed)"
done
ip link add "${tag}a" netns "${pods[0]}" type veth peer name "${tag}b" netns "${pods[1]}"
ip netns exec "${pods[0]}" ip addr add "${addresses[0]}/24" dev "${tag}a"
ip netns exec "${pods[1]}" ip addr add "${addresses[1]}/24" dev "${tag}b"
for i in 0 1; do
  ip netns exec "${pods[$i]}" ip link set lo up
  ip netns exec "${pods[$i]}" ip link set "$( ((i == 0)) && echo "${tag}a" || echo "${tag}b")" up
done
for _ in $(seq 100); do  # UCX needs the links' operational state up
  [[ $(ip netns exec "${pods[0]}" cat "/sys/class/net/${tag}a/operstate") == up &&
     $(ip netns exec "${pods[1]}" cat "/sys/class/net/${tag}b/operstate") == up ]] && break
  sleep 0.1
done

# The job secret as kubelet mounts a Secret: the file is a symlink into a timestamped directory.
secret_volume="$work/secret-volume"
mkdir -p "$secret_volume/..2026_11_28_00_00_00.000000001"
"$weft" secret "$secret_volume/..2026_11_28_00_00_00.000000001/secret"
chmod 0400 "$secret_volume/..2026_11_28_00_00_00.000000001/secret"
ln -s "..2026_11_28_00_00_00.000000001" "$secret_volume/..data"
ln -s "..data/secret" "$secret_volume/secret"

# A manifest's env entries (`- {"name": ..., "value": ...}`) and its container command.
manifest_env() { python3 -c '
import json, re, sys
for line in open(sys.argv[1]):
    m = re.match(r"\s*- (\{\"name\".*\})\s*$", line)
    if m:
        e = json.loads(m.group(1))
        print(e["name"] + "=" + e["value"])' "$1"; }
manifest_command() { python3 -c '
import json, re, sys
for line in open(sys.argv[1]):
    m = re.match(r"\s*command: (\[.*\])\s*$", line)
    if m:
        print("\n".join(json.loads(m.group(1))))' "$1"; }

small=(--vocab 500 --classes 10 --embed 16 --hidden 32 --sampled 64 --train-sentences 400 --heldout-sentences 20
       --batch 16 --steps 30 --threads 1)

# Runs pod `index` of `manifest` in its namespace: `pod_env` lines (NAME=value) are what the
# controllers add; the manifest's own come after them. The command's `weft` is this build's, its
# --out this test's; the secret volume is mounted where the manifest mounts it.
run_pod() {
  local manifest=$1 index=$2 hostname=$3 mount_path=$4
  shift 4
  local -a environment=("$@")
  mapfile -t -O "${#environment[@]}" environment < <(manifest_env "$manifest")
  mapfile -t command < <(manifest_command "$manifest")
  command[0]="$weft"
  for i in "${!command[@]}"; do
    [[ ${command[$i]} == --out ]] && command[$((i + 1))]="$work/out-$(basename "$manifest" .yaml)-$index"
  done
  ip netns exec "${pods[$index]}" unshare -m --propagation private sh -c '
    mount -t tmpfs tmpfs /run && mkdir -p "$1" && mount --bind "$2" "$1" && shift 2 && exec "$@"' \
    sh "$mount_path" "$secret_volume" env -i PATH=/usr/bin:/bin HOSTNAME="$hostname" "${environment[@]}" \
    "${command[@]}" "${small[@]}" > "$work/$(basename "$manifest" .yaml)-$index.log" 2>&1
}

"$weft" train lm "${small[@]}" --arch ar --workers 2 --servers 0 --out "$work/own" > "$work/own.log" 2>&1 ||
  fail "weft train lm --arch ar --workers 2 failed"

# Runs both pods of examples/k8s/MANIFEST.yaml (KIND, pods named HOST-PREFIX-N) at once, each with
# the Job's completion index and `added` (a printf format of the pod's index: what the manifest's
# controller adds), and checks that the job ended as weft's own. A Secret volume's mount point
# under /var/run lives in the pod's own /run.
run_job() {
  local manifest=$1 kind=$2 host_prefix=$3 added=$4 pids=() i
  local secret_dir
  secret_dir="$(dirname "$(manifest_env "$source_dir/examples/k8s/$manifest.yaml" | sed -n 's/^WEFT_SECRET_FILE=//p')")"
  [[ $secret_dir == /var/run/* ]] || fail "$manifest.yaml mounts its secret outside /var/run ($secret_dir)"
  for i in 0 1; do
    # shellcheck disable=SC2046,SC2059
    run_pod "$source_dir/examples/k8s/$manifest.yaml" "$i" "$host_prefix-$i" "/run/${secret_dir#/var/run/}" \
      "JOB_COMPLETION_INDEX=$i" $(printf "$added" "$i") &
    pids+=($!)
  done
  for i in 0 1; do wait "${pids[$i]}" || fail "the $kind's pod $i failed"; done
  cmp -s "$work/out-$manifest-0/checkpoint.safetensors" "$work/own/checkpoint.safetensors" ||
    fail "the $kind's job ended otherwise than weft train --workers 2"
  echo "ok: the $kind's pods form the job and end as weft's own"
}

# The JobSet: its controller gives each pod the Job's completion index and a stable host name.
mkdir -p "/etc/netns/${pods[0]}" "/etc/netns/${pods[1]}"
for ns in "${pods[@]}"; do
  printf '127.0.0.1 localhost\n%s weft-lm-workers-0-0.weft-lm weft-lm-node-0-0.weft-lm\n%s weft-lm-workers-0-1.weft-lm weft-lm-node-0-1.weft-lm\n' \
    "${addresses[0]}" "${addresses[1]}" > "/etc/netns/$ns/hosts"
done
run_job jobset JobSet weft-lm-workers-0 ""

# The TrainJob: Kubeflow's trainer controller adds the PET_ variables (torchrun's, from numNodes,
# numProcPerNode and node 0's host name) and the indexed Job its completion index.
run_job trainjob TrainJob weft-lm-node-0 \
  "PET_NNODES=2 PET_NPROC_PER_NODE=1 PET_NODE_RANK=%d PET_MASTER_ADDR=weft-lm-node-0-0.weft-lm PET_MASTER_PORT=29400"

# Without the Secret the pods refuse to start, naming what is missing.
status=0
ip netns exec "${pods[1]}" env -i PATH=/usr/bin:/bin JOB_COMPLETION_INDEX=1 WORLD_SIZE=2 \
  MASTER_ADDR=weft-lm-workers-0-0.weft-lm MASTER_PORT=29500 "$weft" train lm "${small[@]}" --out "$work/none" \
  > "$work/no-secret.log" 2>&1 || status=$?
[[ $status -eq 1 ]] || fail "a pod without the job secret did not refuse to start (status $status)"
grep -q "the indexed-job job spans 2 hosts: its members prove to each other that they hold the job's secret" \
  "$work/no-secret.log" || fail "a pod without the job secret did not say why it refused"
echo "ok: a pod without the job secret refuses to start, saying why"
