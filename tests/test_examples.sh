#!/usr/bin/env bash
# The projects under examples/ built against an installed weft, as a user builds them: weft is
# installed (cmake --install) into a temporary prefix; each example is configured with
# find_package(weft), built and run; the op example is built once more with pkg-config's flags;
# README's authoring example must be the mlp example's code; and the data-parallel example,
# launched with `weft launch --workers 2 --servers 1` (with --partitions auto, and restarted after
# a worker is killed) and by mpirun, must train what it trains alone.
#
#   tests/test_examples.sh BUILD_DIR SOURCE_DIR [CXX_FLAGS]   (CXX_FLAGS: the sanitizer build's)
set -euo pipefail

build="$1"
source="$2"
flags="${3:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() {
  echo "test_examples: $*" >&2
  exit 1
}
. "$(dirname "${BASH_SOURCE[0]}")/kill_member.sh"
# quietly CMD...: runs CMD, showing its output only when it fails.
quietly() {
  "$@" >"$work/log" 2>&1 || { cat "$work/log" >&2; fail "failed: $*"; }
}

prefix="$work/prefix"
quietly cmake --install "$build" --prefix "$prefix"
launcher=()
! command -v ccache >/dev/null || launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
for example in mlp custom_op data_parallel; do
  quietly cmake -S "$source/examples/$example" -B "$work/$example" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" "${launcher[@]}"
  quietly cmake --build "$work/$example"
done

"$work/mlp/mlp" || fail "the mlp example did not learn"
"$work/custom_op/custom_op" || fail "the custom op example's checks failed"

# README's "Writing a model" block, line by line (indentation aside), in order, in the example.
awk '/^## Writing a model/ {section = 1} section && /^```cpp/ {block = 1; next} block && /^```/ {exit}
     block && NF {sub(/^ +/, ""); print}' "$source/README.md" >"$work/readme-lines"
[ -s "$work/readme-lines" ] || fail "README.md has no C++ block under \"## Writing a model\""
sed 's/^ *//' "$source/examples/mlp/main.cpp" >"$work/example-lines"
awk 'NR == FNR {want[++n] = $0; next} $0 == want[i + 1] {i++} END {if (i < n) {print want[i + 1]; exit 1}}' \
  "$work/readme-lines" "$work/example-lines" >"$work/missing" ||
  fail "README's authoring example differs from examples/mlp/main.cpp at: $(cat "$work/missing")"

pc_dir="$(dirname "$(find "$prefix" -name weft.pc)")"
read -r -a pc_flags <<<"$(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs weft)"
read -r -a extra <<<"$flags"
quietly "${CXX:-c++}" "${extra[@]}" "$source/examples/custom_op/main.cpp" -o "$work/custom_op_pc" "${pc_flags[@]}"
"$work/custom_op_pc" >/dev/null || fail "the custom op example built with pkg-config failed"

"$work/data_parallel/data_parallel" >"$work/alone" || fail "the data-parallel example failed alone"
"$prefix/bin/weft" launch --workers 2 --servers 1 -- "$work/data_parallel/data_parallel" >"$work/launched" ||
  fail "the data-parallel example failed under weft launch"
grep -q "^workers 2$" "$work/launched" || fail "the launched example did not run as 2 workers: $(cat "$work/launched")"
# agree FILE...: each file's results agree with the lone run's ($work/alone) to rounding.
agree() {
  local file
  for file in "$@"; do
    awk 'NR == FNR {alone[$1] = $2; next} $1 != "workers" {
           d = $2 - alone[$1]; if (d < 0) d = -d; a = alone[$1] < 0 ? -alone[$1] : alone[$1]
           if (!($1 in alone) || d > 1e-9 * (1 + a)) {print $1 ": alone " alone[$1] ", launched " $2; bad = 1}}
         END {exit bad}' "$work/alone" "$file" >"$work/differs" ||
      fail "$file: the job trained something else: $(cat "$work/differs")"
  done
}
# The loss and the variables' sums agree to rounding: the job sums in another order.
agree "$work/launched"
# With its payloads encrypted, the same job trains bit for bit as before.
"$prefix/bin/weft" launch --workers 2 --servers 1 --encrypt -- "$work/data_parallel/data_parallel" \
  >"$work/encrypted" || fail "the data-parallel example failed under weft launch --encrypt"
cmp -s "$work/launched" "$work/encrypted" ||
  fail "the encrypted job trained otherwise: $(diff "$work/launched" "$work/encrypted")"
# dist::TrainingLoop under weft launch: --partitions auto runs samples that go on from one
# another's checkpoints, and the job ends as the lone run.
"$prefix/bin/weft" launch --workers 2 --servers 2 --partitions auto --partition-search-steps 8 -- \
  "$work/data_parallel/data_parallel" "$work/searched" >"$work/searched.out" ||
  fail "the data-parallel example failed under weft launch --partitions auto"
grep -q "^partition search: 1 partition: " "$work/searched.out" ||
  fail "weft launch --partitions auto sampled no partition count: $(cat "$work/searched.out")"
grep -v "^partition search" "$work/searched.out" >"$work/searched.results"
agree "$work/searched.results"
# A worker killed mid-run under --max-restarts 1: the restarted job goes on from the last
# checkpoint, and ends bit for bit as the uninterrupted job.
"$prefix/bin/weft" launch --workers 2 --servers 1 -- "$work/data_parallel/data_parallel" "" 3000 \
  >"$work/uninterrupted" || fail "the data-parallel example failed under weft launch with 3000 steps"
"$prefix/bin/weft" launch --workers 2 --servers 1 --max-restarts 1 -- "$work/data_parallel/data_parallel" \
  "$work/restarted" 3000 >"$work/restarted.out" 2>"$work/restarted.err" &
launcher=$!
# WEFT_SLOT=1 is worker 1 (the one server is slot 0 among the servers).
kill_member_once "$work/restarted" WEFT_SLOT=1 test -f "$work/restarted/checkpoint.safetensors"
wait "$launcher" || fail "the restarted job failed: $(cat "$work/restarted.err")"
grep -q "restarting the job (1 of 1 restarts)" "$work/restarted.err" ||
  fail "the job was not restarted (it ended before the kill?): $(cat "$work/restarted.err")"
cmp -s "$work/uninterrupted" "$work/restarted.out" ||
  fail "the restarted job trained otherwise than the uninterrupted one: $(diff "$work/uninterrupted" "$work/restarted.out")"
# The same program as every rank of an mpirun job (rank 0 a parameter server), where Open MPI is.
if command -v mpirun >/dev/null; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 3 --oversubscribe -x WEFT_SERVERS_PER_HOST=1 \
    "$work/data_parallel/data_parallel" >"$work/mpirun" || fail "the data-parallel example failed under mpirun"
  cmp -s "$work/launched" "$work/mpirun" ||
    fail "the mpirun job trained otherwise than the launched one: $(diff "$work/launched" "$work/mpirun")"
  # SIGTERM to every rank (an engine preempting the job), its parameter server included: the
  # TrainingLoop stops at a step, worker 0 checkpoints, every rank exits 143; started again, the
  # job goes on from the checkpoint and ends bit for bit as the uninterrupted one.
  preempted() {
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 3 --oversubscribe \
      -x WEFT_SERVERS_PER_HOST=1 \
      bash -c '"$0" "$@"; s=$?; echo "rank $OMPI_COMM_WORLD_RANK exited $s" >> '"$work/preempted.status"'; exit $s' \
      "$work/data_parallel/data_parallel" "$work/preempted" 3000
  }
  preempted >"$work/preempted.out" 2>&1 &
  launcher=$!
  for _ in $(seq 3000); do [[ -f $work/preempted/checkpoint.safetensors ]] && break; sleep 0.1; done
  pids=()
  for pid in $(pgrep -f "$work/preempted" || true); do
    [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$work/data_parallel/data_parallel" ]] && pids+=("$pid")
  done
  [[ ${#pids[@]} -eq 3 ]] || fail "the mpirun job to preempt did not run 3 ranks with a checkpoint: $(cat "$work/preempted.out")"
  kill -TERM "${pids[@]}"
  wait "$launcher" || true  # mpirun reports the ranks' statuses
  grep -q "stopped on SIGTERM after step" "$work/preempted.out" ||
    fail "the preempted job wrote no checkpoint: $(cat "$work/preempted.out")"
  # Every rank exits 143 after the checkpoint is written (the workers leave the job together);
  # mpirun stops the job at the first rank's exit, so the others may be stopped, their work
  # done, before they say so themselves: at least one rank says it, and none says otherwise.
  grep -q "^rank [0-2] exited 143$" "$work/preempted.status" &&
    ! grep -v "^rank [0-2] exited 143$" "$work/preempted.status" | grep -q . ||
    fail "the preempted ranks did not exit 143: $(cat "$work/preempted.status")"
  preempted >"$work/requeued.out" 2>&1 || fail "the requeued mpirun job failed: $(cat "$work/requeued.out")"
  grep -v "^rank [0-9] exited" "$work/requeued.out" >"$work/requeued" || true
  cmp -s "$work/uninterrupted" "$work/requeued" ||
    fail "the requeued job trained otherwise than the uninterrupted one: $(diff "$work/uninterrupted" "$work/requeued")"
fi
echo "examples: built against the installed package (CMake and pkg-config) and run; weft launch (also with --encrypt and --partitions auto, and restarted after a kill) and mpirun (preempted and started again), where it is, trained the data-parallel one as one process"
