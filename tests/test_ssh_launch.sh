#!/usr/bin/env bash
# `weft train --cluster` with a remote host reached over ssh: the two hosts of the job are
# network namespaces joined by a veth pair; the launcher and host 0 run in the first, host 1 in
# the second with its own sshd (keys made here), reached only over ssh. The job trains on both
# hosts; then a remote worker is killed mid-run and the launcher must stop the job naming it,
# with nothing left running on either host. Nothing is added to this machine's own network, where
# other tests' UCX processes would see (and try) the test's addresses. Needs root (ip netns) and
# sshd; without them it reports why and exits 77 (ctest: skipped).
#
#   tests/test_ssh_launch.sh WEFT_BINARY
set -euo pipefail

weft="$(realpath "$1")"
skip() { echo "skipped: $1"; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root for ip netns"
[[ -x /usr/sbin/sshd ]] || skip "needs sshd (Debian package openssh-server)"
command -v ssh >/dev/null || skip "needs ssh (Debian package openssh-client)"

tag="wss$$"
here="${tag}h0" ns="${tag}h1"
local_ip=10.79.0.1 remote_ip=10.79.0.2
work="$(mktemp -d)"
cleanup() {
  [[ -f "$work/sshd.pid" ]] && kill "$(cat "$work/sshd.pid")" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  ip netns del "$here" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "FAILED: $1"; [[ -f "$work/log" ]] && cat "$work/log"; exit 1; }

ip netns add "$here" 2>/dev/null || skip "cannot create network namespaces here (ip netns add failed)"
ip netns add "$ns"
ip link add "${tag}a" netns "$here" type veth peer name "${tag}b" netns "$ns"
ip netns exec "$here" ip addr add "$local_ip/24" dev "${tag}a"
ip netns exec "$ns" ip addr add "$remote_ip/24" dev "${tag}b"
for n in "$here" "$ns"; do
  ip netns exec "$n" ip link set lo up
done
ip netns exec "$here" ip link set "${tag}a" up
ip netns exec "$ns" ip link set "${tag}b" up
# The kernel reports a link running (IFF_RUNNING, which UCX requires of a device) only once its
# operational state has caught up, up to a second after traffic already flows.
for _ in $(seq 100); do
  [[ $(ip netns exec "$here" cat "/sys/class/net/${tag}a/operstate") == up &&
     $(ip netns exec "$ns" cat "/sys/class/net/${tag}b/operstate") == up ]] && break
  sleep 0.1
done
at_host0() { ip netns exec "$here" "$@"; }

ssh-keygen -q -t ed25519 -N "" -f "$work/client_key"
ssh-keygen -q -t ed25519 -N "" -f "$work/host_key"
cp "$work/client_key.pub" "$work/authorized_keys"
mkdir -p /run/sshd
ip netns exec "$ns" /usr/sbin/sshd -f /dev/null -h "$work/host_key" -o "ListenAddress=$remote_ip" \
  -o "AuthorizedKeysFile=$work/authorized_keys" -o PermitRootLogin=prohibit-password -o StrictModes=no \
  -o "PidFile=$work/sshd.pid" -E "$work/sshd.log"

# The launcher runs `ssh HOST ...`; a wrapper first in PATH points it at this test's keys.
mkdir -p "$work/bin"
cat >"$work/ssh_config" <<EOF
Host $remote_ip
  IdentityFile $work/client_key
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
EOF
printf '#!/bin/sh\nexec %s -F %s "$@"\n' "$(command -v ssh)" "$work/ssh_config" >"$work/bin/ssh"
chmod +x "$work/bin/ssh"
export PATH="$work/bin:$PATH"
for _ in $(seq 50); do at_host0 ssh -o BatchMode=yes -o ConnectTimeout=1 "$remote_ip" true 2>/dev/null && break; sleep 0.2; done
at_host0 ssh -o BatchMode=yes "$remote_ip" true || fail "sshd in the namespace does not answer"

# Host 0 runs its processes here (a launch prefix marks a host local); host 1 only over ssh.
cat >"$work/cluster.json" <<EOF
{"bind": "$local_ip", "hosts": [
  {"address": "$local_ip", "cpu_workers": 1, "servers": 1, "launch_prefix": ["env"]},
  {"address": "$remote_ip", "cpu_workers": 1, "servers": 1}]}
EOF
cd "$work"

# 1. A job across both hosts trains and ends cleanly.
at_host0 "$weft" train mlp --cluster cluster.json --steps 60 --eval-every 60 --threads 1 --out "$work/run" >"$work/log" 2>&1 \
  || fail "the two-host job failed"
grep -q '"workers":2' "$work/log" || fail "the job did not report 2 workers"
accepted=$(grep -c "Accepted publickey" "$work/sshd.log" || true)
[[ "$accepted" -ge 2 ]] || fail "host 1's worker and server did not both come through ssh ($accepted sessions)"

# 2. Killing host 1's worker stops the job, naming it, and leaves nothing running.
at_host0 "$weft" train mlp --cluster cluster.json --steps 1000000 --eval-every 1000000 --threads 1 --timeout 20 \
  --out "$work/long" >"$work/log" 2>&1 &
launcher=$!
victim=""
for _ in $(seq 300); do
  sleep 0.1
  grep -q "^step" "$work/log" || continue
  for p in $(pgrep -f "train mlp --cluster cluster.json --steps 1000000" || true); do
    env_of="$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null || true)"
    if grep -qx "WEFT_HOST=1" <<<"$env_of" && grep -qx "WEFT_ROLE=worker" <<<"$env_of"; then victim=$p; fi
  done
  [[ -n "$victim" ]] && break
done
[[ -n "$victim" ]] || fail "host 1's worker never started training"
kill -KILL "$victim"
status=0
timeout 60 tail --pid="$launcher" -f /dev/null || fail "the launcher did not stop within 60 s"
wait "$launcher" || status=$?
[[ "$status" -ne 0 ]] || fail "the launcher exited 0 after a worker was killed"
grep -q "weft launch: worker 0 of host 1 (pid [0-9]*) " "$work/log" || fail "the launcher did not name worker 0 of host 1"
sleep 1
left="$(pgrep -f "train mlp --cluster cluster.json --steps 1000000" || true)"
[[ -z "$left" ]] || fail "processes left behind: $left"
echo "ssh launch: 2-host job trained; a killed remote worker stopped the job, named"
